"""Where a receiver puts one publish: a destination strategy, chosen once per publish (`WeightReceiver`).

As in TorchRL's weight-sync schemes, the receiving loop does not branch on how the weights are held: it asks its
destination where each transfer goes (`segments`, `slot`), tells it when one arrived (`land`), and hands it the
committed version (`complete`) or the failure (`abort`).

- `Staged`: fresh buckets that the returned state owns; the caller, or an `apply` hook, makes the version used
  (buffer strategy `single`; also a version already held, or one whose tensors do not fit the policy).
- `InPlace`: the policy's own tensors plus two reused staging buffers (`_inplace.Landing`), rollouts paused from
  the first transfer to the commit (buffer strategy `none`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol

import torch

from rlightning.weights import _buckets, _inplace

Apply = Callable[[int, dict[str, torch.Tensor]], None]
"""`apply(version, state)`: make `state` the weights every rollout that starts afterwards uses; raise if it cannot."""


class NotApplied(Exception):
    """The version arrived and was committed but is not used: the receiver acknowledges it `failed`.

    Args:
        why (str): for the log, e.g. "does not fit the policy: ...".
        error (str): what the sender reports for this receiver (the `repr` of the cause).
    """

    def __init__(self, why: str, error: str) -> None:
        super().__init__(why)
        self.error = error


class Destination(Protocol):
    """Where the transfers of one publish land, and what makes the committed version used."""

    segments: list[torch.Tensor]
    """Flat tensor each segment of the layout (`BucketLayout.segments`, in order) is received into."""
    staged: bool
    """True when fresh buckets of this layout are worth preparing for the next publish (`Staged` only)."""

    def slot(self, index: int) -> int | None:
        """The reused staging buffer segment `index` lands in (landed before its reuse), or None."""
        ...

    def begin(self, timeout: float) -> bool:
        """Called once the header matched, before any segment: False when rollouts did not pause in `timeout` s."""
        ...

    def land(self, index: int, received: torch.Tensor) -> None:
        """Segment `index` arrived in `segments[index]` (a staged one is copied into its tensors)."""
        ...

    def abort(self) -> None:
        """The publish failed after `begin`: release what `begin` took."""
        ...

    def complete(self, version: int) -> Mapping[str, torch.Tensor]:
        """The version is committed: make it used, and return name -> tensor.

        Raises:
            NotApplied: when it cannot be used (the receiver keeps its version and acknowledges `failed`).
        """
        ...


class Staged:
    """Receive into fresh buckets; the returned state owns them (one copy of the model besides the policy's).

    Args:
        layout (BucketLayout): the publish's layout.
        flats (list[torch.Tensor]): one fresh flat bucket per `layout.buckets` entry.
        apply (Apply | None): makes the version used before it is acknowledged; None: the caller applies it.
        unfit (ValueError | None, optional): why the policy's tensors cannot take it in place (the version is
            received aside and acknowledged `failed`). Defaults to None.
    """

    staged = True

    def __init__(
        self,
        layout: _buckets.BucketLayout,
        flats: list[torch.Tensor],
        apply: Apply | None,
        unfit: ValueError | None = None,
    ) -> None:
        self._layout, self._flats, self._apply, self._unfit = layout, flats, apply, unfit
        self.segments = [flats[seg.bucket][seg.offset : seg.offset + seg.numel] for seg in layout.segments]

    def slot(self, index: int) -> int | None:
        return None

    def begin(self, timeout: float) -> bool:
        return True

    def land(self, index: int, received: torch.Tensor) -> None:
        pass  # the segment is already where the state holds it

    def abort(self) -> None:
        pass  # nothing taken: the buckets are dropped

    def complete(self, version: int) -> Mapping[str, torch.Tensor]:
        state = self._layout.unpack_all(self._flats)
        if self._unfit is not None:
            raise NotApplied(f"does not fit the policy: {self._unfit}", repr(self._unfit))
        if self._apply is not None:
            try:
                self._apply(version, dict(state))
            except Exception as exc:  # whatever the policy raised: reported, never acknowledged
                raise NotApplied(f"applying it failed: {exc!r}", repr(exc)) from exc
        return state


class InPlace:
    """Receive straight into the policy's tensors (`_inplace`), rollouts paused from `begin` to the end.

    Args:
        layout (BucketLayout): the publish's layout.
        into (InPlaceTarget): the policy.
        device (torch.device): where the transport's tensors live.

    Raises:
        ValueError: when the policy's tensors do not fit the layout (`_inplace.Landing`); nothing was written.
    """

    staged = False

    def __init__(self, layout: _buckets.BucketLayout, into: _inplace.InPlaceTarget, device: torch.device) -> None:
        self._landing = _inplace.Landing(layout, into.receive_targets(), device)
        self._into = into
        self._paused = False  # a failure from then on leaves the policy holding no version
        self.segments = [self._landing.destination(i) for i in range(len(layout.segments))]

    def slot(self, index: int) -> int | None:
        return self._landing.slot(index)

    def begin(self, timeout: float) -> bool:
        self._paused = self._into.begin_weight_receive(timeout)
        return self._paused

    def land(self, index: int, received: torch.Tensor) -> None:
        self._landing.land(index, received)

    def abort(self) -> None:
        if self._paused:
            self._paused = False
            self._into.end_weight_receive(None)  # part of the version was written: it holds none

    def complete(self, version: int) -> Mapping[str, torch.Tensor]:
        self._paused = False
        self._into.end_weight_receive(version)
        return self._into.receive_targets()
