"""A trainer's state besides its weights (optimizer, step counters, weight version, the policy's extra training
state such as a replay buffer) and the checkpoint file.

Two users share one definition of that state: `BasePolicy.save_checkpoint`/`load_checkpoint`, which add the
weights and the RNG states, and the DDP resume (`rlightning.runtime._resume`), which broadcasts it from rank 0.
States are cloned to the CPU as plain containers, so a checkpoint loads with `torch.load(weights_only=True)`.
"""

from __future__ import annotations

import copy
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

import torch

CHECKPOINT_FORMAT_VERSION = 2
"""Version of the dict `BasePolicy.save_checkpoint` writes; bumped on incompatible changes (2: `extra`)."""


class Trainable(Protocol):
    """What carries a training state: `BasePolicy` after `init_train` (the optimizer is None before it)."""

    optimizer: torch.optim.Optimizer | None
    iteration: int
    env_steps: int
    weight_version: int

    def extra_training_state(self) -> dict[str, Any]: ...

    def load_extra_training_state(self, state: Mapping[str, Any]) -> None: ...


def clone_checkpoint_value(value: Any) -> Any:
    """Deep-clone a checkpoint value so later training cannot change the snapshot; tensors move to the CPU.

    Args:
        value (Any): A tensor, a dict/list/tuple of values, or any other (deep-copied) object.

    Returns:
        Any: The clone, with every tensor detached, on the CPU and owning its memory.
    """
    if isinstance(value, torch.Tensor):
        return value.detach().to("cpu", copy=True)
    if isinstance(value, Mapping):
        return {key: clone_checkpoint_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(clone_checkpoint_value(item) for item in value)
    return copy.deepcopy(value)


def capture(policy: Trainable) -> dict[str, Any]:
    """Snapshot the training state, cloned to the CPU.

    Args:
        policy (Trainable): The policy.

    Returns:
        dict[str, Any]: `optimizer` (state dict or None), `counters` (`iteration`, `env_steps`),
            `weight_version` and `extra` (`extra_training_state()`), the keys a checkpoint holds them under.
    """
    optimizer = policy.optimizer
    return {
        "optimizer": None if optimizer is None else clone_checkpoint_value(optimizer.state_dict()),
        "counters": {"iteration": policy.iteration, "env_steps": policy.env_steps},
        "weight_version": policy.weight_version,
        "extra": clone_checkpoint_value(policy.extra_training_state()),
    }


def restore(policy: Trainable, state: Mapping[str, Any]) -> None:
    """Assign a `capture` snapshot (or a checkpoint holding one) back to `policy`.

    The optimizer state is loaded only when both the policy and the snapshot have one (an evaluator has none).

    Args:
        policy (Trainable): The policy.
        state (Mapping[str, Any]): A dict with `capture`'s keys.
    """
    if policy.optimizer is not None and state["optimizer"] is not None:
        policy.optimizer.load_state_dict(state["optimizer"])
    policy.iteration = int(state["counters"]["iteration"])
    policy.env_steps = int(state["counters"]["env_steps"])
    policy.weight_version = int(state["weight_version"])
    policy.load_extra_training_state(state["extra"])


def write_checkpoint(state: Mapping[str, Any], path: str | os.PathLike[str]) -> Path:
    """Write a checkpoint atomically (a temporary file beside it, then a rename), so a crash leaves no torn file.

    Args:
        state (Mapping[str, Any]): The checkpoint, with `format_version` set to `CHECKPOINT_FORMAT_VERSION`.
        path (str | os.PathLike[str]): Destination file; parent directories are created.

    Returns:
        Path: The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    torch.save(state, tmp)
    os.replace(tmp, path)
    return path


def read_checkpoint(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read a checkpoint onto the CPU, tensors and plain containers only (`weights_only=True`).

    Args:
        path (str | os.PathLike[str]): A file written by `write_checkpoint`.

    Returns:
        dict[str, Any]: The checkpoint.

    Raises:
        ValueError: When the file's `format_version` is neither `CHECKPOINT_FORMAT_VERSION` nor 1.
    """
    state = torch.load(Path(path), map_location="cpu", weights_only=True)
    if state.get("format_version") == 1:  # written before `extra` existed: a policy without extra state
        state = {**state, "format_version": CHECKPOINT_FORMAT_VERSION, "extra": {}}
    if state.get("format_version") != CHECKPOINT_FORMAT_VERSION:
        raise ValueError(
            f"{path}: checkpoint format_version must be 1 or {CHECKPOINT_FORMAT_VERSION}, "
            f"got {state.get('format_version')!r}"
        )
    return state
