"""Consistency checks between copies of a policy's weights: L2 fingerprints (tolerant) and digests (exact)."""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping

import torch


def l2_fingerprint(state: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Per-tensor L2 norm in float32, the seed's `get_param_fingerprint`.

    Args:
        state (Mapping[str, torch.Tensor]): name -> tensor of any shape `[*S]`, dtype and device.

    Returns:
        dict[str, float]: name -> `||t.float()||_2`, computed in float32.
    """
    return {name: float(t.detach().to(torch.float32).norm(2)) for name, t in state.items()}


def tensor_digests(state: Mapping[str, torch.Tensor]) -> dict[str, str]:
    """Per-tensor SHA-256 over dtype, shape and the raw bytes (exact equality check).

    Bytes are taken in C order after moving the tensor to host memory, so equal values on different devices
    give equal digests.

    Args:
        state (Mapping[str, torch.Tensor]): name -> tensor of any shape `[*S]`, dtype and device.

    Returns:
        dict[str, str]: name -> 64 hex characters.
    """
    out: dict[str, str] = {}
    for name, t in state.items():
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
