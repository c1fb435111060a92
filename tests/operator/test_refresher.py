"""Child-triggered reconciles are debounced per PolicyGroup and retried after API errors."""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import tracemalloc

import prometheus_client
import pytest

from rlightning_operator import _kube as kube
from rlightning_operator._reconcile import Outcome
from rlightning_operator._refresher import Refresher


class FakeReconciler:
    def __init__(self, failures=0, exists=True, blocked=0):
        self.calls = []
        self.failures = failures
        self.blocked = blocked
        self.exists = exists
        self.lock = threading.Lock()

    def refresh(self, namespace, name, full):
        if not self.exists:
            return None
        body = {"metadata": {"namespace": namespace, "name": name}}
        return self.reconcile(body) if full else self.refresh_status(body)

    def reconcile(self, body):
        with self.lock:
            self.calls.append(body["metadata"]["name"])
            if self.failures:
                self.failures -= 1
                raise kube.TransientApiError("get", "/x", 503, "unavailable")
            blocked = ["ConfigMap/a-spec"] if self.blocked else []
            self.blocked = max(0, self.blocked - 1)
            return Outcome(actions=[], status={}, status_written=False, blocked=blocked)

    def refresh_status(self, body):
        with self.lock:
            self.calls.append(("status", body["metadata"]["name"]))
        return Outcome(actions=[], status={}, status_written=False)


async def _settled(timeout: float = 5.0) -> None:
    """Wait until no refresh pass is pending, running or scheduled for a retry (bounded).

    A pass schedules its retry before it ends, so once no `Refresher._run` task is alive nothing more happens
    without a new event: what the reconciler saw by then is all it will see.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while any(task.get_coro().__qualname__ == "Refresher._run" for task in asyncio.all_tasks() if not task.done()):
        assert loop.time() < deadline, f"refresh passes still running after {timeout} s"
        await asyncio.sleep(0.01)


def test_a_burst_of_events_costs_one_reconcile_per_group():
    reconciler = FakeReconciler()

    async def scenario():
        refresher = Refresher(reconciler, delay=0.2)
        for _ in range(100):
            refresher.schedule("ns", "a")
            refresher.schedule("ns", "b")
            await asyncio.sleep(0)
        await _settled()
        refresher.schedule("ns", "a")  # an event after the first pass gets a pass of its own
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert sorted(reconciler.calls) == ["a", "a", "b"]


class InlineExecutor(concurrent.futures.Executor):
    """Runs each pass at once on the caller's thread (the event loop's): its start is then timed where the refresher
    times it, with no hop to a worker thread, which load can stretch at one end of a gap and not the other."""

    def submit(self, fn, /, *args, **kwargs):
        future: concurrent.futures.Future = concurrent.futures.Future()
        try:
            future.set_result(fn(*args, **kwargs))
        except Exception as error:  # handed to the awaiting pass, as a pool's future would
            future.set_exception(error)
        return future


def test_passes_of_one_group_start_an_interval_apart_and_the_first_waits_only_the_delay():
    reconciler, starts = FakeReconciler(), []
    original = reconciler.refresh_status
    interval = 1.0

    def timed(body):
        starts.append((body["metadata"]["name"], loop.time()))
        return original(body)

    reconciler.refresh_status = timed

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01, interval=interval, executor=InlineExecutor())
        first = loop.time()
        for _ in range(3):  # pods of group "a" becoming ready one by one, each change after the previous pass
            refresher.schedule("ns", "a", full=False)
            await _settled()
        refresher.schedule("ns", "b", full=False)  # another group is not held back by "a"
        await _settled()
        deadline = loop.time() + interval + 5.0
        while refresher._last_start:  # a start is forgotten once it holds nothing back
            assert loop.time() < deadline, refresher._last_start
            await asyncio.sleep(0.05)
        await refresher.close()
        return first

    loop = asyncio.new_event_loop()
    try:
        first = loop.run_until_complete(asyncio.wait_for(scenario(), timeout=20))
    finally:
        loop.close()
    a = [t for name, t in starts if name == "a"]
    b = [t for name, t in starts if name == "b"]
    assert len(a) == 3 and len(b) == 1, starts
    # Timed on the loop, each pass starts no earlier than its timer: a gap below the interval is a defect, never
    # load. Load only delays a start: a first pass or another group's that waited the interval would start at least
    # 1 s late; the bound, 0.5 s, is 50 times the 10 ms delay.
    gaps = [later - earlier for earlier, later in zip(a, a[1:], strict=False)]
    assert all(gap >= interval - 0.001 for gap in gaps), gaps  # without the interval a gap is about 0.02 s
    assert a[0] - first < interval / 2, "the first change waits the delay, not the interval"
    assert b[0] - a[-1] < interval / 2, "the interval is per group"


def _one_pass(reconciler, name):
    """Schedule one pass for `ns/name` with a 10 ms debounce and wait until it and its retries are done."""

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        refresher.schedule("ns", name)
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    return reconciler.calls


@pytest.mark.parametrize(("reconciler", "why"), [
    (FakeReconciler(failures=2), "two transient API errors, then success"),
    (FakeReconciler(blocked=2), "two blocked passes, then one that is not"),
], ids=["transient-errors", "blocked-children"])
def test_failed_and_blocked_passes_are_retried(monkeypatch, reconciler, why):
    monkeypatch.setattr("rlightning_operator._settings.RETRY_DELAYS_SECONDS", (0.05,))
    assert _one_pass(reconciler, "a") == ["a", "a", "a"], why


def test_an_event_brings_forward_a_retry_that_waits_out_its_backoff(monkeypatch):
    # An API server down long enough leaves a group's retry a minute away; the first event after it answers again
    # runs the pass at once, instead of being held behind that retry.
    monkeypatch.setattr("rlightning_operator._settings.RETRY_DELAYS_SECONDS", (60.0,))
    reconciler = FakeReconciler(failures=1)

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        refresher.schedule("ns", "a")
        while reconciler.calls != ["a"] or ("ns", "a") not in refresher._pending:  # failed; its retry waits
            await asyncio.sleep(0.01)
        refresher.schedule("ns", "a")  # an event
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == ["a", "a"]


def test_a_deleted_group_is_left_alone():
    reconciler = FakeReconciler(exists=False)
    assert _one_pass(reconciler, "gone") == []


def test_irrelevant_child_changes_trigger_nothing_and_progress_only_a_status_refresh():
    from rlightning_operator._status import child_fingerprint

    reconciler = FakeReconciler()
    sts = {"kind": "StatefulSet", "metadata": {"uid": "s"}, "spec": {"replicas": 3},
           "status": {"replicas": 3, "readyReplicas": 2, "availableReplicas": 1}}

    async def scenario():
        refresher = Refresher(reconciler, delay=0.05)
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        await _settled()
        sts["status"]["availableReplicas"] = 2  # not read by status or planner
        assert not refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        sts["status"]["readyReplicas"] = 3
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        await _settled()
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=True)
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    # first sight (the child just created) and readyReplicas moved: status refreshes (which reconcile whole by
    # themselves when the child differs from the spec); deleted: a reconcile
    assert reconciler.calls == [("status", "a"), ("status", "a"), "a"]


def test_a_new_pod_with_nothing_to_report_schedules_nothing():
    from rlightning_operator._status import QUIET_POD, pod_fingerprint

    reconciler = FakeReconciler()
    crashing = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "eval", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}

    async def scenario():
        refresher = Refresher(reconciler, delay=0.05)
        pending = {"metadata": {"name": "p"}, "status": {"phase": "Pending"}}
        assert not refresher.notify("ns", "a", "p", pod_fingerprint(pending), deleted=False, child=False,
                                    unseen=QUIET_POD)
        assert refresher.notify("ns", "a", "q", pod_fingerprint(crashing), deleted=False, child=False,
                                unseen=QUIET_POD), "first seen crash-looping (the operator restarted)"
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == [("status", "a")]


def test_quiet_pods_cost_the_refresher_no_memory():
    """What the refresher remembers grows with pods that have something to report, not with pods: 10,000 settled
    pods (their events, then a crash loop and its recovery in one of them) leave it holding nothing."""
    from rlightning_operator._status import QUIET_POD, pod_fingerprint

    crashing = {"status": {"phase": "Running", "containerStatuses": [
        {"name": "eval", "ready": False, "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}}}]}}
    ready = {"status": {"phase": "Running", "containerStatuses": [{"name": "eval", "ready": True}]}}

    async def scenario():
        refresher = Refresher(FakeReconciler(), delay=60)
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot()
            for index in range(10_000):
                assert not refresher.notify("ns", "a", f"uid-{index:05d}", pod_fingerprint(ready), deleted=False,
                                            child=False, unseen=QUIET_POD)
            assert refresher.notify("ns", "a", "uid-00000", pod_fingerprint(crashing), deleted=False, child=False,
                                    unseen=QUIET_POD)
            assert refresher.notify("ns", "a", "uid-00000", pod_fingerprint(ready), deleted=False, child=False,
                                    unseen=QUIET_POD), "the recovery is news"
            grown = sum(stat.size_diff for stat in tracemalloc.take_snapshot().compare_to(before, "filename")
                        if stat.traceback[0].filename.endswith("_refresher.py"))
        finally:
            tracemalloc.stop()
        await refresher.close()
        return grown

    grown = asyncio.run(asyncio.wait_for(scenario(), timeout=30))
    assert grown < 10_000, f"{grown} bytes held for 10,000 quiet pods"


class RecheckingReconciler(FakeReconciler):
    """Its status passes ask for a recheck (a condition that turns with time) `rechecks` times."""

    def __init__(self, rechecks):
        super().__init__()
        self.rechecks = rechecks

    def refresh_status(self, body):
        with self.lock:
            self.calls.append(("status", body["metadata"]["name"]))
            again = 0.02 if self.rechecks else None
            self.rechecks = max(0, self.rechecks - 1)
        return Outcome(actions=[], status={}, status_written=False, recheck_seconds=again)


def _rechecks_counted() -> float:
    return prometheus_client.REGISTRY.get_sample_value("rlightning_operator_reconciles_total",
                                                       {"trigger": "recheck"}) or 0.0


def test_a_pass_that_waits_on_time_is_rechecked_without_an_event():
    reconciler = RecheckingReconciler(rechecks=2)
    counted = _rechecks_counted()

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        await asyncio.to_thread(refresher.recheck, "ns", "a", 0.02)  # from a handler's thread
        refresher.recheck("ns", "a", 0.02)  # replaces the one before: still one pass
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 5
        while len(reconciler.calls) < 3:  # the first pass, then the two rechecks it asked for
            assert loop.time() < deadline, reconciler.calls
            await asyncio.sleep(0.01)
        await _settled()
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == [("status", "a")] * 3
    assert _rechecks_counted() - counted == 3, "every pass came from a recheck, none from an event"
