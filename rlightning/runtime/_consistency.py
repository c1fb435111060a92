"""Trainer-side check that evaluators hold exactly the weights the trainer published.

The trainer remembers the digests and fingerprints of its newest published versions (`VersionLedger`);
an evaluator's report names the version it applied and carries its own digests and fingerprints, so a report
on any remembered version can be checked, not only one on the newest.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from rlightning import weights

KEEP_VERSIONS = 16
"""Published versions whose digests the trainer remembers."""


@dataclasses.dataclass(frozen=True)
class Consistency:
    """Result of checking the evaluators' reports.

    Attributes:
        consistent (bool | None): True when every checked report matched (exact digest and L2 fingerprint
            within `rtol`); False when one did not; None when no report could be checked.
        checked (list[int]): Ordinals whose report was on a remembered version and was checked.
        mismatched (dict[int, list[str]]): Ordinal -> tensor names that differ.
        on_latest (list[int]): Checked ordinals whose applied version is the newest published one.
    """

    consistent: bool | None
    checked: list[int]
    mismatched: dict[int, list[str]]
    on_latest: list[int]


class VersionLedger:
    """Digests and fingerprints of the newest published versions.

    Args:
        keep (int, optional): Versions remembered. Defaults to KEEP_VERSIONS.
    """

    def __init__(self, keep: int = KEEP_VERSIONS) -> None:
        self._entries: collections.OrderedDict[int, tuple[dict[str, str], dict[str, float]]] = (
            collections.OrderedDict()
        )
        self.keep = keep

    @property
    def latest(self) -> int | None:
        """The newest recorded version, or None."""
        return next(reversed(self._entries)) if self._entries else None

    def record(self, version: int, digest: Mapping[str, str], fingerprint: Mapping[str, float]) -> None:
        """Remember what version `version` is (its `tensor_digests` and `l2_fingerprint`)."""
        self._entries[version] = (dict(digest), dict(fingerprint))
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)

    def check(self, reports: Mapping[int, weights.ReceiverReport], rtol: float = 1e-5) -> Consistency:
        """Compare each report on a remembered version with what was published as that version.

        Args:
            reports (Mapping[int, ReceiverReport]): Ordinal -> newest report (`WeightSender.reports()`).
            rtol (float, optional): Relative tolerance of the fingerprint comparison. Defaults to 1e-5.

        Returns:
            Consistency: The verdict.
        """
        checked, on_latest, mismatched = [], [], {}
        for ordinal, report in sorted(reports.items()):
            entry = self._entries.get(report.applied_version)
            if entry is None:
                continue
            digest, fingerprint = entry
            bad = sorted(
                set(weights.mismatched_digests(digest, report.digest))
                | set(weights.mismatched_fingerprints(fingerprint, report.fingerprint, rtol=rtol))
            )
            checked.append(ordinal)
            if report.applied_version == self.latest:
                on_latest.append(ordinal)
            if bad:
                mismatched[ordinal] = bad
        verdict = None if not checked else not mismatched
        return Consistency(verdict, checked, mismatched, on_latest)
