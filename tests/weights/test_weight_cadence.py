"""Publishes back to back, with no gap, to real receiver processes: every one succeeds and is applied in order.

Ports: WEIGHTS_SYNC of tests/_ports.py, index 15 (test_weight_sync.py uses the low ones, test_weight_liveness.py
10-13).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from wsync_helpers import BUCKET_BYTES, applied_versions, start_receiver, stop, wait_members, weights_for

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender
from tests._ports import WEIGHTS_SYNC

pytestmark = pytest.mark.slow  # starts processes that import torch, then hundreds of publishes

torch.set_num_threads(1)
PUBLISHES = 300
TIMEOUT = 5.0


def store_connections(port: int) -> int:
    """TCP connections of this network namespace to `port`, from the client side, live or in TIME_WAIT.

    A closed client connection stays in TIME_WAIT for 60 s (Linux), so connections opened and closed during
    a test are still counted at its end.
    """
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            remote = line.split()[2]  # "ADDRESS:PORT", the port in hex
            count += int(remote.rsplit(":", 1)[1], 16) == port
    return count


@pytest.mark.timeout(300)
def test_hundreds_of_back_to_back_publishes_are_all_applied_in_order_on_one_connection_each(procs):
    port = WEIGHTS_SYNC.port(15)
    procs += [start_receiver(port, o, lifetime=240.0) for o in (0, 1)]
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=2, timeout_seconds=TIMEOUT)
    sender = WeightSender(config, "127.0.0.1", port)
    states = [weights_for(v) for v in (1, 2)]  # values alternate, so every apply changes the weights
    try:
        wait_members(sender, {0, 1})
        assert sender.publish(states[1]).receivers_acked == [0, 1]  # forms the group; receivers connected
        connected = store_connections(port)
        for version in range(2, PUBLISHES + 1):  # no gap: the next publish starts as soon as the last returns
            stats = sender.publish(states[version % 2])
            assert (stats.version, stats.receivers_acked, stats.failed) == (version, [0, 1], {})
        # none is opened per publish: at most the spares every pool was still opening when the first publish
        # returned (each a probe and a client; a busy machine refills them late), far below one per publish
        spares = 2 * config.relay_trees * (1 + config.relay_fanout) * len(procs) + 2 * config.relay_trees
        assert store_connections(port) - connected <= 2 * spares + 2, "store connections grew with the publishes"
    finally:
        sender.close()
    stop(procs)
    assert [applied_versions(p) for p in procs] == [list(range(1, PUBLISHES + 1))] * 2
