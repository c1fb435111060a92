"""The Lease record of the leader election (client-go's rules), on an in-memory Lease with resourceVersions."""

from __future__ import annotations

import copy

import pytest

from rlightning_operator import _kube as kube
from rlightning_operator import _leader as leader
from rlightning_operator._health import health


class LeaseStore:
    """One Lease with compare-and-swap on metadata.resourceVersion, as the API server keeps it."""

    def __init__(self):
        self.lease = None
        self.version = 0

    def read(self, kind, namespace, name, timeout=None):
        return copy.deepcopy(self.lease)

    def create(self, manifest, timeout=None):
        if self.lease is not None:
            raise kube.Conflict("create", "/leases", 409, "exists")
        return self._store(manifest)

    def replace(self, manifest, timeout=None):
        if manifest["metadata"].get("resourceVersion") != self.lease["metadata"]["resourceVersion"]:
            raise kube.PermanentApiError("replace", "/leases/x", 409, "the object has been modified")
        return self._store(manifest)

    def _store(self, manifest):
        self.version += 1
        self.lease = copy.deepcopy(manifest)
        self.lease["metadata"]["resourceVersion"] = str(self.version)
        return copy.deepcopy(self.lease)


@pytest.fixture
def clock(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(leader.time, "monotonic", lambda: now[0])
    return now


def elector(store, identity):
    return leader.LeaseElector(store, "ops", "rl", identity, lease_duration=15, renew_deadline=10, retry_period=2)


def test_one_holder_renews_and_a_standby_takes_over_only_after_the_lease_duration(clock):
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    assert a.try_acquire_or_renew()
    acquired = store.lease["spec"]["acquireTime"]
    assert not b.try_acquire_or_renew()
    clock[0] += 2
    assert a.try_acquire_or_renew()  # a renewal keeps acquireTime and the transitions
    assert store.lease["spec"]["acquireTime"] == acquired and store.lease["spec"]["leaseTransitions"] == 0
    assert not b.try_acquire_or_renew()  # b saw a new renewTime: its wait starts again
    clock[0] += 14.9
    assert not b.try_acquire_or_renew()
    clock[0] += 0.2
    assert b.try_acquire_or_renew()
    assert store.lease["spec"]["holderIdentity"] == "b" and store.lease["spec"]["leaseTransitions"] == 1


def test_the_holder_renews_with_one_request_and_reads_after_a_lost_swap(clock):
    store = LeaseStore()
    a = elector(store, "a")
    assert a.try_acquire_or_renew()
    reads = []
    read = store.read

    def counted_read(*args, **kwargs):
        reads.append(1)
        return read(*args, **kwargs)

    store.read = counted_read
    version = store.version
    clock[0] += 2
    assert a.try_acquire_or_renew() and store.version == version + 1 and reads == [], "a PUT, no GET"
    store.lease["metadata"]["resourceVersion"] = "other"  # someone else wrote it meanwhile
    clock[0] += 2
    assert a.try_acquire_or_renew() and reads == [1], "a lost swap: read, then renew"
    assert store.lease["spec"]["holderIdentity"] == "a"


def test_a_lost_race_is_no_lease(clock):
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    assert a.try_acquire_or_renew()
    stale = store.read("Lease", "ops", "rl")
    assert a.try_acquire_or_renew()
    store.read = lambda *args, **kwargs: copy.deepcopy(stale)  # b read before a's renewal landed
    clock[0] += 100
    assert not b.try_acquire_or_renew()


def test_release_empties_the_holder_so_a_standby_takes_over_at_once(clock):
    store = LeaseStore()
    a, b = elector(store, "a"), elector(store, "b")
    assert a.try_acquire_or_renew()
    a.leading = True
    assert not b.try_acquire_or_renew()
    a.release()
    assert store.lease["spec"]["holderIdentity"] == ""
    assert b.try_acquire_or_renew()


def test_liveness_fails_past_the_silence_limit():
    assert health(59.9, 60, "leader")[0]
    healthy, body = health(60.1, 60, "standby")
    assert not healthy and body["role"] == "standby" and body["apiSilenceSeconds"] == 60.1


def test_no_attempt_after_release_takes_the_lease_back(clock):
    store = LeaseStore()
    a = elector(store, "a")
    assert a.try_acquire_or_renew()
    a.leading = True
    a.release()
    clock[0] += 2
    assert not a.try_acquire_or_renew(), "a renewal still in flight at shutdown must not take the free Lease"
    assert store.lease["spec"]["holderIdentity"] == ""
