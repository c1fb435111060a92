"""BucketLayout: deterministic grouping per dtype, bounded size, pack/unpack round trip."""

from __future__ import annotations

import itertools
import random

import torch

from rlightning.weights import tensor_digests
from rlightning.weights._buckets import TRANSFER_MAX_BYTES, ZERO_COPY_MIN_BYTES, BucketLayout

torch.set_num_threads(1)
BOUND = 1024


def mixed_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return {
        "a.w": torch.randn(10, 10, generator=gen),  # 400 B
        "a.b": torch.randn(10, generator=gen),
        "huge": torch.randn(1000, generator=gen),  # 4000 B > bound: own bucket
        "c.w": torch.randn(100, generator=gen),
        "d.h": torch.randn(7, 3, generator=gen).to(torch.bfloat16),
        "d.f64": torch.randn(5, generator=gen, dtype=torch.float64),
        "bn.n": torch.tensor(12, dtype=torch.int64),
        "mask": torch.tensor([True, False, True]),
        "empty": torch.zeros(0, 4),
    }


def test_round_trip_mixed_dtypes_with_a_tensor_above_the_bound():
    state = mixed_state()
    layout = BucketLayout.from_state(state, BOUND)
    flats = [layout.allocate(i) for i in range(len(layout.buckets))]
    for seg in layout.segments:
        layout.pack_segment(seg, state, flats[seg.bucket][seg.offset : seg.offset + seg.numel])
    out = layout.unpack_all(flats)
    assert tensor_digests(out) == tensor_digests(state)
    for bucket in layout.buckets:
        assert all(state[s.name].dtype == bucket.dtype for s in bucket.slots)  # one dtype per bucket
        assert bucket.nbytes <= BOUND or len(bucket.slots) == 1
    huge = [b for b in layout.buckets if any(s.name == "huge" for s in b.slots)]
    assert len(huge) == 1 and len(huge[0].slots) == 1
    assert len(layout.buckets) < len(state)  # few buckets, not one per tensor
    assert layout.nbytes == sum(t.numel() * t.element_size() for t in state.values())
    # unpack gives views into the buckets: no copy
    home = next(i for i, b in enumerate(layout.buckets) if any(s.name == "a.w" for s in b.slots))
    assert out["a.w"].untyped_storage().data_ptr() == flats[home].untyped_storage().data_ptr()


def test_layout_is_deterministic_and_signature_detects_changes():
    state = mixed_state()
    items = list(state.items())
    random.Random(1).shuffle(items)
    a = BucketLayout.from_state(state, BOUND)
    b = BucketLayout.from_state(dict(items), BOUND)
    assert a.signature == b.signature and a.buckets == b.buckets
    assert BucketLayout.from_json(a.to_json()).signature == a.signature
    assert BucketLayout.from_state({**state, "c.w": torch.zeros(101)}, BOUND).signature != a.signature
    half = {**state, "c.w": torch.zeros(100, dtype=torch.float16)}
    assert BucketLayout.from_state(half, BOUND).signature != a.signature
    assert BucketLayout.from_state(state, 2 * BOUND).signature != a.signature


def test_segments_cover_buckets_pack_runs_up_to_the_bound_and_send_large_or_lone_tensors_directly():
    mids = {f"mid.{i:02d}": torch.zeros(3 * 2**18) for i in range(12)}  # 3 MiB each: packed, 36 MiB in all
    large = torch.zeros(ZERO_COPY_MIN_BYTES // 4)
    state = {**mixed_state(), **mids, "large.a": large, "tail": torch.zeros(5)}
    layout = BucketLayout.from_state(state, 64 * 2**20)
    for index, bucket in enumerate(layout.buckets):
        segments = [s for s in layout.segments if s.bucket == index]
        assert segments[0].offset == 0
        assert all(a.offset + a.numel == b.offset for a, b in itertools.pairwise(segments))
        assert segments[-1].offset + segments[-1].numel == bucket.numel
    direct = sorted(s.slots[0].name for s in layout.segments if s.direct)
    assert direct == ["bn.n", "d.f64", "d.h", "large.a", "mask"]  # >= ZERO_COPY_MIN_BYTES, or alone in a bucket
    float_segments = [s for s in layout.segments if layout.buckets[s.bucket].dtype == torch.float32]
    assert [s.direct for s in float_segments] == [False, False, True]  # 36 MiB of small ones split in two runs
    assert all(s.numel * 4 <= TRANSFER_MAX_BYTES for s in float_segments if not s.direct)
    assert [slot.name for slot in float_segments[1].slots] == ["mid.10", "mid.11", "tail"]
    out = torch.empty(layout.buckets[float_segments[0].bucket].numel)
    packed = layout.pack_segment(float_segments[0], state, out)
    assert torch.equal(packed[:5], state["a.b"][:5])


def test_a_tensor_above_the_transfer_bound_travels_in_chunks_that_round_trip():
    big = torch.randn(TRANSFER_MAX_BYTES // 4 + 1000)  # 32 MiB + 4000 bytes of float32
    state = {"big": big, "small": torch.randn(10)}
    layout = BucketLayout.from_state(state, 64 * 2**20)
    chunks = [s for s in layout.segments if s.slots[0].name == "big"]
    assert [(s.direct, s.numel) for s in chunks] == [(True, TRANSFER_MAX_BYTES // 4), (True, 1000)]
    flats = [layout.allocate(i) for i in range(len(layout.buckets))]
    for seg in layout.segments:  # packing a chunk copies just that range (what the sender does when it casts)
        layout.pack_segment(seg, state, flats[seg.bucket][seg.offset : seg.offset + seg.numel])
    assert tensor_digests(layout.unpack_all(flats)) == tensor_digests(state)


def test_a_tensor_above_a_small_bucket_bound_travels_in_transfers_of_the_bound():
    # a relay forwards transfer by transfer: a tensor sent whole would not pipeline through the tree
    state = {"w": torch.randn(2**20 + 10), "b": torch.randn(10)}  # 4 MiB + 40 bytes, and a small one
    layout = BucketLayout.from_state(state, 2**20)
    chunks = [s.numel for s in layout.segments if s.slots[0].name == "w"]
    assert chunks == [2**18] * 4 + [10]
    assert all(s.numel * 4 <= 2**20 for s in layout.segments)
    flats = [layout.allocate(i) for i in range(len(layout.buckets))]
    for seg in layout.segments:
        layout.pack_segment(seg, state, flats[seg.bucket][seg.offset : seg.offset + seg.numel])
    assert tensor_digests(layout.unpack_all(flats)) == tensor_digests(state)
