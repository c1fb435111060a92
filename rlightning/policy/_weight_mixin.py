"""`WeightUpdateMixin`: how a policy takes new weights and shows which it holds (mixed into `BasePolicy`).

The seed's weight-update API over `rlightning.weights.WeightBufferMixin` (the versioned staging buffer): a request
to apply staged weights is counted by generation so none is lost, and applied between rollouts by the update
thread (`_weight_updates.WeightUpdateThread`); with buffer strategy `none` a version is received straight into the
policy's tensors while rollouts are paused. Besides: what a trainer publishes (`get_eval_weights`) and the
fingerprints and digests that compare an evaluator's weights with the trainer's.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from rlightning import weights
from rlightning.policy import _gate, _weight_updates


class WeightUpdateMixin(weights.WeightBufferMixin):
    """Staged weights applied between rollouts, in-place receives, published weights, fingerprints and digests.

    Mixed into an `nn.Module` (`BasePolicy`), which sets `_gate` (the rollout gate) and `_update_thread` (the
    weight-update thread) in its `__init__`.
    """

    _gate: _gate.RolloutGate
    _update_thread: _weight_updates.WeightUpdateThread

    def _named_state(self) -> dict[str, torch.Tensor]:
        """Every parameter and buffer of the module this is mixed into, by clean name (no copy)."""
        return weights.named_state(self)  # type: ignore[arg-type]  # mixed into an nn.Module (BasePolicy)

    # -- weight updates --------------------------------------------------------------------------------------------

    @property
    def weight_update_error(self) -> BaseException | None:
        """BaseException | None: What the last weight update raised; None after one that succeeded."""
        return self._update_thread.error

    def notify_update_weights(self) -> int:
        """Ask for the staged weights to be applied; safe from any thread, never lost during an update.

        Returns:
            int: The request's generation; `wait_for_weight_update_done` waits for it.
        """
        return self._update_thread.notify()

    def push_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        """Hand received weights to the policy the way its buffer strategy wants, never during a rollout.

        With strategy `single` the state is staged and the update thread notified (applied between
        rollouts); with `none` it is applied now, after running rollouts drain.

        Args:
            version (int): The weight version (>= 1); a version not newer than the newest staged or applied
                one is ignored.
            state (Mapping[str, torch.Tensor]): Clean name -> tensor (`named_state` form); not copied, so the
                caller must not modify it afterwards.

        Returns:
            bool: True when staged or applied, False when ignored as not newer.
        """
        return self._update_thread.push(version, state)

    def wait_for_weight_update_done(self, timeout: float | None = None) -> bool:
        """Wait until every update requested so far has been applied.

        Args:
            timeout (float | None, optional): Seconds to wait. Defaults to None (forever).

        Returns:
            bool: True when applied without error, False on timeout or when the last update failed
                (see `weight_update_error`).
        """
        return self._update_thread.wait_done(timeout)

    def apply_staged_weights(self, timeout: float | None = None) -> int | None:
        """Apply the staged weights now, exclusive of rollouts; marks every request so far as handled.

        The update thread calls this; with buffer strategy `none` the caller does.

        Args:
            timeout (float | None, optional): Seconds to wait for running rollouts. Defaults to None (forever).

        Returns:
            int | None: The weight version applied, or None when nothing newer was staged.

        Raises:
            TimeoutError: When rollouts did not drain within `timeout` (nothing applied, request kept).
            Exception: Whatever applying raised (also kept in `weight_update_error`).
        """
        return self._update_thread.apply_staged(timeout)

    def receive_targets(self) -> dict[str, torch.Tensor]:
        """The tensors a version received in place is written into (`WeightReceiver.receive(into=...)`).

        Returns:
            dict[str, torch.Tensor]: Clean name -> this policy's own tensor (`named_state`, no copy).
        """
        return self._named_state()

    def begin_weight_receive(self, timeout: float) -> bool:
        """Pause rollouts while a version is written straight into this policy's tensors (buffer strategy
        `none`, `rlightning.weights.WeightReceiver`): waits for running rollouts, keeps new ones out until
        `end_weight_receive`.

        Args:
            timeout (float): Seconds to wait for running rollouts.

        Returns:
            bool: True when paused (call `end_weight_receive` afterwards); False when rollouts did not drain in
            time (nothing may be written).
        """
        return self._gate.acquire_exclusive(timeout)

    def end_weight_receive(self, version: int | None) -> None:
        """Let rollouts in again after `begin_weight_receive`.

        Args:
            version (int | None): The version the tensors now hold completely; None when the receive stopped part
                way, so they hold no version: `weight_version` is 0 until the next complete one.

        Raises:
            RuntimeError: When no receive was begun.
        """
        with self._weight_apply_lock:
            self.weight_version = 0 if version is None else int(version)
        self._gate.release_exclusive()

    def update_weights(self) -> None:
        """The update thread's loop (`init_eval` starts it on a daemon thread): wait for a request, wait for
        rollouts to drain, apply, repeat.

        A request that arrives while an update runs has a newer generation and triggers another pass.
        Errors are logged and kept in `weight_update_error`; the loop continues. Returns after `close`.
        """
        self._update_thread.run()

    def get_eval_weights(self) -> dict[str, torch.Tensor]:
        """The tensors a trainer publishes to its evaluators: what an evaluator of this class holds, by clean name.

        By default every parameter and buffer (`weights.named_state(self)`). A policy whose evaluators need less
        than the trainer holds (SAC's critics stay with the trainer) returns that part, named as in the evaluator's
        own `named_state`, so received weights load into it and its digests compare with these.

        Returns:
            dict[str, torch.Tensor]: Clean name -> tensor, sharing storage with the policy (no copy).
        """
        return self._named_state()

    # -- fingerprints -----------------------------------------------------------------------------------------------

    def get_param_fingerprint(self) -> dict[str, float]:
        """Per-tensor float32 L2 norms of every parameter and buffer, keyed `"<module>.<param>"`.

        Returns:
            dict[str, float]: Norms by clean name (no DDP/compile prefixes).
        """
        return weights.l2_fingerprint(self._named_state())

    def get_param_digests(self) -> dict[str, str]:
        """Exact sha256 digests of every parameter and buffer.

        Returns:
            dict[str, str]: Hex digests by clean name.
        """
        return weights.tensor_digests(self._named_state())
