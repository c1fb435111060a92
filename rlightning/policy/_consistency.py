"""The one check that an evaluator holds exactly the weights the trainer sent, used by `PolicyGroup`.

Two measures, both from `rlightning.weights`: exact per-tensor sha256 digests (bit for bit) and per-tensor
float32 L2 fingerprints compared within `DEFAULT_RTOL`. The trainer remembers the digests and fingerprints of
its newest sent versions (`VersionLedger`); an evaluator's report names the version it applied and carries
its own, so a report on any remembered version can be checked, not only one on the newest.
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

from rlightning import weights

KEEP_VERSIONS = 16
"""Sent versions whose digests the trainer remembers."""
DEFAULT_RTOL = 1e-5
"""Relative tolerance of the L2 fingerprint comparison, everywhere in rlightning.

The fingerprint is the float32 L2 norm of each tensor: identical bytes give identical norms on one device, but
CPU and CUDA reduce in different orders, which moves a float32 norm by up to ~1e-6 relative for large tensors
(float32 epsilon is 1.2e-7, times a few reduction levels). 1e-5 keeps that margin; the digests stay exact.
"""


def weight_mismatches(
    expected_digests: Mapping[str, str],
    expected_fingerprint: Mapping[str, float],
    digests: Mapping[str, str] | None,
    fingerprint: Mapping[str, float],
    rtol: float = DEFAULT_RTOL,
) -> list[str]:
    """Tensor names whose digest or fingerprint differs from the reference (or exist on one side only).

    Args:
        expected_digests (Mapping[str, str]): The reference `tensor_digests`.
        expected_fingerprint (Mapping[str, float]): The reference `l2_fingerprint`.
        digests (Mapping[str, str] | None): The copy's digests; None or empty skips the exact check.
        fingerprint (Mapping[str, float]): The copy's fingerprint.
        rtol (float, optional): Relative tolerance of the fingerprints. Defaults to `DEFAULT_RTOL`.

    Returns:
        list[str]: Sorted names; empty when the copy matches.
    """
    bad = set(weights.mismatched_fingerprints(expected_fingerprint, fingerprint, rtol=rtol))
    if digests:
        bad |= set(weights.mismatched_digests(expected_digests, digests))
    return sorted(bad)


@dataclasses.dataclass(frozen=True)
class Consistency:
    """Result of checking the evaluators' reports.

    Attributes:
        consistent (bool | None): True when every checked report matched (`weight_mismatches` empty); False
            when one did not; None when no report could be checked.
        checked (list[int]): Ordinals whose report was on a remembered version and was checked.
        mismatched (dict[int, list[str]]): Ordinal -> tensor names that differ.
        on_latest (list[int]): Checked ordinals whose applied version is the newest sent one.
    """

    consistent: bool | None
    checked: list[int]
    mismatched: dict[int, list[str]]
    on_latest: list[int]


class VersionLedger:
    """Digests and fingerprints of the newest sent versions.

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

    def check(self, reports: Mapping[int, weights.ReceiverReport], rtol: float = DEFAULT_RTOL) -> Consistency:
        """Compare each report on a remembered version with what was sent as that version.

        Args:
            reports (Mapping[int, ReceiverReport]): Ordinal -> newest report (`WeightSender.reports()`).
            rtol (float, optional): Relative tolerance of the fingerprints. Defaults to `DEFAULT_RTOL`.

        Returns:
            Consistency: The verdict.
        """
        checked, on_latest, mismatched = [], [], {}
        for ordinal, report in sorted(reports.items()):
            entry = self._entries.get(report.applied_version)
            if entry is None:
                continue
            digest, fingerprint = entry
            bad = weight_mismatches(digest, fingerprint, report.digest, report.fingerprint, rtol)
            checked.append(ordinal)
            if report.applied_version == self.latest:
                on_latest.append(ordinal)
            if bad:
                mismatched[ordinal] = bad
        verdict = None if not checked else not mismatched
        return Consistency(verdict, checked, mismatched, on_latest)
