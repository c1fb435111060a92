"""`weightSync.dtype`: floating tensors are cast before they travel; copies compare in the receivers' dtype.

Ports: WEIGHTS_SYNC of tests/_ports.py, index 18 (see test_weight_relay.py for the others).
"""

from __future__ import annotations

import pytest
import torch
from wsync_helpers import BUCKET_BYTES, applied_versions, start_receiver, stop, wait_members, wait_reports, weights_for

from rlightning.config import WeightSyncConfig
from rlightning.policy._consistency import VersionLedger
from rlightning.weights import WeightRecord, WeightSender, l2_fingerprint, tensor_digests
from rlightning.weights._buckets import BucketLayout
from rlightning.weights._state import wire_dtype
from tests._ports import WEIGHTS_SYNC

torch.set_num_threads(1)
TIMEOUT = 5.0


def wire_bytes(state: dict[str, torch.Tensor], cast: str | None) -> int:
    return sum(t.numel() * wire_dtype(t.dtype, cast).itemsize for t in state.values())


def test_only_floating_tensors_are_cast():
    assert wire_dtype(torch.float32, "bfloat16") == torch.bfloat16
    assert wire_dtype(torch.float64, "float16") == torch.float16
    assert wire_dtype(torch.int64, "bfloat16") == torch.int64 and wire_dtype(torch.bool, "float16") == torch.bool
    assert wire_dtype(torch.float32, None) == torch.float32


def test_packing_casts_into_the_wire_dtype_also_for_chunks_of_large_tensors():
    state = weights_for(1)
    entries = [(n, wire_dtype(t.dtype, "bfloat16"), t.shape) for n, t in state.items()]
    layout = BucketLayout(entries, BUCKET_BYTES)
    assert layout.nbytes == wire_bytes(state, "bfloat16") < wire_bytes(state, None) * 0.6
    flats = [layout.allocate(i) for i in range(len(layout.buckets))]
    for seg in layout.segments:
        layout.pack_segment(seg, state, flats[seg.bucket][seg.offset : seg.offset + seg.numel])
    got = layout.unpack_all(flats)
    assert tensor_digests(got) == tensor_digests(state, "bfloat16") != tensor_digests(state)
    assert l2_fingerprint(got) == l2_fingerprint(state, "bfloat16")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_bf16_fleet_receives_half_the_bytes_and_matches_the_trainer_by_digest(procs):
    port = WEIGHTS_SYNC.port(18)
    fleet = [0, 1, 2]  # one tree: 0 relays to 1 and 2
    procs += [start_receiver(port, o, "--dtype", "bfloat16", group_size=3) for o in fleet]
    config = WeightSyncConfig(
        backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=3, timeout_seconds=TIMEOUT, dtype="bfloat16"
    )
    sender = WeightSender(config, "127.0.0.1", port)
    ledger = VersionLedger()  # the trainer's side, as PolicyGroup keeps it
    try:
        wait_members(sender, set(fleet))
        for version in (1, 2):
            state = weights_for(version)  # the trainer's float32/float64 tensors
            stats = sender.publish(state)
            assert stats.receivers_acked == fleet
            assert stats.bytes == wire_bytes(state, "bfloat16") < wire_bytes(state, None) * 0.6
            ledger.record(version, state, cast=config.dtype)
            reports = wait_reports(
                sender, lambda r, v=version: all(o in r and r[o].applied.version == v for o in fleet)
            )
            for ordinal in fleet:
                assert reports[ordinal].applied.digest == tensor_digests(state, "bfloat16")
                assert reports[ordinal].applied.digest != tensor_digests(state)  # the check can fail
            verdict = ledger.check(reports, exact=True)
            assert (verdict.consistent, verdict.checked, verdict.mismatched) == (True, fleet, {})
        # the trainer's record in its own dtype does not match a bf16 fleet: the comparison must cast
        uncast = WeightRecord.of(2, weights_for(2))
        assert uncast.mismatches(reports[0].applied) != []
    finally:
        sender.close()
    stop(procs)
    assert [applied_versions(p) for p in procs] == [[1, 2]] * len(fleet)
