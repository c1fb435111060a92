"""Extraction and in-place loading of a module's weights: parameters and persistent buffers, by clean name."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

_DDP_PREFIX = "module."
_COMPILE_SEGMENT = "_orig_mod"


def _unwrap(module: nn.Module) -> nn.Module:
    """Strip DistributedDataParallel / DataParallel (`.module`) and torch.compile (`._orig_mod`) wrappers."""
    while True:
        if isinstance(module, (nn.parallel.DistributedDataParallel, nn.DataParallel)):
            module = module.module
        elif hasattr(module, _COMPILE_SEGMENT) and isinstance(getattr(module, _COMPILE_SEGMENT), nn.Module):
            module = getattr(module, _COMPILE_SEGMENT)
        else:
            return module


def clean_state_dict_keys(state_dict: Mapping[str, object]) -> dict[str, object]:
    """Return `state_dict` with the wrapper prefixes removed from its keys.

    A leading `module.` (DistributedDataParallel) or `_orig_mod.` (torch.compile) is stripped, repeatedly, when
    every key carries it (as torch's `consume_prefix_in_state_dict_if_present` does for one prefix); a
    `_orig_mod` segment anywhere (a compiled submodule) is dropped. Values are not copied.

    Args:
        state_dict (Mapping[str, object]): keys as produced by `state_dict()` of a possibly wrapped module.

    Returns:
        dict[str, object]: the same values under clean keys, in the same order.

    Raises:
        ValueError: when two keys become the same clean key.

    Examples:
        >>> clean_state_dict_keys({"module._orig_mod.fc.weight": 1})
        {'fc.weight': 1}
    """
    keys = list(state_dict)
    stripped = True
    while stripped and keys:
        stripped = False
        for prefix in (_DDP_PREFIX, _COMPILE_SEGMENT + "."):
            if all(k.startswith(prefix) for k in keys):
                keys = [k[len(prefix) :] for k in keys]
                stripped = True
    clean: dict[str, object] = {}
    for original, key in zip(state_dict, keys, strict=True):
        key = ".".join(part for part in key.split(".") if part != _COMPILE_SEGMENT)
        if key in clean:
            raise ValueError(f"state_dict keys collide after removing wrapper prefixes: {original!r} -> {key!r}")
        clean[key] = state_dict[original]
    return clean


def _unwrapped_modules(module: nn.Module, name: str = "") -> list[tuple[str, nn.Module]]:
    """`named_modules()` with wrappers removed at every depth, so a DDP-wrapped child (a policy's
    `agent = DDP(net)`) is named `agent.x`, not `agent.module.x`.
    """
    module = _unwrap(module)
    out = [(name, module)]
    for child_name, child in module.named_children():
        out.extend(_unwrapped_modules(child, f"{name}.{child_name}" if name else child_name))
    return out


def named_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter and persistent buffer of `module`, detached, keyed by clean dotted names.

    Covers what `state_dict()` covers (BatchNorm running statistics and `num_batches_tracked`, parameters set
    directly on the root module as bare `nn.Parameter` attributes) without calling possibly overridden
    `state_dict` hooks. Wrappers are removed: DistributedDataParallel's `module.` and torch.compile's
    `_orig_mod.` never appear in the names. Non-persistent buffers are skipped, as in `state_dict()`.
    The tensors share storage with the module (no copy).

    Args:
        module (nn.Module): the module, possibly wrapped in DDP and/or torch.compile.

    Returns:
        dict[str, torch.Tensor]: name -> detached tensor, in module registration order.

    Examples:
        >>> sorted(named_state(nn.BatchNorm1d(2)))
        ['bias', 'num_batches_tracked', 'running_mean', 'running_var', 'weight']
    """
    out: dict[str, torch.Tensor] = {}
    for mod_name, mod in _unwrapped_modules(module):
        prefix = f"{mod_name}." if mod_name else ""
        for name, param in mod.named_parameters(recurse=False, remove_duplicate=False):
            out[prefix + name] = param.detach()
        for name, buf in mod.named_buffers(recurse=False, remove_duplicate=False):
            if name not in mod._non_persistent_buffers_set:  # same rule as nn.Module._save_to_state_dict
                out[prefix + name] = buf.detach()
    return clean_state_dict_keys(out)  # type: ignore[return-value]


def load_named_state(module: nn.Module, state: Mapping[str, torch.Tensor]) -> None:
    """Copy `state` into the module's parameters and persistent buffers in place, under `torch.no_grad()`.

    Every name must match, with equal shape and dtype; values may live on another device (copied across).
    Nothing is copied when a check fails.

    Args:
        module (nn.Module): the target, possibly wrapped in DDP and/or torch.compile.
        state (Mapping[str, torch.Tensor]): name -> tensor, clean names as returned by `named_state`.

    Raises:
        KeyError: when names are missing from `state` or unexpected in it (both lists in the message).
        ValueError: when a tensor's shape or dtype differs from the module's (every such name listed).
    """
    target = named_state(module)
    missing = sorted(set(target) - set(state))
    unexpected = sorted(set(state) - set(target))
    if missing or unexpected:
        raise KeyError(f"weights do not match the module: missing {missing}, unexpected {unexpected}")
    bad = [
        f"{name}: module {tuple(t.shape)} {t.dtype}, given {tuple(state[name].shape)} {state[name].dtype}"
        for name, t in target.items()
        if t.shape != state[name].shape or t.dtype != state[name].dtype
    ]
    if bad:
        raise ValueError("shape or dtype mismatch: " + "; ".join(bad))
    with torch.no_grad():
        for name, t in target.items():
            t.copy_(state[name])


def wire_dtype(dtype: torch.dtype, cast: str | None) -> torch.dtype:
    """The dtype a tensor of `dtype` travels in, and evaluators hold it in (`WeightSyncConfig.dtype`).

    Args:
        dtype (torch.dtype): the trainer's dtype of the tensor.
        cast (str | None): `WeightSyncConfig.dtype`, e.g. "bfloat16"; None keeps every dtype.

    Returns:
        torch.dtype: `cast` for floating-point tensors, `dtype` otherwise (integers, booleans: counters,
        `num_batches_tracked`, are never cast).
    """
    if cast is None or not dtype.is_floating_point:
        return dtype
    return getattr(torch, cast)

