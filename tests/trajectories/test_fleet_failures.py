"""A fleet of real sender processes and one or two intakes: a killed evaluator, two ranks, a closed rank, a frozen
rank, a rank whose host does not resolve yet, and a restarted rank.

Ports: TRAJECTORIES 6-13.
"""

from __future__ import annotations

import signal
import time

import pytest
from traj_helpers import INTAKE, SENDER, WorkerProcess, fill_until_done, is_whole

from rlightning.trajectories import TrajectoryIntake
from tests._polling import wait_for
from tests._ports import TRAJECTORIES

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

EVENT_SECONDS = 60.0
LARGE_ROWS = 500_000
"""Rows of the killed evaluator's batches: 16 float32 features each, about 32 MB a batch."""


def test_an_evaluator_killed_mid_batch_yields_no_partial_batch_and_the_others_go_on(senders, intakes):
    port = TRAJECTORIES.port(6)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    large = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "1", "--count", "0",
                          "--rows", str(LARGE_ROWS), "--deadline", "120")
    small = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "2", "--count", "12",
                          "--deadline", "120")
    senders.extend([large, small])
    received: list = []
    # Read until the large evaluator got a batch through; it keeps streaming (its credits return as we read).
    deadline = time.monotonic() + EVENT_SECONDS
    while not any(stamp.ordinal == 1 for _, stamp in received):
        assert time.monotonic() < deadline, "no batch from the large evaluator"
        intake.fill(1, version=0, max_policy_lag=0, timeout=1.0)
        received.extend(intake.drain())
    # Kill it right after it handed a batch we have not read to zmq: its bytes are on the wire.
    newest = max(stamp.sequence for _, stamp in received if stamp.ordinal == 1)
    while (sent := large.next_event(EVENT_SECONDS, "sent"))["sequence"] <= newest:
        pass
    large.proc.send_signal(signal.SIGKILL)
    large.proc.wait(EVENT_SECONDS)
    (done,) = fill_until_done(intake, [small], version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
    received.extend(intake.drain())
    for batch, stamp in received:
        rows = LARGE_ROWS if stamp.ordinal == 1 else 4
        assert is_whole(batch, stamp.ordinal, stamp.sequence, rows), (stamp.ordinal, stamp.sequence)
    from_large = [stamp.sequence for _, stamp in received if stamp.ordinal == 1]
    assert len(from_large) == len(set(from_large)), "a batch was counted twice"
    assert max(from_large) <= sent["sequence"]
    print(f"killed after handing batch {sent['sequence']} to zmq; whole batches received from it: {from_large}")
    assert sorted(stamp.sequence for _, stamp in received if stamp.ordinal == 2) == list(range(1, 13))
    assert done["counts"]["accepted"] == 12
    assert intake.stats.invalid == 0
    assert intake.stats.env_steps == {1: LARGE_ROWS * len(from_large), 2: 4 * 12}


def test_two_ranks_both_receive_from_one_sender(senders, intakes):
    ports = TRAJECTORIES.port(7), TRAJECTORIES.port(8)
    ranks = [TrajectoryIntake(port, bind_host="127.0.0.1") for port in ports]
    intakes.extend(ranks)
    sender = WorkerProcess(SENDER, "--endpoints", ",".join(f"127.0.0.1:{port}" for port in ports), "--count", "0",
                           "--deadline", "120")
    senders.append(sender)

    def three_each() -> bool:
        if min(rank.stats.accepted + rank.held for rank in ranks) >= 3:
            return True
        for rank in ranks:
            rank.fill(rank.held + 1, version=0, max_policy_lag=0, timeout=0.2)
        return False

    wait_for("3 batches at each rank", three_each, EVENT_SECONDS, interval=0,
             explain=lambda: f"held {[rank.held for rank in ranks]}")
    sequences = [{stamp.sequence for _, stamp in rank.drain()} for rank in ranks]
    assert not sequences[0] & sequences[1], "one batch went to both ranks"


def test_a_closed_rank_sends_everything_to_the_other_within_the_ack_timeout(senders, intakes):
    ports = TRAJECTORIES.port(9), TRAJECTORIES.port(10)
    alive, closing = (TrajectoryIntake(port, bind_host="127.0.0.1") for port in ports)
    intakes.append(alive)
    ack_timeout, sender_credits, count = 2.0, 2, 40
    sender = WorkerProcess(SENDER, "--endpoints", ",".join(f"127.0.0.1:{port}" for port in ports), "--count",
                           str(count), "--credits", str(sender_credits), "--ack-timeout", str(ack_timeout),
                           "--credit-wait", "0.2")
    senders.append(sender)
    deadline = time.monotonic() + EVENT_SECONDS
    while closing.held < 1 or alive.held < 1:
        assert time.monotonic() < deadline, (alive.held, closing.held)
        closing.fill(closing.held + 1, version=0, max_policy_lag=0, timeout=0.2)
        alive.fill(alive.held + 1, version=0, max_policy_lag=0, timeout=0.2)
    # Stop reading the closing rank first, so a batch is stuck there when it closes: the sender routes its other
    # batches to the live rank (the stuck one makes the closing rank's expected room the lower), a few sends on.
    sender.poll_event("sent")
    reading_alive_only = len(sender.seen)
    while sum(event["event"] == "sent" for event in sender.seen[reading_alive_only:]) < 6:
        assert time.monotonic() < deadline, "the sender stopped sending"
        alive.fill(alive.held + 1, version=0, max_policy_lag=0, timeout=0.2)
        sender.poll_event("sent")
    closed_at = time.monotonic()
    before_close = closing.held
    sent_before_close = max(event["sequence"] for event in sender.seen if event["event"] == "sent")
    # Neither rank reads from here to the close, so at most `sender_credits` more are sent (unseen yet) before it.
    assert sent_before_close + 2 * sender_credits < count // 2, "the run checked below must start after the close"
    closing.close()
    assert alive.fill(alive.held + 1, version=0, max_policy_lag=0, timeout=ack_timeout + 3.0)
    assert time.monotonic() - closed_at <= ack_timeout + 3.0
    (done,) = fill_until_done(alive, [sender], version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
    counts = done["counts"]
    assert counts["sent"] == count and done["in_flight"] == 0
    assert counts["accepted"] == alive.held + before_close
    # Every batch is accounted for once: held by a rank, or lost with the closed one. Only what was in flight to it
    # when it closed is lost (unread there, or sent to it before the sender saw the disconnect): at most the credits.
    assert counts["sent"] == counts["accepted"] + counts["lost"]
    assert counts["lost"] <= sender_credits, counts
    # Everything after goes to the live rank: the last half of the sequence numbers, every one, and none twice.
    at_alive = [stamp.sequence for _, stamp in alive.drain()]
    assert len(at_alive) == len(set(at_alive)), sorted(at_alive)
    assert set(range(count // 2 + 1, count + 1)) <= set(at_alive), sorted(at_alive)


def test_a_frozen_rank_is_routed_around_within_the_ack_timeout(senders, intakes):
    """A rank that stops without closing its connections (SIGSTOP: the kernel still accepts bytes, as for a lost
    node whose peers got no FIN) stops getting batches once it missed heartbeats for `ack_timeout`."""
    ports = TRAJECTORIES.port(12), TRAJECTORIES.port(13)
    frozen = WorkerProcess(INTAKE, "--port", str(ports[0]))
    senders.append(frozen)
    alive = TrajectoryIntake(ports[1], bind_host="127.0.0.1")
    intakes.append(alive)
    ack_timeout = 2.0
    sender = WorkerProcess(SENDER, "--endpoints", ",".join(f"127.0.0.1:{port}" for port in ports), "--count", "0",
                           "--credits", "2", "--ack-timeout", str(ack_timeout), "--credit-wait", "0.2",
                           "--deadline", "120")
    senders.append(sender)
    deadline = time.monotonic() + EVENT_SECONDS
    while frozen.poll_event("held") is None or alive.held < 1:
        assert time.monotonic() < deadline, (alive.held, frozen.seen[-3:])
        alive.fill(alive.held + 1, version=0, max_policy_lag=0, timeout=0.2)
    frozen.proc.send_signal(signal.SIGSTOP)
    frozen_at = time.monotonic()
    # The frozen rank holds at most the credits' batches, each lost after ack_timeout; by then its heartbeats failed
    # and it is disconnected, so every later batch goes to the live rank: 20 sequence numbers in a row.
    arrivals: dict[int, float] = {}
    streak = 20
    while True:
        assert time.monotonic() - frozen_at < 2 * ack_timeout + 20.0, f"no streak of {streak}: {sorted(arrivals)}"
        alive.fill(1, version=0, max_policy_lag=0, timeout=0.5)
        arrivals.update((stamp.sequence, time.monotonic()) for _, stamp in alive.drain())
        newest = max(arrivals)
        if all(newest - k in arrivals for k in range(streak)):
            break
    streak_started = arrivals[newest - streak + 1] - frozen_at
    assert streak_started <= 2 * ack_timeout + 5.0, streak_started
    print(f"frozen rank routed around after {streak_started:.1f}s (ack_timeout {ack_timeout}s)")


def test_a_rank_whose_host_does_not_resolve_yet_does_not_break_the_sender(senders, intakes):
    port = TRAJECTORIES.port(11)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    sender = WorkerProcess(SENDER, "--endpoints", f"trainer-1.not-created-yet.invalid:{port},127.0.0.1:{port}",
                           "--count", "6", "--ack-timeout", "5")
    senders.append(sender)
    (done,) = fill_until_done(intake, [sender], version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
    assert done["counts"] == {"sent": 6, "accepted": 6, "stale": 0, "invalid": 0, "older_attempt": 0, "lost": 0}
    assert intake.held == 6


def test_a_restarted_rank_gets_the_next_batch_without_waiting_out_the_ack_timeout(senders, intakes):
    """A trainer gang restarts: the rank's process goes holding an unacknowledged batch and a new one binds the
    same port. The batch is counted lost as soon as the connection drops (the new process sees a new peer and can
    never acknowledge it), so the credit returns at once rather than after `ack_timeout`."""
    port = TRAJECTORIES.port(6)  # reused: the first test of this file has closed it
    old = TrajectoryIntake(port, bind_host="127.0.0.1")
    ack_timeout = 30.0
    sender = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--count", "3", "--credits", "1",
                           "--ack-timeout", str(ack_timeout), "--credit-wait", "0.2", "--deadline", "120")
    senders.append(sender)
    assert sender.next_event(EVENT_SECONDS, "sent")["sequence"] == 1  # never read by `old`: never acknowledged
    old.close()
    closed_at = time.monotonic()
    new = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(new)
    (done,) = fill_until_done(new, [sender], version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
    waited = time.monotonic() - closed_at
    assert waited < ack_timeout / 3, f"the credit came back after {waited:.1f}s"
    assert (done["counts"]["lost"], done["counts"]["accepted"], new.held) == (1, 2, 2), done
