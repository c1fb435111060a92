"""Credit-based flow control between a real sender process and an intake: backpressure, never unbounded queues.

Ports: TRAJECTORIES 5.
"""

from __future__ import annotations

import pytest
from traj_helpers import SENDER, WorkerProcess, fill_until_done

from rlightning.trajectories import TrajectoryIntake
from tests._ports import TRAJECTORIES

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

EVENT_SECONDS = 60.0
"""Bound on each wait, the start of a worker process (which imports torch) included, on a loaded machine."""


def test_an_intake_that_does_not_read_runs_the_senders_credits_out(senders, intakes):
    port = TRAJECTORIES.port(5)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    sender = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--count", "8", "--credits", "2",
                           "--credit-wait", "0.5")
    senders.append(sender)
    # The trainer is "training" (not in fill): the sender sends its 2 credits' worth, then wait_for_credit fails.
    while sender.next_event(EVENT_SECONDS, "sent")["sequence"] < 2:
        pass
    starved = sender.next_event(EVENT_SECONDS, "no_credit")
    assert starved["in_flight"] == 2
    assert [e["sequence"] for e in sender.seen if e["event"] == "sent"] == [1, 2]
    assert intake.held == 0
    (done,) = fill_until_done(intake, [sender], version=0, max_policy_lag=0, timeout=EVENT_SECONDS)
    assert done["counts"] == {"sent": 8, "accepted": 8, "stale": 0, "invalid": 0, "older_attempt": 0, "lost": 0}
    assert max(e["in_flight"] for e in sender.seen if "in_flight" in e) == 2
    assert [stamp.sequence for _, stamp in intake.drain()] == list(range(1, 9))
    assert intake.stats.wait_seconds > 0
