"""`CheckpointMixin`: a policy's checkpoint, the one home of what a resume needs (mixed into `BasePolicy`).

Weights, optimizer, counters, weight version, the policy's extra training state (a replay buffer) and the RNG
states, written atomically and read back through `_training_state` and `_rng`.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import torch

from rlightning import weights
from rlightning.policy import _gate, _rng, _training_state


class CheckpointMixin:
    """Checkpoint state, save and resume.

    Mixed into an `nn.Module` (`BasePolicy`), which sets `_gate`, `optimizer`, `iteration`, `env_steps` and
    `weight_version` and defines `load_state_dict` and `_require_init`.
    """

    _gate: _gate.RolloutGate
    optimizer: torch.optim.Optimizer | None
    iteration: int
    env_steps: int
    weight_version: int
    _require_init: Callable[[], None]
    load_state_dict: Callable[[Mapping[str, Any]], None]

    # -- checkpoints ------------------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resume needs, cloned to the CPU.

        Returns:
            dict[str, Any]: `format_version`, `policy_class`, `weights` (named_state), `optimizer` (state dict
                or None), `counters` (`iteration`, `env_steps`), `weight_version`, `extra`
                (`extra_training_state()`), `rng` (python, numpy, torch, cuda).
        """
        cls = type(self)
        return {
            "format_version": _training_state.CHECKPOINT_FORMAT_VERSION,
            "policy_class": f"{cls.__module__}:{cls.__qualname__}",
            "weights": _training_state.clone_checkpoint_value(
                dict(weights.named_state(self))  # type: ignore[arg-type]  # mixed into an nn.Module (BasePolicy)
            ),
            **_training_state.capture(self),
            "rng": _rng.capture_rng_state(),
        }

    def extra_training_state(self) -> dict[str, Any]:
        """What else a resume needs besides weights, optimizer, counters and RNG (an off-policy learner's replay
        buffer); checkpointed and, on a DDP resume, broadcast from rank 0 to every rank. None by default.

        Returns:
            dict[str, Any]: Tensors in plain containers (a checkpoint loads with `weights_only=True`).
        """
        return {}

    def load_extra_training_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `extra_training_state` returned (the base class has none to restore).

        Args:
            state (Mapping[str, Any]): An `extra_training_state()` output, tensors on the CPU.
        """
        del state

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write `checkpoint_state()` atomically (temporary file, then rename).

        Args:
            path (str | os.PathLike[str]): Destination file; parent directories are created.

        Returns:
            Path: The path written.
        """
        return _training_state.write_checkpoint(self.checkpoint_state(), path)

    def load_checkpoint(self, path: str | os.PathLike[str], restore_rng: bool = True) -> dict[str, Any]:
        """Resume from a checkpoint: weights, optimizer, counters, weight version, extra training state (a replay
        buffer) and (optionally) RNG states.

        Call after `init_train` (or `init_eval`, which ignores the optimizer state).

        Args:
            path (str | os.PathLike[str]): A file written by `save_checkpoint`.
            restore_rng (bool, optional): Also restore the global RNG states. Defaults to True.

        Returns:
            dict[str, Any]: The checkpoint as loaded.

        Raises:
            RuntimeError: When the policy is not initialised.
            ValueError: When the file's format version is unknown.
        """
        self._require_init()
        state = _training_state.read_checkpoint(path)
        with self._gate.exclusive():
            self.load_state_dict(state["weights"])
        _training_state.restore(self, state)
        if restore_rng:
            _rng.restore_rng_state(state["rng"])
        return state
