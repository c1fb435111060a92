"""Flat buckets: a deterministic layout that packs many tensors into few contiguous buffers per dtype."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence

import torch

ZERO_COPY_MIN_BYTES = 16 << 20
"""Tensors of at least this many bytes (16 MiB) travel straight from their own memory into their slot of the
receiver's bucket, in transfers of up to `TRANSFER_MAX_BYTES`; smaller ones are packed into transfers of up to
`TRANSFER_MAX_BYTES`. Measured on loopback
(gloo, 2 contexts per group, benchmarks/weight_sync.py and raw broadcasts of 400 MB): 1 MiB transfers reach
about 1.4-2.4 GB/s, 16 MiB ones 3.2-4.5 GB/s and 64 MiB ones 4.5-5 GB/s, while packing copies at about
10 GB/s and overlaps the previous transfer; at 16 MiB a direct transfer and a pack break even. A tensor alone
in its bucket is always sent directly (packing it would copy for nothing)."""


TRANSFER_MAX_BYTES = 32 << 20
"""Upper bound of one transfer, bytes: a run of small tensors is packed up to it, and a larger tensor is sent in
chunks of it. The sender's two staging buffers each hold one transfer, so its extra memory stays near 64 MiB
whatever the bucket bound (also when it casts, `WeightSyncConfig.dtype`), the first pack, which nothing
overlaps, stays short, and a relay forwards a large tensor's first chunk while the next arrives (`_relay`).
32 MiB transfers move nearly as fast as 64 MiB ones (measured as for `ZERO_COPY_MIN_BYTES`)."""


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _nbytes(dtype: torch.dtype, shape: Sequence[int]) -> int:
    numel = 1
    for s in shape:
        numel *= int(s)
    return numel * dtype.itemsize


def _order(entry: tuple[str, torch.dtype, tuple[int, ...]]) -> tuple[str, bool, str]:
    name, dtype, shape = entry
    return (_dtype_name(dtype), _nbytes(dtype, shape) >= ZERO_COPY_MIN_BYTES, name)


def _dtype_from_name(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"unknown dtype {name!r} in a bucket layout")
    return dtype


@dataclasses.dataclass(frozen=True)
class TensorSlot:
    """Where one tensor lives inside a bucket.

    Attributes:
        name (str): the tensor's clean name.
        shape (tuple[int, ...]): its shape.
        bucket (int): index of its bucket in `BucketLayout.buckets`.
        offset (int): first element inside the bucket (elements, not bytes).
        numel (int): number of elements.
    """

    name: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    numel: int


@dataclasses.dataclass(frozen=True)
class BucketSpec:
    """One flat bucket: a 1-D tensor of `numel` elements of `dtype` holding the tensors in `slots`.

    Attributes:
        dtype (torch.dtype): element type of every tensor in the bucket.
        numel (int): length of the flat bucket in elements.
        slots (tuple[TensorSlot, ...]): its tensors in packing order.
    """

    dtype: torch.dtype
    numel: int
    slots: tuple[TensorSlot, ...]

    @property
    def nbytes(self) -> int:
        """Size in bytes."""
        return self.numel * self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Segment:
    """One transfer: a contiguous range of a bucket, either packed (several small tensors) or direct (one tensor
    or a chunk of it).

    Attributes:
        bucket (int): bucket index.
        offset (int): first element inside the bucket.
        numel (int): number of elements.
        slots (tuple[TensorSlot, ...]): the tensors in the range.
        direct (bool): True when the range lies in one tensor of at least `ZERO_COPY_MIN_BYTES`, or in the
            only tensor of its bucket: sent from its own memory without packing (when its dtype travels as is),
            in chunks of at most `TRANSFER_MAX_BYTES`.
    """

    bucket: int
    offset: int
    numel: int
    slots: tuple[TensorSlot, ...]
    direct: bool


class BucketLayout:
    """A deterministic grouping of named tensors into flat buckets, one dtype per bucket, of bounded size.

    Tensors are ordered by (dtype, size class, name), small ones (< `ZERO_COPY_MIN_BYTES`) first, and filled
    greedily into buckets of at most `bucket_size_bytes`; a tensor larger than the bound gets a bucket of its
    own. `segments` splits buckets into transfers of at most `TRANSFER_MAX_BYTES` or the bound, whichever is
    smaller: runs of small tensors, and chunks of each large tensor (or lone tensor of a bucket), so a relay
    forwards a tensor larger than the bound chunk by chunk, as pipelined as the rest. The
    same names, dtypes, shapes and bound give the same layout on every process, whatever the input order, and
    the same `signature`.

    Args:
        entries (Iterable[tuple[str, torch.dtype, Sequence[int]]]): (name, dtype, shape) per tensor.
        bucket_size_bytes (int): upper bound of a bucket holding more than one tensor, in bytes (>= 1).

    Raises:
        ValueError: on duplicate names or a non-positive bound.

    Examples:
        >>> layout = BucketLayout.from_state({"w": torch.zeros(2, 3), "b": torch.zeros(3)}, 1024)
        >>> len(layout.buckets), layout.buckets[0].dtype, layout.buckets[0].numel
        (1, torch.float32, 9)
    """

    def __init__(self, entries: Iterable[tuple[str, torch.dtype, Sequence[int]]], bucket_size_bytes: int) -> None:
        if bucket_size_bytes < 1:
            raise ValueError(f"bucket_size_bytes must be >= 1, got {bucket_size_bytes}")
        items = sorted(((n, d, tuple(int(s) for s in shape)) for n, d, shape in entries), key=_order)
        names = [n for n, _, _ in items]
        if len(set(names)) != len(names):
            raise ValueError("tensor names in a bucket layout must be unique")
        self.bucket_size_bytes = bucket_size_bytes
        self._entries = items
        buckets: list[BucketSpec] = []
        current: list[TensorSlot] = []
        current_dtype: torch.dtype | None = None
        current_numel = 0

        def close() -> None:
            nonlocal current, current_numel
            if current:
                buckets.append(BucketSpec(current_dtype, current_numel, tuple(current)))  # type: ignore[arg-type]
            current, current_numel = [], 0

        for name, dtype, shape in items:
            numel = 1
            for s in shape:
                numel *= s
            nbytes = numel * dtype.itemsize
            if dtype != current_dtype or (current and (current_numel * dtype.itemsize + nbytes > bucket_size_bytes)):
                close()
                current_dtype = dtype
            current.append(TensorSlot(name, shape, len(buckets), current_numel, numel))
            current_numel += numel
            if nbytes > bucket_size_bytes:  # alone in its own bucket
                close()
        close()
        self.buckets: tuple[BucketSpec, ...] = tuple(buckets)
        self.segments: tuple[Segment, ...] = tuple(_segments(self.buckets, min(TRANSFER_MAX_BYTES, bucket_size_bytes)))
        """The transfers, in order, that move all buckets (same on sender and receiver)."""
        self.signature: str = hashlib.sha256(self.to_json().encode()).hexdigest()
        """SHA-256 (hex) of the layout's JSON form: equal on sender and receiver iff the layouts agree."""

    @classmethod
    def from_state(cls, state: Mapping[str, torch.Tensor], bucket_size_bytes: int) -> BucketLayout:
        """Layout for the tensors of `state`.

        Args:
            state (Mapping[str, torch.Tensor]): name -> tensor.
            bucket_size_bytes (int): bucket bound in bytes.

        Returns:
            BucketLayout: the layout.
        """
        return cls(((n, t.dtype, t.shape) for n, t in state.items()), bucket_size_bytes)

    def to_json(self) -> str:
        """Canonical JSON form (names, dtypes, shapes, bound) that `from_json` reads back.

        Returns:
            str: compact JSON.
        """
        return json.dumps(
            {
                "bucket_size_bytes": self.bucket_size_bytes,
                "tensors": [[n, _dtype_name(d), list(s)] for n, d, s in self._entries],
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, text: str) -> BucketLayout:
        """Rebuild a layout from `to_json` output.

        Args:
            text (str): the JSON.

        Returns:
            BucketLayout: an equal layout (same signature).

        Raises:
            ValueError: on a malformed document or unknown dtype.
        """
        doc = json.loads(text)
        return cls(((n, _dtype_from_name(d), s) for n, d, s in doc["tensors"]), int(doc["bucket_size_bytes"]))

    @property
    def nbytes(self) -> int:
        """Total bytes of all buckets (the model's size)."""
        return sum(b.nbytes for b in self.buckets)

    def segment_nbytes(self) -> list[int]:
        """Bytes of each segment (one transfer), in `segments` order."""
        return [s.numel * self.buckets[s.bucket].dtype.itemsize for s in self.segments]

    def pack_segment(self, segment: Segment, state: Mapping[str, torch.Tensor], out: torch.Tensor) -> torch.Tensor:
        """Copy the tensors (or the chunk) of `segment` from `state` into the front of `out`, cast to its dtype.

        Args:
            segment (Segment): one of `segments`.
            state (Mapping[str, torch.Tensor]): name -> tensor (any device and dtype: copied across and cast).
            out (torch.Tensor): flat buffer of the bucket's dtype with at least `segment.numel` elements.

        Returns:
            torch.Tensor: the view `out[:segment.numel]`.
        """
        flat = out[: segment.numel]
        end = segment.offset + segment.numel
        for slot in segment.slots:
            start = slot.offset - segment.offset
            if slot.offset >= segment.offset and slot.offset + slot.numel <= end:
                flat[start : start + slot.numel].view(slot.shape).copy_(state[slot.name])
            else:  # a chunk of a large tensor
                first = segment.offset - slot.offset
                flat.copy_(state[slot.name].reshape(-1)[first : first + segment.numel])
        return flat

    def allocate(self, index: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """An uninitialised flat tensor for bucket `index`.

        Args:
            index (int): bucket index.
            device (torch.device | str, optional): where to allocate. Defaults to "cpu".

        Returns:
            torch.Tensor: shape `[numel]`, the bucket's dtype.
        """
        spec = self.buckets[index]
        return torch.empty(spec.numel, dtype=spec.dtype, device=device)

    def unpack(self, index: int, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of bucket `index`'s tensors inside `flat` (no copy).

        Args:
            index (int): bucket index.
            flat (torch.Tensor): the bucket, shape `[numel]`, the bucket's dtype.

        Returns:
            dict[str, torch.Tensor]: name -> view of its shape.
        """
        return {s.name: flat[s.offset : s.offset + s.numel].view(s.shape) for s in self.buckets[index].slots}

    def unpack_all(self, flats: Sequence[torch.Tensor]) -> dict[str, torch.Tensor]:
        """Views of every tensor inside the given buckets, in layout order.

        Args:
            flats (Sequence[torch.Tensor]): one flat tensor per bucket.

        Returns:
            dict[str, torch.Tensor]: name -> view.
        """
        out: dict[str, torch.Tensor] = {}
        for index, flat in enumerate(flats):
            out.update(self.unpack(index, flat))
        return out


def _segments(buckets: Sequence[BucketSpec], transfer_bytes: int) -> list[Segment]:
    """Split `buckets` into transfers of at most `transfer_bytes` (one element at least)."""
    out: list[Segment] = []
    for index, bucket in enumerate(buckets):
        run: list[TensorSlot] = []
        for slot in bucket.slots:
            nbytes = slot.numel * bucket.dtype.itemsize
            if len(bucket.slots) == 1 or nbytes >= ZERO_COPY_MIN_BYTES:
                _flush_run(out, index, run)
                chunk = max(transfer_bytes // bucket.dtype.itemsize, 1)
                for first in range(0, max(slot.numel, 1), chunk):
                    numel = min(chunk, slot.numel - first)
                    out.append(Segment(index, slot.offset + first, numel, (slot,), True))
                continue
            run_bytes = (slot.offset + slot.numel - run[0].offset) * bucket.dtype.itemsize if run else 0
            if run_bytes > transfer_bytes:
                _flush_run(out, index, run)
            run.append(slot)
        _flush_run(out, index, run)
    return out


def _flush_run(out: list[Segment], bucket: int, run: list[TensorSlot]) -> None:
    """Close a run of adjacent small tensors of `bucket` as one packed segment appended to `out`; empties `run`."""
    if run:
        numel = run[-1].offset + run[-1].numel - run[0].offset
        out.append(Segment(bucket, run[0].offset, numel, tuple(run), False))
        run.clear()
