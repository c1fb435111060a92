"""The sender/receiver protocol with real receiver processes over gloo on 127.0.0.1.

Ports: WEIGHTS_SYNC of tests/_ports.py, one per test (no free-port probing).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from wsync_helpers import (
    BUCKET_BYTES,
    applied_versions,
    start_receiver,
    stop,
    wait_members,
    wait_reports,
    wait_started,
    weights_for,
)

from rlightning.config import WeightSyncConfig
from rlightning.weights import (
    WeightSender,
    WeightSyncError,
    l2_fingerprint,
    mismatched_digests,
    mismatched_fingerprints,
    tensor_digests,
)
from tests._polling import wait_for
from tests._ports import WEIGHTS_SYNC

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

torch.set_num_threads(1)
TIMEOUT = 5.0


def config(group_size: int = 2, trees: int = WeightSyncConfig().relay_trees) -> WeightSyncConfig:
    return WeightSyncConfig(
        backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=group_size, timeout_seconds=TIMEOUT,
        relay_trees=trees,
    )






@pytest.mark.timeout(120)
def test_two_receivers_started_before_sender_get_identical_weights(procs):
    port = WEIGHTS_SYNC.port(0)
    procs += [start_receiver(port, o) for o in (0, 1)]
    for proc in procs:  # receivers start first and retry with backoff
        wait_started(proc)
    sender = WeightSender(config(), "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1})
        for version in (1, 2):
            stats = sender.publish(weights_for(version))
            assert stats.receivers_acked == [0, 1]
            assert stats.version == version and stats.failed == {}
        assert stats.bytes == sum(t.numel() * t.element_size() for t in weights_for(2).values())
        assert stats.formed_groups == [] and list(stats.groups) == [0]  # the group formed by v1 is reused

        expected = weights_for(2)
        reports = wait_reports(sender, lambda r: len(r) == 2 and all(x.applied.version == 2 for x in r.values()))
        assert sorted(reports) == [0, 1]
        for ordinal, report in reports.items():
            assert report.applied.version == 2
            assert mismatched_digests(tensor_digests(expected), report.applied.digest) == []
            assert mismatched_fingerprints(l2_fingerprint(expected), report.applied.fingerprint, rtol=0) == []
            assert report.metrics == {"ordinal": float(ordinal)}
        # the state that travelled includes BatchNorm statistics, the bare Parameter and non-float buffers
        assert {"bn.running_mean", "bn.running_var", "bn.num_batches_tracked", "scale", "steps", "stats64"} <= set(
            reports[0].applied.digest
        )
        assert "scratch" not in reports[0].applied.digest  # non-persistent buffer
    finally:
        sender.close()
    stop(procs)
    assert [applied_versions(p) for p in procs] == [[1, 2], [1, 2]]


@pytest.mark.timeout(120)
def test_restarted_sender_with_older_version_publishes_above_the_fleet(procs):
    port = WEIGHTS_SYNC.port(1)
    procs.append(start_receiver(port, 0, "--keep-after-close", lifetime=30.0))
    sender = WeightSender(config(), "127.0.0.1", port, version=4)
    wait_members(sender, {0})
    assert sender.publish(weights_for(5)).version == 5
    sender.close()
    del sender
    # a trainer restarted from an older checkpoint (version 2); the receiver re-registered holding 5, which
    # would refuse 3, so the sender publishes 6 (see test_weight_version_floor.py)
    sender = WeightSender(config(), "127.0.0.1", port, version=2)
    try:
        wait_members(sender, {0})
        stats = sender.publish(weights_for(3))
        assert stats.receivers_acked == [0] and stats.version == 6
        stats = sender.publish(weights_for(7))
        assert stats.receivers_acked == [0] and stats.version == 7
        reports = wait_reports(sender, lambda r: 0 in r and r[0].applied.version == 7)
        assert reports[0].applied.version == 7
        assert mismatched_digests(tensor_digests(weights_for(7)), reports[0].applied.digest) == []
    finally:
        sender.close()
    procs[0].terminate()  # it would otherwise wait for another sender
    stop(procs)
    assert applied_versions(procs[0]) == [5, 6, 7]


@pytest.mark.timeout(120)
def test_scale_up_reforms_only_the_affected_group(procs):
    port = WEIGHTS_SYNC.port(2)
    procs += [start_receiver(port, o) for o in (0, 1)]
    sender = WeightSender(config(group_size=2), "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1})
        first = sender.publish(weights_for(1))
        assert first.formed_groups == [0] and first.receivers_acked == [0, 1]

        procs.append(start_receiver(port, 2))
        wait_members(sender, {0, 1, 2})
        second = sender.publish(weights_for(2))
        assert second.formed_groups == [1]  # group 0 is untouched
        assert second.groups[0] == first.groups[0]
        assert second.groups[1] != first.groups[0]
        assert second.receivers_acked == [0, 1, 2]

        # a restart of receiver 1 (new session) re-forms group 0 only
        procs[1].send_signal(signal.SIGTERM)
        procs[1].wait(10)
        procs.append(start_receiver(port, 1))

        def acked_by_all():  # publishes while ordinal 1 is gone may fail for group 0
            try:
                stats = sender.publish(weights_for(3))
            except WeightSyncError:
                return None
            return stats if stats.receivers_acked == [0, 1, 2] else None

        third = wait_for("a publish acknowledged by ordinals 0, 1 and 2", acked_by_all, timeout=60, interval=0.2)
        assert third.groups[1] == second.groups[1]
        assert third.groups[0] > second.groups[1]
    finally:
        sender.close()
    stop(procs)


@pytest.mark.timeout(120)
def test_leaf_killed_mid_broadcast_fails_only_itself(procs):
    port = WEIGHTS_SYNC.port(3)
    procs += [
        start_receiver(port, 0),
        start_receiver(port, 1, "--die-in-version", "2"),
        start_receiver(port, 2),
    ]
    # one tree: group 0: 0 relays to 1; group 1: 2 (with two trees 1 also relays to 0: test_weight_double_tree.py)
    sender = WeightSender(config(group_size=2, trees=1), "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1, 2})
        assert sender.publish(weights_for(1)).receivers_acked == [0, 1, 2]
        wait_reports(sender, lambda r: len(r) == 3 and all(x.applied.version == 1 for x in r.values()))

        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"group 0 \(ordinals \[1\]\)") as info:
            sender.publish(weights_for(2))
        elapsed = time.monotonic() - start
        assert elapsed < TIMEOUT + 2.0
        assert procs[1].wait(10) == -signal.SIGKILL
        assert info.value.stats.receivers_acked == [0, 2]  # its relay and the other group completed
        assert info.value.stats.failed == {0: [1]}
        reports = wait_reports(sender, lambda r: r[0].applied.version == 2 and r[2].applied.version == 2)
        for ordinal in (0, 2):
            assert mismatched_digests(tensor_digests(weights_for(2)), reports[ordinal].applied.digest) == []

        # the next version re-forms group 0 without the dead receiver
        wait_members(sender, {0, 2})
        stats = sender.publish(weights_for(3))
        assert stats.receivers_acked == [0, 2] and stats.formed_groups == [0]
        reports = wait_reports(sender, lambda r: r[0].applied.version == 3)
        assert mismatched_digests(tensor_digests(weights_for(3)), reports[0].applied.digest) == []
    finally:
        sender.close()
    stop(procs)
    assert applied_versions(procs[0]) == [1, 2, 3]
    assert applied_versions(procs[2]) == [1, 2, 3]


@pytest.mark.timeout(120)
def test_stalled_receiver_times_out_within_bound(procs):
    port = WEIGHTS_SYNC.port(4)
    procs += [start_receiver(port, 0), start_receiver(port, 2)]
    sender = WeightSender(config(group_size=2), "127.0.0.1", port)
    try:
        wait_members(sender, {0, 2})
        sender.publish(weights_for(1))
        os.kill(procs[0].pid, signal.SIGSTOP)  # alive, but never joins the next broadcast
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"group 0 \(ordinals \[0\]\)") as info:
            sender.publish(weights_for(2))
        assert time.monotonic() - start < TIMEOUT + 2.0
        assert info.value.stats.receivers_acked == [2]
        os.kill(procs[0].pid, signal.SIGCONT)  # it finds its round failed and registers again
        wait_members(sender, {0, 2})
        assert sender.publish(weights_for(3)).receivers_acked == [0, 2]
    finally:
        os.kill(procs[0].pid, signal.SIGCONT)
        sender.close()
    stop(procs)


@pytest.mark.timeout(120)
def test_group_with_an_unresponsive_member_fails_to_form_in_bounded_time_and_others_proceed(procs):
    port = WEIGHTS_SYNC.port(5)
    procs += [start_receiver(port, 0, group_size=1), start_receiver(port, 1, group_size=1)]
    sender = WeightSender(config(group_size=1), "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1})
        os.kill(procs[1].pid, signal.SIGSTOP)  # registered, then never joins its group's rendezvous
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"group 1 \(ordinals \[1\]\): forming generation") as info:
            sender.publish(weights_for(1))
        assert time.monotonic() - start < TIMEOUT + 3.0
        assert info.value.stats.receivers_acked == [0]
        assert info.value.stats.formed_groups == [0, 1]
        reports = wait_reports(sender, lambda r: 0 in r and r[0].applied.version == 1)
        assert mismatched_digests(tensor_digests(weights_for(1)), reports[0].applied.digest) == []
    finally:
        os.kill(procs[1].pid, signal.SIGCONT)
        sender.close()
    stop(procs)
