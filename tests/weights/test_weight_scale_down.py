"""A scale-down seen by the weight sender: an evaluator that leaves cleanly is no failure and stalls no publish.

A StatefulSet scale-down (kubectl scale, an HPA) sends SIGTERM to the highest ordinals; the evaluator finishes or
drops its batch and posts a clean leave (`rlightning.runtime.eval`). Here a real receiver process leaves the same
way (`WeightReceiver.close`) right after applying a version, and the next publish goes out at once to the others.
Port: WEIGHTS_SYNC 8 of tests/_ports.py.
"""

from __future__ import annotations

import json
import time

import pytest
import torch
from wsync_helpers import BUCKET_BYTES, start_receiver, stop, wait_members, weights_for

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender
from tests._ports import WEIGHTS_SYNC

pytestmark = pytest.mark.slow  # starts processes that import torch (seconds apiece)

torch.set_num_threads(1)
TIMEOUT = 5.0
"""weightSync.timeoutSeconds of this test: the bound a publish would wait for a member that never acknowledges."""


@pytest.mark.timeout(240)
def test_a_member_that_leaves_is_no_failure_and_the_next_publish_does_not_wait_for_it(procs):
    port = WEIGHTS_SYNC.port(8)
    procs += [start_receiver(port, 0, timeout=TIMEOUT), start_receiver(port, 1, timeout=TIMEOUT),
              start_receiver(port, 2, "--leave-after-version", "1", timeout=TIMEOUT)]
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=2, timeout_seconds=TIMEOUT)
    sender = WeightSender(config, "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1, 2})
        first = sender.publish(weights_for(1))
        assert first.receivers_acked == [0, 1, 2]
        leaving = procs[2]
        assert leaving.wait(30) == 0, "the leaving evaluator exits cleanly"
        events = [json.loads(line)["event"] for line in leaving.stdout.read().splitlines() if line.startswith("{")]
        assert events[-1] == "exit"

        # No wait for the membership to settle: the publish itself reads the leave first.
        started = time.monotonic()
        second = sender.publish(weights_for(2))  # raises WeightSyncError on any missing ack or failed group
        elapsed = time.monotonic() - started
        assert second.receivers_acked == [0, 1] and second.version == 2
        assert elapsed < TIMEOUT, f"the publish waited {elapsed:.1f} s, as for a member that never acknowledges"
        assert sender.members == [0, 1]
        third = sender.publish(weights_for(3))
        assert third.receivers_acked == [0, 1]
    finally:
        sender.close()
    stop(procs)
