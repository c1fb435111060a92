"""The forwarding loop of a relay: pass each transfer on to the children as soon as it has arrived.

A receiver with children in its relay tree (`_topology`) feeds one edge per child (a two-rank
`_transport.BroadcastGroup`, formed in the background). Forwarding never waits for a child while transfers still
arrive: each child's transfers queue on its own edge (gloo's worker threads of that group move them), so a slow
child holds up neither the relay's own receiving nor its siblings; at the end the relay waits for every child
until one deadline, and a child that missed it (or whose edge broke) is dropped with its subtree for this
publish (the receiver acknowledges them `lost`, so the sender need not wait for them). What is queued are views
of the relay's own received buckets, so forwarding allocates nothing. With two relay trees
(`_topology.relay_trees`) each child gets the transfers of the tree it is this relay's child in
(`_topology.carried`), and a relay whose edge from its parent in one tree broke still forwards the other tree's.

Once a child acknowledged a publish on the store, it also confirms it up its edge (`confirm`, one byte sent from
the child), and the relay waits for that confirmation until the same deadline: a child that dies after its last
transfer left, but before it acknowledged, breaks the edge the relay is then receiving on, so the relay reports it
at once instead of the sender waiting one timeout for an acknowledgement that cannot come.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import logging
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from rlightning.weights import _topology, _transport

log = logging.getLogger(__name__)

CHILD_RANK = 1
"""A relay edge's ranks: the relay (parent) is rank 0 and sends the transfers, the child is rank 1."""
FORMING_POLL_SECONDS = 0.05
"""While a child's edge is still forming, a relay waiting for its own transfers checks this often whether it formed,
and sends it what arrived (`Forwarder.push`): with two trees that child may be this relay's parent in the other tree,
waiting for the header before it relays what this relay waits for."""


def confirm(edge: _transport.BroadcastGroup) -> None:
    """Confirm, from the child's side of `edge`, that this publish is acknowledged (`Forwarder.finish` waits for it).

    Not waited for: the send completes once the relay takes it, and a relay that is gone breaks the edge anyway.

    Args:
        edge (BroadcastGroup): the edge from this receiver's parent (this side is `CHILD_RANK`).
    """
    edge.broadcast(torch.ones(1, dtype=torch.uint8, device=edge.device), root=CHILD_RANK)


class ChildEdge:
    """The edge from this relay into one child: formed in the background, kept for the tree's generation.

    Args:
        ordinal (int): the child's ordinal.
        forming (concurrent.futures.Future): resolves to the edge (`BroadcastGroup`, this side rank 0) or raises.
        tree (int): the relay tree it is this relay's child in (`_topology.relay_trees`).
    """

    def __init__(self, ordinal: int, forming: concurrent.futures.Future, tree: int) -> None:
        self.ordinal, self.tree = ordinal, tree
        self._forming = forming
        self.edge: _transport.BroadcastGroup | None = None
        self.error: str | None = None
        """Why the edge is unusable (it stays so until the tree is re-planned), or None."""

    def ready(self, wait: float = 0.0) -> _transport.BroadcastGroup | None:
        """The formed edge; None while it is still forming after `wait` seconds, or once it failed."""
        if self.edge is None and self.error is None:
            try:
                self.edge = self._forming.result(timeout=max(wait, 0.0))
            except concurrent.futures.TimeoutError:
                return None
            except RuntimeError as exc:
                self.fail(f"forming the edge failed: {exc}")
        return self.edge

    def fail(self, error: str) -> None:
        """Mark the edge unusable and release it (the child's pending transfers fail)."""
        if self.error is None:
            self.error = error
        if self.edge is not None:
            self.edge.close()
            self.edge = None

    def close(self) -> None:
        """Release the edge, also when it is still forming (it is closed once formed)."""
        self.fail("closed")
        self._forming.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or f.result().close())


class Forwarder:
    """Forwards one publish's transfers, in order, to every usable child edge.

    Args:
        children (list[ChildEdge]): this relay's children (failed ones are skipped).
        transfers (list[torch.Tensor]): every transfer of the publish in order (header first), as views of
            the relay's own received buffers; transfer i may be forwarded once `arrived(i)` or `advance(i + 1)`
            was called.
        trees_of (Sequence[int]): the relay tree of each transfer after the header (`_topology.split`); a child
            gets those of its own tree (`_topology.carried`).
    """

    def __init__(self, children: list[ChildEdge], transfers: list[torch.Tensor], trees_of: Sequence[int]) -> None:
        self._children = children
        self._transfers = transfers
        # child ordinal -> the indices of the transfers it gets, and how many of them were queued on its edge
        self._carried = {c.ordinal: _topology.carried(trees_of, c.tree) for c in children}
        self._sent = {child.ordinal: 0 for child in children}
        self._works: dict[int, collections.deque[dist.Work]] = {c.ordinal: collections.deque() for c in children}
        self._here = [False] * len(transfers)  # transfer index -> arrived completely

    def advance(self, available: int) -> None:
        """Queue every arrived transfer on every child edge that is formed; never blocks on a child.

        Args:
            available (int): how many transfers, from the first, have arrived completely.
        """
        self._here[:available] = [True] * available
        self._push()

    def arrived(self, index: int) -> None:
        """Transfer `index` arrived completely (those of two trees arrive independently): queue what the children
        of its tree can get now, in order; never blocks on a child.
        """
        self._here[index] = True
        self._push()

    def _push(self) -> None:
        for child in self._children:
            edge = child.ready()
            if edge is None:
                continue
            works, carried = self._works[child.ordinal], self._carried[child.ordinal]
            try:
                while works and works[0].is_completed():  # reap, so a broken edge is noticed early
                    works.popleft().wait()
                while self._sent[child.ordinal] < len(carried) and self._here[carried[self._sent[child.ordinal]]]:
                    works.append(edge.broadcast(self._transfers[carried[self._sent[child.ordinal]]]))
                    self._sent[child.ordinal] += 1
            except RuntimeError as exc:
                child.fail(f"forwarding failed: {exc}")

    def forming(self) -> bool:
        """Whether the edge to some child is still forming (it gets what arrived at the next `push` once formed)."""
        return any(child.edge is None and child.error is None for child in self._children)

    def push(self) -> None:
        """Queue what arrived on every child edge formed since; never blocks on a child."""
        self._push()

    def drop_tree(self, tree: int, error: str) -> None:
        """Drop every child in relay tree `tree`: this relay will not have that tree's transfers (its edge from its
        parent there broke), so they miss this publish (their edges close and they report it).

        Args:
            tree (int): the tree.
            error (str): why, reported by `finish`.
        """
        for child in self._children:
            if child.tree == tree:
                child.fail(error)

    def release(self, count: int, deadline: float) -> None:
        """Wait, at most until `deadline`, for every child to have received the first `count` transfers, so
        their memory may be reused (a receive in place reuses two staging buffers, `_inplace`).

        A child that misses the deadline, or whose edge has not formed by then, is dropped for this publish, as
        in `finish` (it reports there).

        Args:
            count (int): transfers, from the first, that must have left (at most the arrived ones).
            deadline (float): `time.monotonic()` bound shared by all children.
        """
        for child in self._children:
            if child.error is None and child.ready(deadline - time.monotonic()) is None and child.error is None:
                child.fail("the edge did not form before its buffer was reused")
        self._push()
        for child in self._children:
            works = self._works[child.ordinal]
            needed = bisect.bisect_left(self._carried[child.ordinal], count)  # its transfers below `count`
            try:
                while works and child.edge is not None and self._sent[child.ordinal] - len(works) < needed:
                    child.edge.wait_work(works.popleft(), deadline)
            except RuntimeError as exc:
                child.fail(f"forwarding failed: {exc}")

    def finish(self, deadline: float) -> dict[int, str]:
        """Forward the rest and wait, at most until `deadline`, for every child to have received everything and
        confirmed its acknowledgement (`confirm`).

        Args:
            deadline (float): `time.monotonic()` bound shared by all children.

        Returns:
            dict[int, str]: child ordinal -> why it did not get the publish (its subtree did not either).
        """
        for child in self._children:
            if child.ready(deadline - time.monotonic()) is None and child.error is None:
                child.fail("the edge did not form in time")
        self._push()
        for child in self._children:
            works = self._works[child.ordinal]
            try:
                while works and child.edge is not None:
                    child.edge.wait_work(works.popleft(), deadline)
            except RuntimeError as exc:
                child.fail(f"forwarding failed: {exc}")
        for child in self._children:
            try:
                if child.edge is not None:
                    confirmation = torch.zeros(1, dtype=torch.uint8, device=child.edge.device)
                    child.edge.wait_work(child.edge.broadcast(confirmation, root=CHILD_RANK), deadline)
            except RuntimeError as exc:
                child.fail(f"no confirmation of its acknowledgement: {exc}")
        failed = {c.ordinal: c.error for c in self._children if c.error is not None}
        for ordinal, error in failed.items():
            log.warning("relay: child %d misses this publish: %s", ordinal, error)
        return failed
