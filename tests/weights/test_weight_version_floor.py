"""The weight version survives a trainer restart without its checkpoint, a trainer of an older attempt is fenced,
and waiting for a sender is quiet.

Real receiver processes over gloo on 127.0.0.1. Ports: WEIGHTS_VERSION_FLOOR of tests/_ports.py, one per test.
"""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import re
import signal
import time
import types

import pytest
import torch
from wsync_helpers import BUCKET_BYTES, applied_versions, start_receiver, stop, wait_members, wait_reports, weights_for

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender, WeightSyncError, mismatched_digests, tensor_digests
from rlightning.weights import _membership, _store
from rlightning.weights._membership import Member
from tests._ports import WEIGHTS_VERSION_FLOOR

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

torch.set_num_threads(1)
TIMEOUT = 5.0


def config() -> WeightSyncConfig:
    return WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=2, timeout_seconds=TIMEOUT)






def _first_sender(port: int, ordinals: set[int], versions: list[int], epoch: int = 0) -> None:
    """A trainer (of attempt `epoch`) resumed from a checkpoint that published `versions` to `ordinals`, then went
    away (its store with it)."""
    sender = WeightSender(config(), "127.0.0.1", port, version=versions[0] - 1, epoch=epoch)
    try:
        wait_members(sender, ordinals)
        for version in versions:
            stats = sender.publish(weights_for(version))
            assert (stats.version, stats.receivers_acked) == (version, sorted(ordinals))
    finally:
        sender.close()


def _ended(procs: list) -> list[list[int]]:
    """Stop the receiver processes; the versions each applied (what it printed after what a test read)."""
    for p in procs:
        p.terminate()
    stop(procs)
    return [applied_versions(p) for p in procs]


def _applied(sender: WeightSender, ordinals: set[int], version: int, weights_version: int) -> None:
    reports = wait_reports(sender, lambda r: all(o in r and r[o].applied.version == version for o in ordinals))
    for ordinal in ordinals:
        assert reports[ordinal].applied.version == version
        assert mismatched_digests(tensor_digests(weights_for(weights_version)), reports[ordinal].applied.digest) == []


@pytest.mark.timeout(150)
def test_sender_restarted_from_version_zero_publishes_above_the_fleet_and_its_close_is_quiet(procs):
    port = WEIGHTS_VERSION_FLOOR.port(0)
    procs += [start_receiver(port, o, "--log", "--keep-after-close", lifetime=60.0) for o in (0, 1)]
    _first_sender(port, {0, 1}, [5])
    # the trainer comes back without its checkpoint (an emptyDir): its own version is 0
    sender = WeightSender(config(), "127.0.0.1", port)  # on the port the previous sender freed in `close`
    try:
        assert sender.version == 0
        wait_members(sender, {0, 1})  # they re-register, carrying the version they hold
        assert sender.fleet_version == 5
        stats = sender.publish(weights_for(1))
        assert stats.version == sender.version == 6 and stats.receivers_acked == [0, 1] and stats.failed == {}
        _applied(sender, {0, 1}, 6, weights_version=1)
        assert sender.publish(weights_for(7)).version == 7  # the sender's own next version
        _applied(sender, {0, 1}, 7, weights_version=7)
    finally:
        sender.close()
    assert _ended(procs) == [[5, 6, 7], [5, 6, 7]]
    for proc in procs:  # the receivers dropped the store at each close: no call of theirs was cut off by it
        err = proc.stderr.read()  # (a lost DNS reply's own c10d warning has nothing to do with the close)
        cut_off = [line for line in _c10d_lines(err) if "cannot be retrieved" not in line]
        assert "the sender closed" in err and cut_off == []


@pytest.mark.timeout(150)
def test_late_evaluator_with_a_newer_version_makes_the_sender_jump_above_it(procs):
    port = WEIGHTS_VERSION_FLOOR.port(1)
    late = start_receiver(port, 1, "--keep-after-close", lifetime=60.0)
    procs.append(late)
    _first_sender(port, {1}, [5, 6])
    os.kill(late.pid, signal.SIGSTOP)  # holds 6; cannot re-register with the next trainer yet
    procs.append(start_receiver(port, 0, "--keep-after-close", lifetime=60.0))  # a fresh evaluator: version 0
    sender = WeightSender(config(), "127.0.0.1", port)  # on the port the previous sender freed in `close`
    try:
        wait_members(sender, {0})
        assert sender.fleet_version == 0
        assert sender.publish(weights_for(1)).version == 1
        _applied(sender, {0}, 1, weights_version=1)
        os.kill(late.pid, signal.SIGCONT)
        wait_members(sender, {0, 1})
        assert sender.fleet_version == 6
        stats = sender.publish(weights_for(2))  # evaluator 1 would refuse 2: the sender publishes 7
        assert stats.version == sender.version == 7 and stats.receivers_acked == [0, 1]
        _applied(sender, {0, 1}, 7, weights_version=2)
    finally:
        sender.close()
    assert _ended(procs) == [[5, 6, 7], [1, 7]]  # the late evaluator, then the fresh one


def _until_event(proc, event: str, timeout: float = 60.0) -> tuple[dict, list[int]]:
    """Read `proc`'s JSON lines (bounded) up to the first of `event`; return it and the versions applied before.

    Read in a thread: `select` on the pipe misses lines already in the file object's buffer.
    """
    assert proc.stdout is not None
    applied: list[int] = []

    def read() -> dict:
        for line in proc.stdout:
            got = json.loads(line)
            if got["event"] == event:
                return got
            if got["event"] == "applied":
                applied.append(got["applied"])
        raise AssertionError(f"receiver pid {proc.pid} exited before printing {event!r}")

    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(read).result(timeout), applied


@pytest.mark.timeout(150)
def test_a_trainer_of_an_older_attempt_cannot_publish_to_receivers_that_took_a_newer_one(procs):
    port = WEIGHTS_VERSION_FLOOR.port(6)
    procs += [start_receiver(port, o, "--keep-after-close", lifetime=120.0) for o in (0, 1)]
    _first_sender(port, {0, 1}, [5], epoch=1)  # attempt 1 of the trainer gang
    # a pod of attempt 0 comes back (a partition healed) and reaches the evaluators, at a higher version
    zombie = WeightSender(config(), "127.0.0.1", port, version=8, epoch=0)
    try:
        wait_members(zombie, {0, 1})
        with pytest.raises(WeightSyncError) as refused:
            zombie.publish(weights_for(9))
        assert refused.value.stats.version == 9 and refused.value.stats.receivers_acked == []
        assert refused.value.stats.failed == {0: [0, 1]}
        assert ("ordinal 1 refused the publish: publish 1 of epoch 0 (weight version 9) refused: epoch 1 was seen; "
                "holding weight version 5 of epoch 1") in str(refused.value)
    finally:
        zombie.close()
    held = tensor_digests(weights_for(5))
    for proc in procs:
        event, applied = _until_event(proc, "refused")
        assert applied == [5] and (event["version"], event["epoch"]) == (5, 1)  # what its batches are stamped with
        assert mismatched_digests(held, event["digests"]) == []  # epoch 1's weights, bit for bit
    _first_sender(port, {0, 1}, [6], epoch=1)  # attempt 1's trainer again: taken
    assert _ended(procs) == [[6], [6]]


def test_membership_keeps_the_highest_version_receivers_joined_with():
    members = _membership.Membership()
    members.join(Member(0, "a"))  # a receiver that holds no version yet
    assert members.highest_version == 0
    members.join(Member(1, "b"), version=9)
    members.join(Member(0, "c"), version=4)
    members.evict(1, "b")  # its leave
    assert members.highest_version == 9  # a floor: it never goes down
    assert members.members == {0: Member(0, "c")}


@pytest.mark.timeout(60)
def test_waiting_for_an_absent_sender_logs_info_lines_and_no_c10d_errors(procs):
    port = WEIGHTS_VERSION_FLOOR.port(2)  # nothing listens here
    procs.append(start_receiver(port, 0, "--log", "--keep-after-close", lifetime=4.0))
    out, err = procs[0].communicate(timeout=40)
    assert procs[0].returncode == 0, err
    assert '"event": "exit"' in out
    waiting = [line for line in err.splitlines() if "not reachable yet" in line]
    assert waiting and all(line.startswith("INFO ") for line in waiting)
    # refused attempts come 0.1 s apart, kept across the receiver's 1 s `receive` calls, and are logged at attempts
    # 1, 2, 4, 8, ...: a 4 s hold makes at most 40 or so, 6 lines
    assert 2 <= len(waiting) <= 8, waiting
    assert _c10d_lines(err) == []


def _c10d_lines(log: str) -> list[str]:
    """The lines of torch's C++ store client in a receiver's stderr (a warning and its stack trace per failed call)."""
    return [line for line in log.splitlines() if "c10d" in line or "TCPStore" in line or "socket.cpp" in line]


def test_connect_store_gives_up_at_its_deadline_and_keeps_backing_off(caplog):
    backoff = _store.Backoff()
    port = WEIGHTS_VERSION_FLOOR.port(3)  # nothing listens here
    attempts = []
    with caplog.at_level(logging.INFO, logger=_store.__name__):
        for _ in range(2):
            start = time.monotonic()
            with pytest.raises(TimeoutError, match=f"{port} unreachable"):
                _store.connect_store("127.0.0.1", port, 1.0, time.monotonic() + 0.5, backoff)
            assert time.monotonic() - start >= 0.45  # it waits out its deadline
            attempts.append(backoff.attempt)
    # refused: `REFUSED_CAP` (0.1 s) apart, so at most 6 in each 0.5 s call (load only makes fewer; a busy loop makes
    # thousands), at least the first of each; the count carried across the calls; logged at attempts 1, 2, 4, 8, ...
    assert 1 <= attempts[0] <= 6 and attempts[0] + 1 <= attempts[1] <= attempts[0] + 6, attempts
    logged = [int(re.search(r"attempt (\d+):", r.getMessage())[1]) for r in caplog.records
              if "not reachable yet" in r.getMessage()]  # fmt: skip
    assert logged == [n for n in range(1, backoff.attempt + 1) if n & (n - 1) == 0], logged


def test_spare_connections_outlive_an_absent_store_and_take_is_bounded():
    port = WEIGHTS_VERSION_FLOOR.port(4)
    # what `SpareConnections` connects to: nothing listens on the address yet (a sender restarting)
    address = types.SimpleNamespace(host="127.0.0.1", port=port)
    spares = _store.SpareConnections(address, 2, TIMEOUT)
    try:
        start = time.monotonic()
        with pytest.raises(RuntimeError, match="no weight-sync store connection ready within 0.3 s"):
            spares.take(0.3)
        assert 0.25 <= time.monotonic() - start < 2.0
        assert not spares.wait_ready(0.5)

        store = _store.host_store(port, TIMEOUT)  # the sender is back: the failed attempts were retried
        assert spares.wait_ready(_store.CONNECT_BOUND + 5.0)
        taken = [spares.take(0.0), spares.take(_store.CONNECT_BOUND)]  # the second is reopened after the first
        taken[0].set("k", b"v")
        assert taken[1].get("k") == b"v" and store.get("k") == b"v"
        spares.reserve(3)
        assert spares.wait_ready(_store.CONNECT_BOUND + 5.0)
    finally:
        spares.close()
    start = time.monotonic()
    with pytest.raises(RuntimeError, match="ready within"):
        spares.take(5.0)
    assert time.monotonic() - start < 1.0  # closed: at once


def test_a_closed_sender_frees_its_port_though_still_referenced():
    port = WEIGHTS_VERSION_FLOOR.port(5)
    sender = WeightSender(config(), "127.0.0.1", port)
    assert sender.members == []
    sender.close(linger=0.0)
    # a trainer restarting in the same process hosts its store on the same port while the old object lives on
    again = WeightSender(config(), "127.0.0.1", port)
    try:
        assert again.members == [] and again.version == 0
    finally:
        again.close(linger=0.0)
    assert sender.version == 0  # the first object is still alive here: nothing it holds may keep the port
