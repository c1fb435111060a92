"""Receiving a publish straight into the policy's own tensors: the model plus two transfer buffers, no copy.

With `policy.weightBuffer.bufferStrategy: none` an evaluator receives in place (`WeightReceiver.receive(into=...)`):
rollouts pause for the receive (`InPlaceTarget.begin_weight_receive`), a direct transfer (a large tensor, or a chunk
of one, whose dtype and device match the policy's) lands in the policy's tensor itself, and every other transfer
(packed small tensors, or a tensor cast for travel by `weightSync.dtype`) lands in one of two reused staging
buffers of at most `_buckets.TRANSFER_MAX_BYTES` each and is copied (and cast) into its tensors on arrival. So an
evaluator holds the model plus at most two transfers during a sync and just the model between syncs, where the
staged path (`single`) holds a second copy of the model while rollouts go on. A receive that stops part way leaves
the tensors holding no version (`end_weight_receive(None)`), which the evaluator treats as holding none.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import torch

from rlightning.weights import _buckets

STAGING_SLOTS = 2
"""Staging buffers of a receive in place: a transfer arrives in one while the previous one is unpacked and
forwarded from the other."""


class InPlaceTarget(Protocol):
    """What a receive in place writes into (`rlightning.policy.BasePolicy` provides it)."""

    def receive_targets(self) -> Mapping[str, torch.Tensor]:
        """Clean name -> the tensor a received tensor of that name is written into (no copy)."""
        ...

    def begin_weight_receive(self, timeout: float) -> bool:
        """Pause rollouts (waiting at most `timeout` seconds for running ones); False when they did not drain."""
        ...

    def end_weight_receive(self, version: int | None) -> None:
        """Resume rollouts; `version` is what the tensors now hold completely, None when they hold no version."""
        ...


class Landing:
    """Where each transfer of one publish lands when it is received in place, and the copy that completes it.

    Args:
        layout (BucketLayout): the publish's layout.
        targets (Mapping[str, torch.Tensor]): clean name -> the receiver's own tensor.
        device (torch.device): where the transport's tensors live (CPU for gloo, the GPU for NCCL).

    Raises:
        ValueError: when a tensor of the layout is missing from `targets` or has another shape (nothing was
            written).
    """

    def __init__(self, layout: _buckets.BucketLayout, targets: Mapping[str, torch.Tensor], device: torch.device):
        for bucket in layout.buckets:
            for slot in bucket.slots:
                target = targets.get(slot.name)
                if target is None:
                    raise ValueError(f"received tensor {slot.name!r} has no counterpart in the policy")
                if tuple(target.shape) != slot.shape:
                    raise ValueError(
                        f"received tensor {slot.name!r} has shape {list(slot.shape)}, the policy's {list(target.shape)}"
                    )
        self._layout, self._targets, self._device = layout, targets, device
        self._direct = [self._lands_directly(segment) for segment in layout.segments]
        staged = [
            segment.numel * layout.buckets[segment.bucket].dtype.itemsize
            for segment, direct in zip(layout.segments, self._direct, strict=True)
            if not direct
        ]
        size = max(staged, default=0)
        slots = STAGING_SLOTS if size else 0
        self._staging = [torch.empty(size, dtype=torch.uint8, device=device) for _ in range(slots)]
        self._slot_of: list[int | None] = []
        count = 0
        for direct in self._direct:
            self._slot_of.append(None if direct else count % STAGING_SLOTS)
            count += not direct

    def _lands_directly(self, segment: _buckets.Segment) -> bool:
        if not segment.direct:
            return False
        target = self._targets[segment.slots[0].name]
        dtype = self._layout.buckets[segment.bucket].dtype
        return target.dtype == dtype and target.device == self._device and target.is_contiguous()

    def slot(self, index: int) -> int | None:
        """The staging buffer segment `index` lands in, or None when it lands in its tensor directly."""
        return self._slot_of[index]

    def destination(self, index: int) -> torch.Tensor:
        """The flat tensor transfer `index` (of `layout.segments`) is received into.

        Returns:
            torch.Tensor: shape `[segment.numel]`, the bucket's dtype: a view of the policy's tensor, or of a
            staging buffer (reused two transfers later: `land` it first).
        """
        segment = self._layout.segments[index]
        dtype = self._layout.buckets[segment.bucket].dtype
        slot = self._slot_of[index]
        if slot is None:
            first = segment.offset - segment.slots[0].offset
            return self._targets[segment.slots[0].name].view(-1)[first : first + segment.numel]
        return self._staging[slot][: segment.numel * dtype.itemsize].view(dtype)

    def land(self, index: int, received: torch.Tensor) -> None:
        """Copy a staged transfer into its tensors (cast to their dtype); nothing to do for a direct one.

        Args:
            index (int): the segment's index.
            received (torch.Tensor): what `destination(index)` returned, now received.
        """
        if self._slot_of[index] is None:
            return
        segment = self._layout.segments[index]
        for slot in segment.slots:
            target = self._targets[slot.name]
            if slot.offset >= segment.offset and slot.offset + slot.numel <= segment.offset + segment.numel:
                start = slot.offset - segment.offset
                target.copy_(received[start : start + slot.numel].view(target.shape))
            else:  # a chunk of a large tensor (cast for travel, or in a staging buffer)
                first = segment.offset - slot.offset
                if target.is_contiguous():
                    target.view(-1)[first : first + segment.numel].copy_(received)
                else:  # reshape copies a non-contiguous tensor: write the chunk into the copy, then back
                    flat = target.reshape(-1)
                    flat[first : first + segment.numel].copy_(received)
                    target.copy_(flat.view(target.shape))
