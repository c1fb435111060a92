"""Evaluators of a policy that corrects for lag free-run (`BatchPacing(free_run=True)`): a second batch of a version
is collected while the first is unread; a version the ranks are more than `maxPolicyLag` past is still not collected,
and a batch that old is still refused and counted by the rank.

Ports: TRAJECTORIES 21.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from traj_helpers import make_batch, pump_until

from rlightning.runtime.eval import BatchPacing
from rlightning.trajectories import BatchStamp, TrajectoryIntake, TrajectorySender
from tests._ports import TRAJECTORIES

EVENT_SECONDS = 60.0
"""Bound on each wait for an acknowledgement or a notice, on a loaded machine."""


def _send(sender: TrajectorySender, sequence: int, version: int) -> None:
    assert sender.wait_for_credit(EVENT_SECONDS)
    sender.send(make_batch(sender.ordinal, sequence, 4), BatchStamp(version, sender.ordinal, sequence, env_steps=4))


def _wait_until(condition: Callable[[], bool], what: str, sender: TrajectorySender) -> None:
    """Process the sender's acknowledgements and notices until `condition()` holds, at most `EVENT_SECONDS`."""
    pump_until(what, condition, sender, EVENT_SECONDS)


def test_a_correcting_policy_free_runs_within_the_lag_and_a_batch_beyond_it_is_refused_and_counted(
    intakes: list[TrajectoryIntake],
) -> None:
    port = TRAJECTORIES.port(21)
    rank = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(rank)
    a, b = (TrajectorySender([f"127.0.0.1:{port}"], ordinal=o, credits=2, ack_timeout=30.0) for o in (0, 1))
    try:
        for sender in (a, b):
            _wait_until(lambda s=sender: s.connected == 1, "connected", sender)
        paced, free = BatchPacing(1), BatchPacing(1, free_run=True)
        _send(a, 1, version=5)
        for pacing in (paced, free):
            pacing.sent(5, time.monotonic())
        assert a.in_flight == 1  # the rank is not filling: unread
        assert free.wanted(a, 5), "free-running: a second batch of version 5 while the first is unread"
        assert not paced.wanted(a, 5), "paced: one batch of a version until the rank reads it"
        assert paced.wanted(a, 6) and free.wanted(a, 6)

        # The rank moves to version 8 under maxPolicyLag 1: A's batch of 5 is refused as stale and counted, on both
        # sides; B's batch of 8 fills the rank, whose notice tells A that versions below 7 are too old to collect.
        assert not rank.fill(1, version=8, max_policy_lag=1, timeout=2.0)
        _wait_until(lambda: a.in_flight == 0, "A's acknowledgement", a)
        assert (rank.stats.stale, a.counts.stale, a.counts.accepted) == (1, 1, 0)
        _send(b, 1, version=8)
        assert rank.fill(1, version=8, max_policy_lag=1, timeout=EVENT_SECONDS)
        _wait_until(lambda: a.too_old(6, 1), "the rank's notice to A", a)
        assert not free.wanted(a, 6), "free-running collects no version the ranks are more than the lag past"
        assert free.wanted(a, 7)
    finally:
        a.close()
        b.close()
