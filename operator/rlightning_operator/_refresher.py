"""Debounced passes triggered by changes of children (a Job's or StatefulSet's status, a deleted child) and
of their pods.

A burst of child events for one PolicyGroup (1000 evaluator pods becoming ready) coalesces into one pass after
`delay` seconds, and passes of one group start at least `interval` seconds apart (pods that become ready one by one
over a minute cost a pass every `interval`, not one each). A pass is a whole reconcile when a child was deleted,
else a status refresh (read the Job and the StatefulSet, write status), which reconciles whole by itself when either
differs from what the spec asks (spec hash, owner, replicas): so a child the operator has just created or patched
costs no second round of reads of every child. Each pass takes the PolicyGroup as its watch last delivered it, never
older than the operator's own last status write and read once the pass holds the group's lock
(`Reconciler.refresh`, `read_group`), so a pass reads it only when the watch has not delivered it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
from collections.abc import Callable, Hashable
from typing import Any

from rlightning_operator import _kube as kube
from rlightning_operator import _metrics as metrics
from rlightning_operator import _reconcile as reconcile
from rlightning_operator import _settings

logger = logging.getLogger(__name__)


class Refresher:
    """Schedules at most one pending reconcile per PolicyGroup.

    Args:
        reconciler (reconcile.Reconciler): Does the work (in a thread: it blocks on the API).
        delay (float): Seconds to wait for more events before reconciling.
        interval (float, optional): Least seconds between the starts of two passes of one PolicyGroup, whatever
            asked for them (an event, a retry, a recheck). Defaults to 0.
        executor (concurrent.futures.Executor | None, optional): Threads for reconciles, shut down by `close`;
            None for the event loop's default executor. Defaults to None.
    """

    def __init__(
        self, reconciler: reconcile.Reconciler, delay: float, interval: float = 0.0,
        executor: concurrent.futures.Executor | None = None,
    ) -> None:
        self._reconciler = reconciler
        self._delay = delay
        self._interval = interval
        self._last_start: dict[tuple[str, str], float] = {}  # loop time each group's last pass started
        self._executor = executor
        self._pending: dict[tuple[str, str], asyncio.Task[None]] = {}
        self._due: dict[tuple[str, str], tuple[float, int]] = {}  # each pending pass's loop time to start, attempt
        self._full: set[tuple[str, str]] = set()
        self._seen: dict[str, tuple[Hashable, Hashable]] = {}
        self._rechecks: dict[tuple[str, str], asyncio.TimerHandle] = {}
        self._by_recheck: set[tuple[str, str]] = set()  # pending passes a recheck scheduled (no event), for metrics
        self._loop = asyncio.get_running_loop()  # made on the operator's event loop; `recheck` may come from threads

    def notify(
        self,
        namespace: str,
        name: str,
        uid: str,
        fingerprint: tuple[Hashable, Hashable],
        deleted: bool,
        child: bool = True,
        unseen: tuple[Hashable, Hashable] | None = None,
    ) -> bool:
        """A child of PolicyGroup `namespace/name` changed: schedule a pass unless nothing relevant did.

        Args:
            namespace (str): Namespace of the PolicyGroup.
            name (str): Its name.
            uid (str): The child's metadata.uid.
            fingerprint (tuple[Hashable, Hashable]): What the status and the plan read of the child
                (`status.child_fingerprint`, `status.pod_fingerprint`); an event that leaves it equal is dropped.
            deleted (bool): The child is gone (a DELETED event).
            child (bool, optional): A child the planner manages (Job, StatefulSet), whose deletion needs a whole
                reconcile; False for a pod, whose changes (even its deletion) need only a status refresh. Defaults
                to True.
            unseen (tuple[Hashable, Hashable] | None, optional): What an object seen for the first time counts as
                having had (`status.QUIET_POD`: a new pod with nothing to report schedules nothing); None: its
                first sight schedules a pass. Defaults to None.

        Returns:
            bool: Whether a pass was scheduled (or one was already pending).
        """
        previous = self._seen.pop(uid, unseen)
        if not deleted:
            if fingerprint != unseen:  # an absent uid counts as `unseen`: a settled pod's costs no entry
                self._seen[uid] = fingerprint
            if previous == fingerprint:
                return False
        self.schedule(namespace, name, full=child and deleted)
        return True

    def schedule(
        self, namespace: str, name: str, delay: float | None = None, attempt: int = 0, full: bool = True
    ) -> None:
        """Refresh PolicyGroup `namespace/name` soon, unless a pass is already pending (which `full` upgrades, and
        which is brought forward when it is a retry waiting out its backoff and this call has no `delay` of its own).

        Must be called from the operator's event loop (kopf's async handlers run there).

        Args:
            namespace (str): Namespace of the PolicyGroup.
            name (str): Its name (the child's contract.LABEL_GROUP label).
            delay (float | None, optional): Seconds to wait; None for the configured delay. Defaults to None.
            attempt (int, optional): Failed attempts so far (selects the backoff). Defaults to 0.
            full (bool, optional): A whole reconcile rather than a status refresh. Defaults to True.
        """
        key = (namespace, name)
        if full:
            self._full.add(key)
        wait = self._delay if delay is None else delay
        last = self._last_start.get(key)
        if last is not None:
            wait = max(wait, last + self._interval - self._loop.time())
        due = self._loop.time() + wait
        if key in self._pending:
            pending_due, pending_attempt = self._due[key]
            if delay is not None or pending_due <= due:
                return
            # An event while a retry waits out its backoff (an API server that was down): the watch that delivered
            # it answers again, so the retry runs now, not up to a minute later with this event's pass held behind it.
            self._pending.pop(key).cancel()
            attempt = pending_attempt
        self._due[key] = (due, attempt)
        self._pending[key] = asyncio.get_running_loop().create_task(self._run(key, wait, attempt))

    def recheck(self, namespace: str, name: str, delay: float) -> None:
        """Refresh the status of PolicyGroup `namespace/name` in `delay` seconds even if no event comes (a condition
        that turns with time); replaces the recheck scheduled before. Safe to call from any thread.

        Args:
            namespace (str): Namespace of the PolicyGroup.
            name (str): Its name.
            delay (float): Seconds from now.
        """
        self._loop.call_soon_threadsafe(self._arm, (namespace, name), delay)

    def _arm(self, key: tuple[str, str], delay: float) -> None:
        previous = self._rechecks.pop(key, None)
        if previous is not None:
            previous.cancel()
        self._rechecks[key] = self._loop.call_later(delay, self._recheck_due, key)

    def _recheck_due(self, key: tuple[str, str]) -> None:
        self._rechecks.pop(key, None)
        if key not in self._pending:
            self._by_recheck.add(key)
        self.schedule(*key, full=False)

    async def _run(self, key: tuple[str, str], delay: float, attempt: int) -> None:
        await asyncio.sleep(delay)
        del self._pending[key], self._due[key]  # events from now on schedule another pass
        started = self._last_start[key] = self._loop.time()
        self._loop.call_later(self._interval, self._forget_start, key, started)
        full = key in self._full
        self._full.discard(key)
        by_recheck = key in self._by_recheck
        self._by_recheck.discard(key)
        namespace, name = key
        metrics.RECONCILES.labels(trigger="child" if full else "recheck" if by_recheck else "child-status").inc()
        try:
            outcome = await self._in_thread(self._reconciler.refresh, namespace, name, full)
            if outcome is None:
                return
            if outcome.recheck_seconds is not None:
                self.recheck(namespace, name, outcome.recheck_seconds)
            if outcome.blocked:
                self._retry(namespace, name, attempt, f"waiting for {', '.join(outcome.blocked)}")
        except reconcile.InvalidSpecError:
            metrics.RECONCILE_ERRORS.labels(trigger="child", error="invalid").inc()  # reported by the status
        except kube.ApiError as error:
            kind = "transient" if isinstance(error, kube.TransientApiError) else "permanent"
            metrics.RECONCILE_ERRORS.labels(trigger="child", error=kind).inc()
            self._retry(namespace, name, attempt, str(error))
        except Exception:  # never let one strange object stop the refreshes of the others
            metrics.RECONCILE_ERRORS.labels(trigger="child", error="unexpected").inc()
            logger.exception("refresh of %s/%s failed", namespace, name)

    def _forget_start(self, key: tuple[str, str], started: float) -> None:
        """Drop a pass's start once it no longer holds back the next (unless a later pass replaced it), so that
        groups deleted long ago leave nothing behind.
        """
        if self._last_start.get(key) == started:
            del self._last_start[key]

    def _retry(self, namespace: str, name: str, attempt: int, why: str) -> None:
        delay = _settings.retry_delay(attempt)
        logger.info("reconciling %s/%s again in %.0f s: %s", namespace, name, delay, why)
        self.schedule(namespace, name, delay=delay, attempt=attempt + 1)

    async def _in_thread(self, function: Callable[..., Any], *args: Any) -> Any:
        # Copy the context: kopf's event posting reads its context variables in the worker thread.
        call = functools.partial(contextvars.copy_context().run, function, *args)
        return await asyncio.get_running_loop().run_in_executor(self._executor, call)

    async def close(self) -> None:
        """Cancel pending refreshes and rechecks and stop the executor (at operator shutdown)."""
        for handle in self._rechecks.values():
            handle.cancel()
        self._rechecks.clear()
        tasks = list(self._pending.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._pending.clear()
        self._due.clear()
        if self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
