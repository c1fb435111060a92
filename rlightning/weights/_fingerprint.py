"""Consistency checks between copies of a policy's weights: L2 fingerprints (tolerant) and digests (exact).

`WeightRecord` is the one record of what a copy holds (version, fingerprint, digests): evaluators report one,
and the trainer compares it with its own record of that version.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections.abc import Mapping

import torch

from rlightning.weights import _state


def l2_fingerprint(state: Mapping[str, torch.Tensor], cast: str | None = None) -> dict[str, float]:
    """Per-tensor L2 norm in float32, the seed's `get_param_fingerprint`.

    Args:
        state (Mapping[str, torch.Tensor]): name -> tensor of any shape `[*S]`, dtype and device.
        cast (str | None, optional): `WeightSyncConfig.dtype`: fingerprint the floating tensors as evaluators
            hold them, cast to it (one tensor at a time). Defaults to None (as they are).

    Returns:
        dict[str, float]: name -> `||t.float()||_2`, computed in float32.
    """
    return {
        name: float(t.detach().to(_state.wire_dtype(t.dtype, cast)).to(torch.float32).norm(2))
        for name, t in state.items()
    }


def tensor_digests(state: Mapping[str, torch.Tensor], cast: str | None = None) -> dict[str, str]:
    """Per-tensor SHA-256 over dtype, shape and the raw bytes (exact equality check).

    Bytes are taken in C order after moving the tensor to host memory, so equal values on different devices
    give equal digests.

    Args:
        state (Mapping[str, torch.Tensor]): name -> tensor of any shape `[*S]`, dtype and device.
        cast (str | None, optional): `WeightSyncConfig.dtype`: digest the floating tensors as evaluators hold
            them, cast to it (one tensor at a time). Defaults to None (as they are).

    Returns:
        dict[str, str]: name -> 64 hex characters.
    """
    out: dict[str, str] = {}
    for name, t in state.items():
        t = t.detach().to(_state.wire_dtype(t.dtype, cast))
        h = hashlib.sha256(f"{t.dtype}|{tuple(t.shape)}|".encode())
        raw = t.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8)
        h.update(raw.numpy().data)
        out[name] = h.hexdigest()
    return out


def mismatched_fingerprints(
    expected: Mapping[str, float], actual: Mapping[str, float], rtol: float = 1e-5, atol: float = 1e-8
) -> list[str]:
    """Names whose fingerprints differ beyond `|a - e| <= atol + rtol * |e|` (math.isclose), or exist on one side.

    Args:
        expected (Mapping[str, float]): the reference, e.g. the trainer's `l2_fingerprint`.
        actual (Mapping[str, float]): the copy to check, e.g. an evaluator's.
        rtol (float, optional): relative tolerance. Defaults to 1e-5.
        atol (float, optional): absolute tolerance (norms of all-zero tensors). Defaults to 1e-8.

    Returns:
        list[str]: sorted names; empty when the copies agree.
    """
    names = set(expected) | set(actual)
    return sorted(
        n
        for n in names
        if n not in expected
        or n not in actual
        or not math.isclose(expected[n], actual[n], rel_tol=rtol, abs_tol=atol)
    )


def mismatched_digests(expected: Mapping[str, str], actual: Mapping[str, str]) -> list[str]:
    """Names whose digests differ, or that exist on one side only.

    Args:
        expected (Mapping[str, str]): the reference `tensor_digests`.
        actual (Mapping[str, str]): the copy to check.

    Returns:
        list[str]: sorted names; empty when the copies are bit-identical.
    """
    names = set(expected) | set(actual)
    return sorted(n for n in names if expected.get(n) != actual.get(n))


@dataclasses.dataclass(frozen=True)
class WeightRecord:
    """What one copy of a policy's weights is: its version, per-tensor L2 fingerprint and digests.

    Attributes:
        version (int): the weight version (0 before any update).
        fingerprint (dict[str, float]): `l2_fingerprint` of the weights.
        digest (dict[str, str] | None): `tensor_digests` of the weights; None when not computed, which
            skips the exact check (`mismatches`). Defaults to None.

    Examples:
        >>> record = WeightRecord.of(3, {"w": torch.ones(2)})
        >>> record.version, record.fingerprint
        (3, {'w': 1.4142135381698608})
    """

    version: int
    fingerprint: dict[str, float]
    digest: dict[str, str] | None = None

    @classmethod
    def of(
        cls, version: int, state: Mapping[str, torch.Tensor], digest: bool = True, cast: str | None = None
    ) -> WeightRecord:
        """Fingerprint (and digest) `state` as version `version`.

        Args:
            version (int): the weight version of `state`.
            state (Mapping[str, torch.Tensor]): name -> tensor, as `named_state` returns.
            digest (bool, optional): also compute the sha256 digests (a pass over every byte). Defaults to True.
            cast (str | None, optional): `WeightSyncConfig.dtype`: record the floating tensors cast to it, as
                evaluators hold them (the trainer's side of a comparison). Defaults to None.

        Returns:
            WeightRecord: the record.
        """
        fingerprint = l2_fingerprint(state, cast)
        return cls(int(version), fingerprint, tensor_digests(state, cast) if digest else None)

    def mismatches(self, other: WeightRecord, rtol: float = 1e-5) -> list[str]:
        """Tensor names whose fingerprint (or, where both sides have them, digest) differs from `other`'s.

        Versions are not compared: callers decide which version a copy should hold.

        Args:
            other (WeightRecord): the copy to check against this reference.
            rtol (float, optional): relative tolerance of the fingerprints (`mismatched_fingerprints`).
                Defaults to 1e-5.

        Returns:
            list[str]: sorted names; empty when the copy matches.
        """
        bad = set(mismatched_fingerprints(self.fingerprint, other.fingerprint, rtol=rtol))
        if self.digest and other.digest:
            bad |= set(mismatched_digests(self.digest, other.digest))
        return sorted(bad)
