"""The weight staging buffer mixed into policies: stage a received version, apply it between rollouts."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Literal

import torch

from rlightning.weights import _state

BufferStrategy = Literal["none", "single"]
"""Values of `rlightning.config.WeightBufferConfig.buffer_strategy`."""


class WeightBufferMixin:
    """Versioned weight staging for an `nn.Module` (mixed into `BasePolicy`).

    With strategy `single`, a receiver thread calls `stage_weights(version, state)` and the policy calls
    `update_weights_from_buffer()` between rollouts; the buffer holds at most one state, the newest. With
    strategy `none` there is no buffer: `stage_weights` applies at once, so the caller must call it only
    where no forward pass runs. In both, a version not newer than the newest staged or applied one is ignored,
    and `weight_version` (a plain int, 0 before any update) is the version of the weights in the module; a
    checkpoint stores it and a resume assigns it back.

    All methods are thread-safe. Call `__init_weight_buffer_mixin__` once, after `nn.Module.__init__`.
    """

    weight_version: int

    def __init_weight_buffer_mixin__(self, strategy: BufferStrategy = "single") -> None:
        """Set up the buffer.

        Args:
            strategy (str, optional): `single` (one staging slot) or `none` (apply on stage). Defaults to
                "single".

        Raises:
            ValueError: on another strategy.
        """
        if strategy not in ("none", "single"):
            raise ValueError(f"weight buffer strategy must be 'none' or 'single', got {strategy!r}")
        self.weight_buffer_strategy: BufferStrategy = strategy
        self.weight_version = 0
        self._weight_stage_lock = threading.Lock()  # guards _staged
        self._weight_apply_lock = threading.Lock()  # serialises applies, so versions are applied in order
        self._staged: tuple[int, Mapping[str, torch.Tensor]] | None = None

    @property
    def staged_weight_version(self) -> int | None:
        """Version waiting in the buffer, or None."""
        with self._weight_stage_lock:
            return None if self._staged is None else self._staged[0]

    def stage_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        """Offer weights of `version`; keep them only when newer than anything staged or applied.

        The buffer keeps a reference to `state` (no copy); the caller must not modify it afterwards.

        Args:
            version (int): the weight version (>= 1).
            state (Mapping[str, torch.Tensor]): clean name -> tensor, as `named_state` of this module.

        Returns:
            bool: True when staged (or, with strategy `none`, applied); False when ignored as not newer.
        """
        version = int(version)
        if self.weight_buffer_strategy == "none":
            with self._weight_apply_lock:
                if version <= self.weight_version:
                    return False
                _state.load_named_state(self, state)  # type: ignore[arg-type]
                self.weight_version = version
                return True
        with self._weight_stage_lock:
            newest = max(self.weight_version, -1 if self._staged is None else self._staged[0])
            if version <= newest:
                return False
            self._staged = (version, state)
            return True

    def update_weights_from_buffer(self) -> int | None:
        """Apply the staged weights to this module in place and set `weight_version`.

        Returns:
            int | None: the version applied, or None when nothing newer was staged.

        Raises:
            KeyError, ValueError: from `load_named_state` when the staged weights do not fit the module; the
                staged state is dropped and `weight_version` is unchanged.
        """
        with self._weight_apply_lock:
            with self._weight_stage_lock:
                staged, self._staged = self._staged, None
            if staged is None or staged[0] <= self.weight_version:
                return None
            version, state = staged
            _state.load_named_state(self, state)  # type: ignore[arg-type]
            self.weight_version = version
            return version
