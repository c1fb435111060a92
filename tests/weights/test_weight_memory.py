"""The sender's memory during a publish: the model plus its two staging transfers, also when it casts.

Measured by counting tensor storage: torch's profiler records every CPU allocation and free of the calling
thread (`peak_tensor_bytes`), which is where the sender packs and casts. A copy of the model, cast or not,
would show in full. Ports: WEIGHTS_SYNC of tests/_ports.py, index 6.
"""

from __future__ import annotations

import pytest
import torch
from wsync_helpers import peak_tensor_bytes, start_receiver, stop, wait_members

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender
from tests._ports import WEIGHTS_SYNC

pytestmark = pytest.mark.slow  # starts processes that import torch and moves a 200 MiB model

torch.set_num_threads(1)
MIB = 2**20
BUCKET = 8 * MIB


@pytest.mark.timeout(180)
@pytest.mark.parametrize("dtype", [None, "bfloat16"])
def test_sender_holds_at_most_two_staging_transfers_beyond_the_model(procs, dtype):
    port = WEIGHTS_SYNC.port(6)
    extra = ("--raw", "--bucket-bytes", str(BUCKET))
    procs += [start_receiver(port, o, *extra, group_size=2, timeout=20.0) for o in (0, 1)]
    # 200 MiB of float32 in 1 MiB tensors: everything is packed, in transfers of at most one 8 MiB bucket
    state = {f"layer{i}.weight": torch.randn(MIB // 4) for i in range(200)}
    config = WeightSyncConfig(
        backend="gloo", bucket_size_bytes=BUCKET, group_size=2, timeout_seconds=20.0, dtype=dtype
    )
    sender = WeightSender(config, "127.0.0.1", port)
    try:
        wait_members(sender, {0, 1})
        first = peak_tensor_bytes(lambda: sender.publish(state))  # allocates the staging buffers
        steady = peak_tensor_bytes(lambda: sender.publish(state))  # reuses them
    finally:
        sender.close()
    stop(procs)
    model = sum(t.numel() * t.element_size() for t in state.values())
    # two staging transfers of at most one 8 MiB bucket each (kept between publishes); a copy of the model
    # (200 MiB, or 100 MiB cast to bfloat16) would show in full
    assert 0 < first <= 2 * BUCKET + MIB, first / MIB  # plus headers and the like
    assert steady < MIB, steady / MIB
    assert first < model / 8
