"""Child-triggered reconciles are debounced per PolicyGroup and retried after API errors."""

from __future__ import annotations

import asyncio
import threading

from rlightning_operator import _kube as kube
from rlightning_operator._reconcile import Outcome
from rlightning_operator._refresher import Refresher


class FakeReconciler:
    def __init__(self, failures=0, exists=True, blocked=0):
        self.calls = []
        self.failures = failures
        self.blocked = blocked
        self.exists = exists
        self.forgotten = []
        self.lock = threading.Lock()

    def read_group(self, namespace, name):
        return {"metadata": {"namespace": namespace, "name": name}} if self.exists else None

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

    def forget(self, namespace, name):
        self.forgotten.append((namespace, name))


def test_a_burst_of_events_costs_one_reconcile_per_group():
    reconciler = FakeReconciler()

    async def scenario():
        refresher = Refresher(reconciler, delay=0.2)
        for _ in range(100):
            refresher.schedule("ns", "a")
            refresher.schedule("ns", "b")
            await asyncio.sleep(0)
        await asyncio.sleep(0.6)
        refresher.schedule("ns", "a")  # an event after the first pass gets a pass of its own
        await asyncio.sleep(0.6)
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert sorted(reconciler.calls) == ["a", "a", "b"]


def test_transient_errors_are_retried(monkeypatch):
    monkeypatch.setattr("rlightning_operator._refresher.RETRY_DELAYS_SECONDS", (0.05,))
    reconciler = FakeReconciler(failures=2)

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        refresher.schedule("ns", "a")
        await asyncio.sleep(0.5)
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == ["a", "a", "a"]


def test_blocked_children_are_looked_at_again(monkeypatch):
    monkeypatch.setattr("rlightning_operator._refresher.RETRY_DELAYS_SECONDS", (0.05,))
    reconciler = FakeReconciler(blocked=2)

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        refresher.schedule("ns", "a")
        await asyncio.sleep(0.5)
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == ["a", "a", "a"], "two blocked passes, then one that is not"


def test_a_deleted_group_is_forgotten():
    reconciler = FakeReconciler(exists=False)

    async def scenario():
        refresher = Refresher(reconciler, delay=0.01)
        refresher.schedule("ns", "gone")
        await asyncio.sleep(0.2)
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    assert reconciler.calls == [] and reconciler.forgotten == [("ns", "gone")]


def test_irrelevant_child_changes_trigger_nothing_and_progress_only_a_status_refresh():
    from rlightning_operator._status import child_fingerprint

    reconciler = FakeReconciler()
    sts = {"kind": "StatefulSet", "metadata": {"uid": "s"}, "spec": {"replicas": 3},
           "status": {"replicas": 3, "readyReplicas": 2, "availableReplicas": 1}}

    async def scenario():
        refresher = Refresher(reconciler, delay=0.05)
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        await asyncio.sleep(0.2)
        sts["status"]["availableReplicas"] = 2  # not read by status or planner
        assert not refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        sts["status"]["readyReplicas"] = 3
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=False)
        await asyncio.sleep(0.2)
        assert refresher.notify("ns", "a", "s", child_fingerprint(sts), deleted=True)
        await asyncio.sleep(0.2)
        await refresher.close()

    asyncio.run(asyncio.wait_for(scenario(), timeout=10))
    # first sight: a reconcile; readyReplicas moved: a status refresh; deleted: a reconcile
    assert reconciler.calls == ["a", ("status", "a"), "a"]
