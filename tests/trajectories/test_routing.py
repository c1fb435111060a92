"""Senders route by the room each rank reports: every rank gets what its fill wants, `wanted` tells an evaluator when
no rank wants its version any more, and a dead rank neither takes batches nor counts.

Ports: TRAJECTORIES 16-19 (16 and 17 reused by tests that run one after the other; each closes its intakes).
"""

from __future__ import annotations

import contextlib
import signal
import time
from collections.abc import Iterator

import pytest
from traj_helpers import INTAKE, SENDER, WorkerProcess, make_batch, pump_until

from rlightning.trajectories import BatchStamp, TrajectoryIntake, TrajectorySender
from tests._ports import TRAJECTORIES

EVENT_SECONDS = 60.0
"""Bound on each wait, the start of a worker process (which imports torch) included, on a loaded machine."""


def send_next(sender: TrajectorySender, sequence: int, version: int) -> None:
    sender.send(make_batch(sender.ordinal, sequence, 4), BatchStamp(version, sender.ordinal, sequence, env_steps=4))


def wait_until(condition, what: str, sender: TrajectorySender, timeout: float = EVENT_SECONDS) -> None:
    """Process the sender's acknowledgements and connection events until `condition()` holds, at most `timeout`."""
    pump_until(what, condition, sender, timeout)


@pytest.mark.slow  # starts a process that imports torch
@pytest.mark.parametrize("sender_credits", [1, 2])
@pytest.mark.parametrize("counts", [(2, 2), (3, 1)], ids=["even", "uneven"])
def test_each_rank_gets_exactly_what_its_fill_wants(senders, intakes, sender_credits, counts):
    # A rank that holds its count reads nothing more, so one batch too many for it would never be acknowledged
    # (the sender would not finish) and would leave the other rank short: round-robin fails the uneven case.
    ports = TRAJECTORIES.port(16), TRAJECTORIES.port(17)
    ranks = [TrajectoryIntake(port, bind_host="127.0.0.1") for port in ports]
    intakes.extend(ranks)
    # both ranks connected first: a rank that connects late leaves the other every batch, even one too many
    sender = WorkerProcess(SENDER, "--endpoints", ",".join(f"127.0.0.1:{port}" for port in ports),
                           "--count", str(sum(counts)), "--credits", str(sender_credits), "--credit-wait", "0.1",
                           "--connected", "2")
    senders.append(sender)
    deadline = time.monotonic() + EVENT_SECONDS
    while (done := sender.poll_event("done")) is None:
        assert time.monotonic() < deadline, ([rank.held for rank in ranks], sender.seen[-3:])
        for rank, count in zip(ranks, counts, strict=True):
            rank.fill(count, version=0, max_policy_lag=0, timeout=0.1)
    assert [rank.held for rank in ranks] == list(counts)
    assert done["counts"] == {
        "sent": sum(counts), "accepted": sum(counts), "stale": 0, "invalid": 0, "older_attempt": 0, "lost": 0
    }


def test_wanted_turns_false_once_every_rank_holds_enough_of_the_version(intakes):
    ports = TRAJECTORIES.port(18), TRAJECTORIES.port(19)
    ranks = [TrajectoryIntake(port, bind_host="127.0.0.1") for port in ports]
    intakes.extend(ranks)
    sender = TrajectorySender([f"127.0.0.1:{port}" for port in ports], ordinal=0, credits=2, ack_timeout=30.0)
    try:
        wait_until(lambda: sender.connected == 2, "both ranks connected", sender)
        assert sender.wanted(5)  # nothing acknowledged yet
        for sequence in (1, 2):  # neither rank has answered: the second goes to the one with nothing pending
            assert sender.wait_for_credit(EVENT_SECONDS)
            send_next(sender, sequence, version=5)
        assert ranks[0].fill(1, version=5, max_policy_lag=0, timeout=EVENT_SECONDS)
        wait_until(lambda: sender.in_flight == 1, "rank 0's acknowledgement", sender)
        assert sender.wanted(5)  # rank 1 has not said it is full
        assert ranks[1].fill(1, version=5, max_policy_lag=0, timeout=EVENT_SECONDS)
        wait_until(lambda: sender.in_flight == 0, "rank 1's acknowledgement", sender)
        assert not sender.wanted(5)
        assert not sender.wanted(4)
        assert sender.wanted(6)  # their next fills need the next version
        assert sender.counts.accepted == 2
    finally:
        sender.close()


def test_a_rank_whose_answer_is_on_the_way_ranks_after_one_known_to_want_more(intakes):
    # Rank 0 has answered "room 1"; rank 1 has not read its batch yet and may be full with it. A full rank reads
    # nothing more, so the next batch must go to rank 0 even where the rotation (version 1) would put rank 1 first.
    ports = TRAJECTORIES.port(18), TRAJECTORIES.port(19)  # reused: the tests above closed theirs
    ranks = [TrajectoryIntake(port, bind_host="127.0.0.1") for port in ports]
    intakes.extend(ranks)
    sender = TrajectorySender([f"127.0.0.1:{port}" for port in ports], ordinal=0, credits=3, ack_timeout=30.0)
    try:
        wait_until(lambda: sender.connected == 2, "both ranks connected", sender)
        for sequence in (1, 2):  # nothing pending to a rank that has not answered: one to each
            assert sender.wait_for_credit(EVENT_SECONDS)
            send_next(sender, sequence, version=0)
        assert not ranks[0].fill(2, version=0, max_policy_lag=1, timeout=1.0)  # holds one, answers room 1
        wait_until(lambda: sender.in_flight == 1, "rank 0's acknowledgement", sender)
        assert sender.wait_for_credit(EVENT_SECONDS)
        send_next(sender, 3, version=1)
        assert ranks[0].fill(2, version=1, max_policy_lag=1, timeout=EVENT_SECONDS)
        assert ranks[1].fill(1, version=1, max_policy_lag=1, timeout=EVENT_SECONDS)
        wait_until(lambda: sender.in_flight == 0, "every acknowledgement", sender)
        assert 3 in [stamp.sequence for _, stamp in ranks[0].drain()]
    finally:
        sender.close()


@contextlib.contextmanager
def _a_batch_of_a_read(intakes) -> Iterator[tuple[TrajectoryIntake, TrajectorySender, TrajectorySender]]:
    """One rank and evaluators A and B connected to it; A sent batch 1 of version 5 and the rank read it (one of
    the two its fill wants) with both probes. Yields the rank, A and B; closes A and B."""
    port = TRAJECTORIES.port(18)  # reused: the tests above closed their intakes
    rank = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(rank)
    a, b = (TrajectorySender([f"127.0.0.1:{port}"], ordinal=o, credits=1, ack_timeout=30.0) for o in (0, 1))
    try:
        for sender in (a, b):
            wait_until(lambda s=sender: s.connected == 1, "connected", sender)
        assert a.wait_for_credit(EVENT_SECONDS)
        send_next(a, 1, version=5)
        assert not rank.fill(2, version=5, max_policy_lag=0, timeout=2.0)
        yield rank, a, b
    finally:
        a.close()
        b.close()


def test_a_full_rank_tells_the_other_evaluators_unasked(intakes):
    # Evaluator A's batch leaves room for one more; B's fills the rank, whose notice tells A without A sending again.
    with _a_batch_of_a_read(intakes) as (rank, a, b):
        wait_until(lambda: a.in_flight == 0, "A's acknowledgement", a)
        assert a.wanted(5)  # room 1 left
        assert b.wait_for_credit(EVENT_SECONDS)
        send_next(b, 1, version=5)
        assert rank.fill(2, version=5, max_policy_lag=0, timeout=EVENT_SECONDS)
        wait_until(lambda: not a.wanted(5), "the rank's notice to A", a)
        wait_until(lambda: not b.wanted(5), "B's acknowledgement", b)
        assert a.wanted(6) and b.wanted(6)  # the next fill needs the next version
        assert a.in_flight == 0 and a.counts.sent == 1  # A learnt it without another batch


def test_a_full_notice_tells_an_evaluator_which_versions_are_too_old_to_collect(intakes):
    # The rank's fill at version 5 is full: A, told by the notice, knows a batch of 3 is stale on arrival under lag 1
    # and one of 4 is not; B, whose batch filled it, has only an acknowledgement, which names no fill version.
    with _a_batch_of_a_read(intakes) as (rank, a, b):
        assert not a.too_old(0, 0)  # no notice yet
        assert b.wait_for_credit(EVENT_SECONDS)
        send_next(b, 1, version=5)
        assert rank.fill(2, version=5, max_policy_lag=0, timeout=EVENT_SECONDS)
        wait_until(lambda: a.too_old(3, 1), "the rank's notice to A", a)
        assert not a.too_old(4, 1) and not a.too_old(5, 0)
        wait_until(lambda: b.in_flight == 0, "B's acknowledgement", b)
        assert not b.too_old(0, 0)


def test_asking_for_an_evaluation_reaches_every_evaluator_connected_also_one_that_sent_nothing(intakes):
    # Rank 0 holding training to confirm the target on a version asks the whole fleet: A sent a batch, B only
    # connected (its probe); both learn of the version without sending anything more.
    with _a_batch_of_a_read(intakes) as (rank, a, b):
        rank.ask_evaluation(6, episodes=3)  # 3 episodes each: 5 a report, split over the 2 evaluators
        for sender in (a, b):
            wait_until(lambda s=sender: s.evaluation_asked == 6, "the request to evaluate version 6", sender)
            assert sender.evaluation_episodes == 3
        assert b.counts.sent == 0 and a.counts.sent == 1
        rank.ask_evaluation(4, episodes=5)  # an older request changes nothing; the ack after it comes in order
        assert a.wait_for_credit(EVENT_SECONDS)
        send_next(a, 2, version=6)
        assert rank.fill(2, version=6, max_policy_lag=1, timeout=EVENT_SECONDS)
        wait_until(lambda: a.in_flight == 0, "the acknowledgement after the older request", a)
        assert (a.evaluation_asked, a.evaluation_episodes) == (6, 3)


@pytest.mark.slow  # starts a process that imports torch
def test_a_killed_rank_is_routed_around_and_no_longer_counts_for_wanted(senders, intakes):
    ports = TRAJECTORIES.port(16), TRAJECTORIES.port(17)
    doomed = WorkerProcess(INTAKE, "--port", str(ports[0]), "--room", "1000")  # always wants more
    senders.append(doomed)
    alive = TrajectoryIntake(ports[1], bind_host="127.0.0.1")
    intakes.append(alive)
    sender = TrajectorySender([f"127.0.0.1:{port}" for port in ports], ordinal=1, credits=1, ack_timeout=2.0)
    try:
        wait_until(lambda: sender.connected == 2, "both ranks connected", sender)
        sequence = 0
        deadline = time.monotonic() + EVENT_SECONDS
        while doomed.poll_event("held") is None or alive.held < 1:
            assert time.monotonic() < deadline, (alive.held, doomed.seen[-3:])
            if sender.wait_for_credit(0.05):
                sequence += 1
                send_next(sender, sequence, version=0)
            alive.fill(alive.held + 1000, version=0, max_policy_lag=0, timeout=0.05)
        alive.drain()
        doomed.proc.send_signal(signal.SIGKILL)
        doomed.proc.wait(EVENT_SECONDS)
        wait_until(lambda: sender.connected == 1, "the killed rank's disconnection", sender)
        after_kill: list[int] = []
        deadline = time.monotonic() + EVENT_SECONDS
        while len(after_kill) < 5:
            assert time.monotonic() < deadline, after_kill
            if sender.wait_for_credit(0.05):  # a batch the killed rank held returns its credit after ack_timeout
                sequence += 1
                send_next(sender, sequence, version=0)
                after_kill.append(sequence)
            alive.fill(5, version=0, max_policy_lag=0, timeout=0.05)
        assert alive.fill(5, version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
        wait_until(lambda: sender.in_flight == 0, "the last acknowledgement", sender)
        assert [stamp.sequence for _, stamp in alive.drain()] == after_kill
        # The killed rank's last acknowledgement wanted more; only the connected rank counts, and it is full.
        assert not sender.wanted(0)
    finally:
        sender.close()
