"""A trainer rank's intake judges each batch from a real sender process: accepted, stale or invalid, and says so.

Ports: TRAJECTORIES 0-4, 14 and 20 (one per test).
"""

from __future__ import annotations

import errno
import socket

import pytest
import zmq
from traj_helpers import SENDER, WorkerProcess, fill_until_done, is_whole

from rlightning.trajectories import BatchStamp, TrajectoryIntake, encode_batch
from rlightning.trajectories import _messages as messages
from rlightning.runtime._datasets import FleetTotals
from rlightning.runtime._rank_zero import dropped_summary
from tests._ports import TRAJECTORIES

ROWS = 4
FILL_SECONDS = 60.0
"""Bound on each fill, the start of the sender processes (which import torch) included, on a loaded machine."""


def needs_action(batch) -> str | None:
    return None if "action" in batch else "missing key 'action'"


@pytest.mark.slow  # starts processes that import torch
@pytest.mark.parametrize(("max_policy_lag", "accepted_versions"), [(0, [5, 6]), (2, [5, 4, 3, 6])])
def test_max_policy_lag_bounds_the_versions_accepted_exactly(senders, intakes, max_policy_lag, accepted_versions):
    port = TRAJECTORIES.port(0 if max_policy_lag == 0 else 1)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    # Versions 5 (lag 0), 4 (1), 3 (2), 2 (3), 6 (newer than the trainer: lag 0), 1 (4).
    sender = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--count", "6", "--versions", "5,4,3,2,6,1",
                           "--rows", str(ROWS), "--credits", "1")
    senders.append(sender)
    (done,) = fill_until_done(intake, [sender], version=5, max_policy_lag=max_policy_lag, timeout=FILL_SECONDS)
    held = intake.drain()
    expected = [v for v in (5, 4, 3, 2, 6, 1) if 5 - v <= max_policy_lag]
    assert expected == accepted_versions
    assert [stamp.version for _, stamp in held] == expected
    assert all(is_whole(batch, 0, stamp.sequence, ROWS) for batch, stamp in held)
    stale = 6 - len(expected)
    assert (intake.stats.accepted, intake.stats.stale, intake.stats.invalid) == (len(expected), stale, 0)
    assert intake.stats.lag_max == max(max(0, 5 - v) for v in expected)
    assert intake.stats.lag_sum == sum(max(0, 5 - v) for v in expected)
    assert intake.stats.env_steps == {0: ROWS * len(expected)}
    assert done["counts"] == {
        "sent": 6, "accepted": len(expected), "stale": stale, "invalid": 0, "older_attempt": 0, "lost": 0
    }


@pytest.mark.slow  # starts processes that import torch
def test_held_batches_that_became_stale_are_dropped_at_the_next_fill(senders, intakes):
    port = TRAJECTORIES.port(2)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    sender = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--count", "3", "--versions", "3,4,5")
    senders.append(sender)
    assert intake.fill(3, version=5, max_policy_lag=2, timeout=FILL_SECONDS)
    # The trainer published version 6 meanwhile: version 3 is now 3 behind.
    assert intake.fill(2, version=6, max_policy_lag=2, timeout=FILL_SECONDS)
    assert [stamp.version for _, stamp in intake.drain()] == [4, 5]
    assert (intake.stats.accepted, intake.stats.stale, intake.stats.lag_sum, intake.stats.lag_max) == (2, 1, 3, 2)


@pytest.mark.slow  # starts processes that import torch
def test_invalid_batches_are_dropped_counted_and_acknowledged(senders, intakes, caplog):
    port = TRAJECTORIES.port(3)
    intake = TrajectoryIntake(port, validate=needs_action, bind_host="127.0.0.1")
    intakes.append(intake)
    bad = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "1", "--count", "3",
                        "--omit", "action")
    senders.append(bad)
    # Raw frames a sender could put on the wire: a payload that is not a batch, and a message of one frame.
    raw: zmq.Socket[bytes] = zmq.Context.instance().socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(f"tcp://127.0.0.1:{port}")
    raw.send_multipart(messages.batch_frames(1, b"garbage"))
    raw.send_multipart([b"only-one-frame"])
    good = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "2", "--count", "2")
    senders.append(good)
    bad_done, good_done = fill_until_done(intake, [bad, good], version=0, max_policy_lag=0, timeout=FILL_SECONDS)
    assert bad_done["counts"] == {"sent": 3, "accepted": 0, "stale": 0, "invalid": 3, "older_attempt": 0, "lost": 0}
    assert good_done["counts"]["accepted"] == 2
    assert raw.poll(int(FILL_SECONDS * 1000))
    acks = [messages.parse_ack(raw.recv_multipart())]
    assert raw.poll(int(FILL_SECONDS * 1000))
    last = raw.recv_multipart()
    assert [ack[:2] for ack in acks] == [(1, messages.Outcome.INVALID)]
    assert last[:2] == [b"only-one-frame", b"invalid"] and last[2].isdigit() and int(last[2]) > 0  # room left
    raw.close()
    assert [stamp.ordinal for _, stamp in intake.drain()] == [2, 2]
    assert (intake.stats.accepted, intake.stats.invalid, intake.stats.stale) == (2, 5, 0)
    logged = [r.getMessage() for r in caplog.records if "invalid batch" in r.getMessage()]
    assert sum("evaluator 1" in m for m in logged) == 1, logged
    assert any("missing key 'action'" in m for m in logged)


@pytest.mark.slow  # starts processes that import torch
def test_batches_acted_with_an_older_attempts_weights_are_dropped_and_counted(senders, intakes, caplog):
    port = TRAJECTORIES.port(20)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1", epoch=1)  # a rank of the trainer gang's attempt 1
    intakes.append(intake)
    # Evaluator 3 acts alternately with attempt 1's weights and attempt 0's (a zombie trainer's, or weights it held
    # before attempt 1's first publish reached it), all at the current version: only the epoch tells them apart.
    sender = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "3", "--count", "4",
                           "--versions", "5", "--epochs", "1,0,1,0", "--rows", str(ROWS), "--credits", "1")
    senders.append(sender)
    (done,) = fill_until_done(intake, [sender], version=5, max_policy_lag=0, timeout=FILL_SECONDS)
    assert [(stamp.sequence, stamp.epoch) for _, stamp in intake.drain()] == [(1, 1), (3, 1)]
    assert (intake.stats.accepted, intake.stats.older_attempt, intake.stats.stale, intake.stats.invalid) == (2, 2, 0, 0)
    assert done["counts"] == {"sent": 4, "accepted": 2, "stale": 0, "invalid": 0, "older_attempt": 2, "lost": 0}
    logged = [r.getMessage() for r in caplog.records if "acted with weights of attempt 0" in r.getMessage()]
    assert len(logged) == 1 and "evaluator 3" in logged[0] and "attempt 1" in logged[0], logged
    # the run's summary gives the reason beside the others (summary.json's `dropped`)
    totals = FleetTotals({3: 2 * ROWS}, [2 * ROWS], accepted=2, stale=0, invalid=0, older_attempt=2)
    assert dropped_summary(totals, {}) == {
        "reasons": {"stale": 0, "invalid": 0, "cut_by_new_version": 0, "older_attempt": 2}, "share": 0.5
    }


def test_a_taken_port_is_a_clear_error_naming_it(intakes):
    port = TRAJECTORIES.port(4)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        with pytest.raises(OSError, match=f"port {port} is already in use") as caught:
            TrajectoryIntake(port, bind_host="127.0.0.1")
    assert caught.value.errno == errno.EADDRINUSE


def test_close_releases_the_port_at_once():
    port = TRAJECTORIES.port(14)
    for _ in range(3):  # a rank that restarts its intake in-process binds again at once
        TrajectoryIntake(port, bind_host="127.0.0.1").close()


def test_stamps_break_no_rule_silently():
    with pytest.raises(ValueError, match="stamp.ordinal"):
        BatchStamp(version=0, ordinal=-1, sequence=1, env_steps=0)
    with pytest.raises(ValueError, match="stamp.env_steps"):
        encode_batch(None, BatchStamp(version=0, ordinal=0, sequence=1, env_steps=-4))
