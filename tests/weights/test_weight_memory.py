"""Memory during a publish: the sender holds the model plus its two staging transfers, also when it casts; a
receiver receiving in place holds the model plus two transfers, where a staging receiver holds a second copy.

Measured by counting tensor storage: torch's profiler records every CPU allocation and free of the calling
thread (`peak_tensor_bytes`), which is where the sender packs and casts and where the receiver receives. A copy
of the model, cast or not, would show in full. Ports: WEIGHTS_SYNC of tests/_ports.py, indices 6 and 9.
"""

from __future__ import annotations

import pytest
import torch
import threading

from wsync_helpers import peak_tensor_bytes, start_receiver, stop, wait_members

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightSender
from rlightning.weights._buckets import TRANSFER_MAX_BYTES
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


class Target:
    """A receive-in-place target over plain tensors (a policy's `receive_targets` and rollout pause, minus the
    rollouts)."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self.tensors = tensors
        self.versions: list[int | None] = []

    def receive_targets(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def begin_weight_receive(self, timeout: float) -> bool:
        return True

    def end_weight_receive(self, version: int | None) -> None:
        self.versions.append(version)


@pytest.mark.timeout(180)
@pytest.mark.parametrize(("receive", "dtype"), [("staged", None), ("in-place", None), ("in-place", "bfloat16")])
def test_receiver_in_place_holds_two_transfers_beyond_the_model_where_staging_holds_a_copy(receive, dtype):
    port = WEIGHTS_SYNC.port(9)
    # 100 MiB of 1 MiB tensors (packed into 8 MiB transfers) and one 64 MiB tensor (in 32 MiB direct chunks)
    state = {f"layer{i}.weight": torch.randn(MIB // 4) for i in range(100)}
    state["big.weight"] = torch.randn(16 * MIB)
    model = sum(t.numel() * t.element_size() for t in state.values())
    config = WeightSyncConfig(
        backend="gloo", bucket_size_bytes=BUCKET, group_size=1, timeout_seconds=20.0, dtype=dtype
    )
    sender = WeightSender(config, "127.0.0.1", port)
    receiver = WeightReceiver(config, "127.0.0.1", port, ordinal=0)
    target = Target({name: torch.zeros_like(t) for name, t in state.items()})
    into = target if receive == "in-place" else None
    published: list[int] = []

    def publish_twice() -> None:
        wait_members(sender, {0})
        for _ in range(2):
            published.append(sender.publish(state).version)

    publisher = threading.Thread(target=publish_twice)
    publisher.start()
    try:
        first = receiver.receive(60.0, into=into)  # connects, forms its edge, allocates the sender's staging
        assert first is not None and first[0] == 1
        got: list = []
        peak = peak_tensor_bytes(lambda: got.append(receiver.receive(60.0, into=into)))
        publisher.join(60.0)
    finally:
        receiver.close()
        sender.close()
    assert published == [1, 2] and got[0] is not None and got[0][0] == 2
    sent = {n: t.to(getattr(torch, dtype)).float() if dtype else t for n, t in state.items()}
    received = got[0][1]
    assert all(torch.equal(received[n], sent[n]) for n in state)
    if receive == "staged":  # a second copy of the model, in fresh memory
        assert peak >= model, peak / MIB
        return
    assert target.versions == [1, 2] and all(received[n] is target.tensors[n] for n in state)
    # two transfers: packed ones of one 8 MiB bucket; cast to bfloat16, the big tensor's 32 MiB chunks too
    transfer = TRANSFER_MAX_BYTES if dtype else BUCKET
    assert 0 < peak <= 2 * transfer + MIB, peak / MIB
    assert peak < model / 2
