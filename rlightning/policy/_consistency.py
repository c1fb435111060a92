"""The one check that an evaluator holds exactly the weights the trainer sent, used by `PolicyGroup`.

Two measures, both from `rlightning.weights` and held in one `WeightRecord`: per-tensor float32 L2
fingerprints compared within `DEFAULT_RTOL`, and exact per-tensor sha256 digests (bit for bit). The trainer
remembers its newest sent versions (`VersionLedger`); an evaluator's report names the version it applied and
carries its own record, so a report on any remembered version can be checked, not only one on the newest.

A publish costs the ledger one fingerprint pass and no copy: it keeps the trainer's live tensors and computes a
version's digests only when an exact check first asks for them, and only while those tensors are unchanged
since that version was sent (their in-place version counters tell, see `VersionLedger.record`).
"""

from __future__ import annotations

import collections
import dataclasses
from collections.abc import Mapping

import torch

from rlightning import weights

KEEP_VERSIONS = 16
"""Sent versions the trainer remembers."""
DEFAULT_RTOL = 1e-5
"""Relative tolerance of the L2 fingerprint comparison, everywhere in rlightning.

The fingerprint is the float32 L2 norm of each tensor: identical bytes give identical norms on one device, but
CPU and CUDA reduce in different orders, which moves a float32 norm by up to ~1e-6 relative for large tensors
(float32 epsilon is 1.2e-7, times a few reduction levels). 1e-5 keeps that margin; the digests stay exact.
"""


@dataclasses.dataclass(frozen=True)
class Consistency:
    """Result of checking the evaluators' reports.

    Attributes:
        consistent (bool | None): True when every checked report matched (`WeightRecord.mismatches` empty);
            False when one did not; None when no report could be checked.
        checked (list[int]): Ordinals whose report was on a remembered version and was checked.
        mismatched (dict[int, list[str]]): Ordinal -> tensor names that differ.
        on_latest (list[int]): Checked ordinals whose applied version is the newest sent one.
    """

    consistent: bool | None
    checked: list[int]
    mismatched: dict[int, list[str]]
    on_latest: list[int]


def _stamp(state: Mapping[str, torch.Tensor]) -> tuple[int, ...]:
    """The tensors' in-place version counters: any in-place change (an optimizer step, `copy_`) moves one."""
    return tuple(t._version for t in state.values())


@dataclasses.dataclass
class _Sent:
    """One sent version: its record so far, and the live tensors while their digests may still be taken."""

    record: weights.WeightRecord
    state: Mapping[str, torch.Tensor] | None
    stamp: tuple[int, ...]
    cast: str | None = None


class VersionLedger:
    """Fingerprints (and, on demand, digests) of the newest sent versions.

    Args:
        keep (int, optional): Versions remembered. Defaults to KEEP_VERSIONS.
    """

    def __init__(self, keep: int = KEEP_VERSIONS) -> None:
        self._entries: collections.OrderedDict[int, _Sent] = collections.OrderedDict()
        self.keep = keep

    @property
    def latest(self) -> int | None:
        """The newest recorded version, or None."""
        return next(reversed(self._entries)) if self._entries else None

    def record(self, version: int, state: Mapping[str, torch.Tensor], cast: str | None = None) -> None:
        """Remember that `state` was sent as `version`: its fingerprint now, its digests when first asked.

        Args:
            version (int): The version sent.
            state (Mapping[str, torch.Tensor]): The trainer's `named_state`, not copied: the ledger keeps the
                live tensors and their version counters, and digests them only while they are unchanged.
            cast (str | None, optional): `WeightSyncConfig.dtype`, the dtype evaluators hold floating tensors
                in: fingerprints and digests are taken in it. Defaults to None (the trainer's dtypes).
        """
        record = weights.WeightRecord.of(version, state, digest=False, cast=cast)
        self._entries[version] = _Sent(record, dict(state), _stamp(state), cast)
        for older in self._entries.values():  # only the newest can still be unchanged
            if older.record.version != version:
                older.state = None
        while len(self._entries) > self.keep:
            self._entries.popitem(last=False)

    def reference(self, version: int, exact: bool = False) -> weights.WeightRecord | None:
        """What was sent as `version`, or None when it is not remembered.

        Args:
            version (int): The version.
            exact (bool, optional): Also give the digests: computed now (once) when the trainer's tensors are
                unchanged since `version` was sent; a version sent before later training keeps fingerprints
                only. Defaults to False.

        Returns:
            weights.WeightRecord | None: The record (`digest` None when not known).
        """
        sent = self._entries.get(version)
        if sent is None:
            return None
        if exact and sent.record.digest is None and sent.state is not None:
            if _stamp(sent.state) == sent.stamp:
                digest = weights.tensor_digests(sent.state, sent.cast)
                sent.record = dataclasses.replace(sent.record, digest=digest)
            sent.state = None  # digested, or changed since it was sent: nothing more to take from it
        return sent.record

    def check(
        self, reports: Mapping[int, weights.ReceiverReport], rtol: float = DEFAULT_RTOL, exact: bool = False
    ) -> Consistency:
        """Compare each report on a remembered version with what was sent as that version.

        Args:
            reports (Mapping[int, ReceiverReport]): Ordinal -> newest report (`WeightSender.reports()`).
            rtol (float, optional): Relative tolerance of the fingerprints. Defaults to `DEFAULT_RTOL`.
            exact (bool, optional): Also compare digests where the trainer still holds that version's
                weights (`reference`); else fingerprints only. Defaults to False.

        Returns:
            Consistency: The verdict.
        """
        checked, on_latest, mismatched = [], [], {}
        for ordinal, report in sorted(reports.items()):
            reference = self.reference(report.applied.version, exact)
            if reference is None:
                continue
            bad = reference.mismatches(report.applied, rtol)
            checked.append(ordinal)
            if report.applied.version == self.latest:
                on_latest.append(ordinal)
            if bad:
                mismatched[ordinal] = bad
        verdict = None if not checked else not mismatched
        return Consistency(verdict, checked, mismatched, on_latest)
