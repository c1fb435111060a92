"""Applying received weights to a serving policy between rollouts, on a daemon thread, with no request lost.

Requests are counted by generation: `notify` raises the requested generation, an apply marks every generation
requested before it started as handled, so a notify that arrives during an apply triggers one more pass instead
of being lost. Applies hold the `RolloutGate` exclusively, so they never interleave with a forward pass.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping

import torch

from rlightning import weights
from rlightning.policy import _gate, _timing

logger = logging.getLogger(__name__)


class WeightUpdateThread:
    """The weight-update side of a policy: push, notify, apply between rollouts, wait for applies.

    Args:
        buffer (weights.WeightBufferMixin): The policy; its `stage_weights` and `update_weights_from_buffer`
            are called (so a subclass's overrides take effect).
        gate (_gate.RolloutGate): The policy's gate; applies hold it exclusively.
        timings (_timing.PhaseTimings): Where each apply's duration goes, as phase `update_weights`.
        name (str): The thread's name, also used in log messages.
    """

    def __init__(
        self,
        buffer: weights.WeightBufferMixin,
        gate: _gate.RolloutGate,
        timings: _timing.PhaseTimings,
        name: str,
    ) -> None:
        self._buffer = buffer
        self._gate = gate
        self._timings = timings
        self._name = name
        self._cond = threading.Condition()
        self._requested = 0  # generation of the newest notify
        self._handled = 0  # newest generation whose apply finished (or failed)
        self._stop = False
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def error(self) -> BaseException | None:
        """BaseException | None: What the last apply raised; None after an apply that succeeded."""
        with self._cond:
            return self._error

    def is_alive(self) -> bool:
        """Whether the daemon thread runs.

        Returns:
            bool: True between `start` and `close`.
        """
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the daemon thread running `run`; does nothing when it already runs."""
        if self._thread is not None:
            return
        with self._cond:
            self._stop = False
        self._thread = threading.Thread(target=self.run, name=self._name, daemon=True)
        self._thread.start()

    def notify(self) -> int:
        """Ask for the staged weights to be applied; safe from any thread.

        Returns:
            int: The request's generation.
        """
        with self._cond:
            self._requested += 1
            self._cond.notify_all()
            return self._requested

    def push(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        """Hand weights over as the buffer strategy wants: staged and notified (`single`), or applied now
        after running rollouts drain (`none`).

        Args:
            version (int): The weight version (>= 1); one not newer than the newest staged or applied is ignored.
            state (Mapping[str, torch.Tensor]): Clean name -> tensor; not copied.

        Returns:
            bool: True when staged or applied, False when ignored as not newer.
        """
        if self._buffer.weight_buffer_strategy == "none":
            with self._gate.exclusive():
                return self._buffer.stage_weights(version, state)
        if not self._buffer.stage_weights(version, state):
            return False
        self.notify()
        return True

    def wait_done(self, timeout: float | None = None) -> bool:
        """Wait until every request made so far has been handled.

        Args:
            timeout (float | None, optional): Seconds to wait. Defaults to None (forever).

        Returns:
            bool: True when handled without error, False on timeout or when the last apply failed.
        """
        with self._cond:
            target = self._requested
            done = self._cond.wait_for(lambda: self._handled >= target, timeout)
            return done and self._error is None

    def apply_staged(self, timeout: float | None = None) -> int | None:
        """Apply the staged weights now, exclusive of rollouts; marks every request so far as handled.

        Args:
            timeout (float | None, optional): Seconds to wait for running rollouts. Defaults to None (forever).

        Returns:
            int | None: The weight version applied, or None when nothing newer was staged.

        Raises:
            TimeoutError: When rollouts did not drain within `timeout` (nothing applied, request kept).
            Exception: Whatever applying raised (also kept in `error`).
        """
        with self._cond:
            generation = self._requested
        start = time.perf_counter()
        with self._gate.exclusive(timeout) as held:
            if not held:
                raise TimeoutError(f"rollouts did not finish within {timeout} s; weights not applied")
            version: int | None = None
            error: Exception | None = None
            try:
                version = self._buffer.update_weights_from_buffer()
            except Exception as exc:  # noqa: BLE001 (handed to the waiters and re-raised below)
                error = exc
            with self._cond:
                self._error = error
                self._handled = max(self._handled, generation)
                self._cond.notify_all()
        self._timings.record("update_weights", time.perf_counter() - start)
        if error is not None:
            raise error
        return version

    def run(self) -> None:
        """The loop: wait for a request, apply (waiting for rollouts to drain), repeat; returns after `close`.

        Errors are logged and kept in `error`; the loop continues.
        """
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._requested > self._handled)
                if self._stop:
                    return
            try:
                self.apply_staged()
            except Exception:
                logger.exception("%s: applying staged weights failed", self._name)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the daemon thread (idempotent).

        Args:
            timeout (float, optional): Seconds to wait for the thread to finish its current apply.
                Defaults to 5.0.
        """
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None
