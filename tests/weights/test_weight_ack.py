"""An acknowledgement means applied: checked from the evaluator's side, and a failed apply is never acknowledged.

Ports: WEIGHTS_SYNC of tests/_ports.py, index 19 (see test_weight_relay.py for the others).
"""

from __future__ import annotations

import json
import os

import pytest
import torch
from wsync_helpers import BUCKET_BYTES, start_receiver, stop, wait_members, wait_reports, weights_for

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender, WeightSyncError, tensor_digests
from tests._ports import WEIGHTS_SYNC

pytestmark = pytest.mark.slow  # starts processes that import torch

torch.set_num_threads(1)
TIMEOUT = 5.0


def lines_already_written(proc) -> list[dict]:
    """The JSON lines a receiver has written so far: its pipe read without waiting, below Python's buffering."""
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    data = b""
    while True:
        try:
            chunk = os.read(fd, 1 << 16)
        except BlockingIOError:
            break
        if not chunk:
            break
        data += chunk
    assert data.endswith(b"\n") or not data, "a line is written in one flush"
    return [json.loads(line) for line in data.decode().splitlines()]


@pytest.mark.timeout(120)
def test_publish_returns_only_after_every_acknowledging_evaluator_applied_and_a_failed_apply_is_failed(procs):
    port = WEIGHTS_SYNC.port(19)
    fleet = [0, 1, 2]  # one tree: 0 relays to 1 and 2; 1 refuses version 2
    procs += [start_receiver(port, o, "--apply-in-receive", group_size=3) for o in (0, 2)]
    procs.insert(1, start_receiver(port, 1, "--apply-in-receive", "--fail-apply-version", "2", group_size=3))
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=3, timeout_seconds=TIMEOUT)
    sender = WeightSender(config, "127.0.0.1", port)
    seen: dict[int, list[int]] = {o: [] for o in fleet}
    try:
        wait_members(sender, set(fleet))
        for version in (1, 2, 3):
            try:
                stats = sender.publish(weights_for(version))
            except WeightSyncError as error:
                stats = error.stats
                assert version == 2 and "ordinal 1 failed to apply: ValueError('refusing version 2')" in str(error)
            for ordinal, proc in zip(fleet, procs, strict=True):  # what each evaluator had done when publish returned
                seen[ordinal] += [x["applied"] for x in lines_already_written(proc) if x["event"] == "applied"]
            for ordinal in stats.receivers_acked:
                assert seen[ordinal][-1] == version, (ordinal, seen)  # applied before it acknowledged
            expected_acked = [0, 2] if version == 2 else fleet
            assert (stats.receivers_acked, stats.failed) == (expected_acked, {0: [1]} if version == 2 else {})
        # the refusing evaluator kept version 1 (its report says so), stayed in the tree and applied 3
        assert seen == {0: [1, 2, 3], 1: [1, 3], 2: [1, 2, 3]}
        reports = wait_reports(sender, lambda r: all(o in r and r[o].applied.version == 3 for o in fleet))
        assert all(reports[o].applied.digest == tensor_digests(weights_for(3)) for o in fleet)
    finally:
        sender.close()
    stop(procs)
