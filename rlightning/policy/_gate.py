"""Mutual exclusion of rollouts (forward passes) and weight updates, for threads and asyncio tasks.

Any number of rollouts (at most one in sync mode) may run at once, a weight update runs alone, and a waiting
update closes the admission of new rollouts so a steady stream of requests cannot starve it. Rollouts are
admitted in arrival order (one FIFO queue for threads and tasks), so a caller that loops is queued behind every
caller already waiting and none starves; an update waits for the rollouts in progress, then goes before the queue.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
import time
from collections.abc import Iterator


class RolloutGate:
    """A fair readers-writer gate: rollouts are readers admitted in arrival order, a weight update is the writer,
    and the writer has priority over queued readers.

    Args:
        max_concurrent_rollouts (int | None, optional): Rollouts allowed in flight at once; None is unbounded.
            Defaults to None.
    """

    def __init__(self, max_concurrent_rollouts: int | None = None) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._max = max_concurrent_rollouts
        self._active = 0
        self._queue: collections.deque[object] = collections.deque()  # one token per waiting rollout, oldest first
        self._updating = False
        self._updates_waiting = 0
        self._async_waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    @property
    def requests(self) -> int:
        """int: Rollouts in flight or waiting for admission now (a replica's load, for routing)."""
        with self._cond:
            return self._active + len(self._queue)

    @property
    def updates_waiting(self) -> int:
        """int: Weight updates waiting for the rollouts in flight to finish."""
        with self._cond:
            return self._updates_waiting

    def _can_enter(self, token: object) -> bool:
        room = self._max is None or self._active < self._max
        return room and not self._updating and self._updates_waiting == 0 and self._queue[0] is token

    def _leave_queue(self, token: object, admitted: bool) -> None:
        # Called with the lock held, admitted or given up: the next in line may now enter (async mode) or move up.
        self._queue.remove(token)
        if admitted:
            self._active += 1
        if self._queue:
            self._wake()

    def _wake(self) -> None:
        # Called with the lock held: wake threads and every asyncio task waiting for admission.
        self._cond.notify_all()
        waiters, self._async_waiters = self._async_waiters, []
        for loop, future in waiters:
            with contextlib.suppress(RuntimeError):  # the loop was closed meanwhile: nobody waits any more
                loop.call_soon_threadsafe(_resolve, future)

    def enter_rollout(self, timeout: float | None = None) -> bool:
        """Admit one rollout after the ones that arrived before it, blocking while an update runs or waits.

        Args:
            timeout (float | None, optional): Seconds to wait; None waits forever. Defaults to None.

        Returns:
            bool: True when admitted (call `exit_rollout` afterwards), False on timeout.
        """
        token = object()
        with self._cond:
            self._queue.append(token)
            admitted = False
            try:
                admitted = self._cond.wait_for(lambda: self._can_enter(token), timeout)
            finally:
                self._leave_queue(token, admitted)
            return admitted

    async def enter_rollout_async(self) -> None:
        """Admit one rollout from an asyncio task without blocking the event loop, in the same arrival order
        as threads.

        Cancelling the waiting task leaves the gate unchanged.
        """
        loop = asyncio.get_running_loop()
        token: object | None = object()
        with self._cond:
            self._queue.append(token)
        try:
            while True:
                future: asyncio.Future[None] = loop.create_future()
                with self._cond:
                    if self._can_enter(token):
                        self._leave_queue(token, admitted=True)  # under the same lock hold as the check
                        token = None
                        return
                    self._async_waiters.append((loop, future))
                await future
        finally:
            if token is not None:  # cancelled while waiting
                with self._cond:
                    self._leave_queue(token, admitted=False)

    def exit_rollout(self) -> None:
        """Release one admitted rollout."""
        with self._cond:
            if self._active <= 0:
                raise RuntimeError("exit_rollout called without a matching enter_rollout")
            self._active -= 1
            self._wake()

    def acquire_exclusive(self, timeout: float | None = None) -> bool:
        """Hold the gate alone for a weight update: wait for running rollouts, keep new ones out until
        `release_exclusive` (for an update that spans calls, such as a receive straight into the weights).

        Args:
            timeout (float | None, optional): Seconds to wait for running rollouts; None waits forever.
                Defaults to None.

        Returns:
            bool: True when held exclusively; False on timeout (the caller must then not touch the weights).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._updates_waiting += 1
            try:
                while self._active > 0 or self._updating:
                    remaining = None if deadline is None else deadline - time.monotonic()
                    if remaining is not None and remaining <= 0:
                        break
                    self._cond.wait(remaining)
                acquired = self._active == 0 and not self._updating
                if acquired:
                    self._updating = True
            finally:
                self._updates_waiting -= 1
                if not self._updates_waiting and not self._updating:
                    self._wake()
        return acquired

    def release_exclusive(self) -> None:
        """Let rollouts in again after `acquire_exclusive` returned True.

        Raises:
            RuntimeError: When the gate is not held exclusively.
        """
        with self._cond:
            if not self._updating:
                raise RuntimeError("release_exclusive called without a matching acquire_exclusive")
            self._updating = False
            self._wake()

    @contextlib.contextmanager
    def exclusive(self, timeout: float | None = None) -> Iterator[bool]:
        """`acquire_exclusive` for the body of a `with` block, released at its end.

        Args:
            timeout (float | None, optional): Seconds to wait for running rollouts; None waits forever.
                Defaults to None.

        Yields:
            bool: True when held exclusively; False on timeout (the body must then not touch the weights).
        """
        acquired = self.acquire_exclusive(timeout)
        try:
            yield acquired
        finally:
            if acquired:
                self.release_exclusive()

    def wait_idle(self, timeout: float | None = None) -> bool:
        """Wait until no rollout and no update is in flight.

        Args:
            timeout (float | None, optional): Seconds to wait; None waits forever. Defaults to None.

        Returns:
            bool: True when idle, False on timeout.
        """
        with self._cond:
            return self._cond.wait_for(lambda: self._active == 0 and not self._updating, timeout)


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
