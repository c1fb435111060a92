"""One receiver's part in one publish: the header and every transfer from its parents, relayed to its children on
arrival (`_relay`), the sender's commit, the acknowledgement, and `lost` acknowledgements for the subtrees it cut off.

The receiver's session (`_receiver_session`: the store, its registration, the edges of its group) outlives the
rounds; a round ends with the publish, or raises `RoundFailed` and the receiver registers again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import queue
import threading
import time

import torch
import torch.distributed as dist

from rlightning.config import SyncTimings
from rlightning.weights import _buckets, _destination, _inplace, _messages, _relay, _store, _topology, _transport

log = logging.getLogger(__name__)


class RoundFailed(Exception):
    """This publish cannot be used; the receiver drops its group and registers again."""


@dataclasses.dataclass
class GroupEdges:
    """A receiver's edges in one generation of its group's relay trees (`_topology.relay_trees`).

    Attributes:
        index (int): the group's index.
        generation (int): the group's generation; a re-formed group gets new edges.
        parents (list[BroadcastGroup]): the edge from this receiver's parent in each tree, in tree order.
        children (list[ChildEdge]): the edges to the receivers it relays to.
    """

    index: int
    generation: int
    parents: list[_transport.BroadcastGroup] = dataclasses.field(default_factory=list)
    children: list[_relay.ChildEdge] = dataclasses.field(default_factory=list)

    def close(self) -> None:
        """Close every edge; the children's transfers fail at once: they register again, re-planned without it."""
        for parent in self.parents:
            parent.close()
        for child in self.children:
            child.close()


def _put_index(done: queue.SimpleQueue[int], index: int, _future: object) -> None:
    """Future callback: transfer `index` finished (it runs in gloo's thread, so it only enqueues)."""
    done.put(index)


class _Inbound:
    """The edges from this receiver's parents, one per relay tree, and those that broke during this publish.

    A broken edge drops the children of that tree (`_relay.Forwarder.drop_tree`): this receiver will not have its
    transfers. The other trees' transfers keep arriving and are relayed, so a break costs one tree's subtree only.

    Args:
        edges (list[BroadcastGroup]): the edge from the parent in each tree, in tree order.
        forwarder (Forwarder): this publish's forwarding to the children.
    """

    def __init__(self, edges: list[_transport.BroadcastGroup], forwarder: _relay.Forwarder) -> None:
        self.edges, self._forwarder = edges, forwarder
        self.broken: dict[int, str] = {}
        """tree -> why its edge from the parent broke."""

    def start(self, tree: int, tensor: torch.Tensor) -> dist.Work | None:
        """Start receiving `tensor` from the parent in `tree`; None when that edge is broken.

        Raises:
            RuntimeError: when every tree's edge broke (nothing more can arrive).
        """
        if tree not in self.broken:
            try:
                return self.edges[tree].broadcast(tensor)
            except RuntimeError as exc:
                self.lose(tree, str(exc))
        return None

    def wait(self, tree: int, work: dist.Work | None) -> bool:
        """Wait for `work` (from `start`) to arrive; False when the edge of `tree` is broken (or breaks now).

        Raises:
            RuntimeError: when every tree's edge broke (nothing more can arrive).
        """
        if work is None or tree in self.broken:
            return False
        edge = self.edges[tree]
        deadline = time.monotonic() + edge.timeout
        if self._forwarder.forming():
            # a child whose edge forms meanwhile gets what arrived: with two trees it may be this member's parent in
            # the other tree, waiting for the header before it relays what this member waits for
            here = threading.Event()
            work.get_future().add_done_callback(lambda _: here.set())
            while not here.wait(_relay.FORMING_POLL_SECONDS) and time.monotonic() < deadline:
                if not self._forwarder.forming():
                    break
                self._forwarder.push()
        try:
            edge.wait_work(work, deadline)
        except RuntimeError as exc:
            self.lose(tree, str(exc))
            return False
        return True

    def lose(self, tree: int, error: str) -> None:
        """Mark the edge of `tree` broken and drop that tree's children.

        Raises:
            RuntimeError: when every tree's edge is broken now.
        """
        self.broken.setdefault(tree, error)
        self._forwarder.drop_tree(tree, f"its relay lost its parent in tree {tree}: {error}")
        if len(self.broken) == len(self.edges):
            raise RuntimeError(error)


class ReceiverRound:
    """One receiver's part in one publish `ann` of its group, over the edges its session formed.

    `receive` takes the header and every transfer from the parents (transfer i >= 1 down tree `trees_of[i - 1]`,
    `_topology.split`), relaying each to the children as soon as it is here (`_relay.Forwarder`), and waits for the
    sender's commit; `acknowledge` posts the acknowledgement and waits (one step at most) for the children's.

    Args:
        store (dist.TCPStore): the sender's store.
        ann (Publish): the announcement of the publish.
        ordinal (int): this receiver's ordinal.
        plans (tuple[dict[int, Place], ...]): the group's relay trees (`_topology.relay_trees`).
        edges (GroupEdges): this receiver's edges in them.
        layout (BucketLayout): the publish's buckets.
        destination (Destination): where the transfers land (`_destination`).
        timings (SyncTimings): the bound of every wait.
    """

    def __init__(
        self,
        store: dist.TCPStore,
        ann: _messages.Publish,
        ordinal: int,
        plans: tuple[dict[int, _topology.Place], ...],
        edges: GroupEdges,
        layout: _buckets.BucketLayout,
        destination: _destination.Destination,
        timings: SyncTimings,
    ) -> None:
        self.store, self.ann, self.ordinal, self.plans, self.timings = store, ann, ordinal, plans, timings
        self.group, self.parents, self.children = edges.index, edges.parents, edges.children
        self.layout, self.destination = layout, destination
        self.transfers = [torch.zeros(4, dtype=torch.int64, device=edges.parents[0].device), *destination.segments]
        """The header, then the destination's segments."""
        self.trees_of = _topology.split(layout.segment_nbytes(), ann.trees)
        self.forwarder = _relay.Forwarder(edges.children, self.transfers, self.trees_of)

    def receive(self) -> None:
        """Receive the whole publish, relaying it, and wait for the sender's commit; the destination is aborted
        when either fails.

        Raises:
            RoundFailed: when the publish cannot be used (see `_receive_broadcast`, `_wait_commit`).
        """
        try:
            self._receive_broadcast()
            self._wait_commit()
        except BaseException:
            self.destination.abort()
            raise

    def _receive_broadcast(self) -> None:
        """Receive the header and every transfer of the publish from the parents, relaying each on arrival.

        When the edge from the parent in one of two trees breaks, the other tree's transfers are still received
        and relayed (its children there get the publish) before the publish is dropped here.

        Raises:
            RoundFailed: when the header does not match the announcement, rollouts did not pause in time, or an
                edge from a parent broke (the subtree it cut off is then reported `lost`).
        """
        ann, layout, transfers, forwarder = self.ann, self.layout, self.transfers, self.forwarder
        inbound = _Inbound(self.parents, forwarder)
        try:
            expected = _transport.header_tensor(
                ann.seq, ann.version, len(layout.buckets), layout.signature, transfers[0].device
            )
            transfers[0].copy_(expected)  # what the children get: the announcement's header
            headers = [torch.zeros_like(expected) for _ in self.parents]
            works = [inbound.start(tree, header) for tree, header in enumerate(headers)]
            # relayed at once, down every tree, before this member's own headers arrive: waiting for them would
            # make a root of one tree wait for its header in the other, which comes down that tree's depth first
            # (a first publish, whose edges form on the way, could run out of time); each child checks its own
            forwarder.advance(1)
            for tree, header in enumerate(headers):
                if inbound.wait(tree, works[tree]) and not torch.equal(header, expected):
                    raise RoundFailed(
                        f"header {header.tolist()} does not match announcement {ann.seq} (version {ann.version})"
                    )
            if not self.destination.begin(self.timings.pause):
                raise RoundFailed(f"rollouts did not pause within {self.timings.pause:.1f} s for publish {ann.seq}")
            self._receive_transfers(inbound)
        except RuntimeError as exc:
            for tree in range(len(self.parents)):  # every tree is cut here: as if each edge broke
                inbound.broken.setdefault(tree, str(exc))
        if not inbound.broken:
            return
        for tree, error in sorted(inbound.broken.items()):
            # the edge from the parent broke: this subtree cannot have the version, nor acknowledges a parent that
            # has not yet: it died, or dropped this publish and closed its edges (the sender knows when its edge
            # to a root broke)
            parent = self.plans[tree][self.ordinal].parent
            cut = _topology.subtree(self.plans[tree], self.ordinal) + ([] if parent is None else [parent])
            self._report_lost(cut, f"the edge into ordinal {self.ordinal} in tree {tree} broke: {error}")
        if len(inbound.broken) < len(self.parents):  # the other tree's children got their transfers: let them end
            self._finish_children()
        raise RoundFailed(f"broadcast of publish {ann.seq} failed: {inbound.broken}")

    def _wait_commit(self) -> None:
        """Wait for the sender's commit of the publish for this group (`SyncTimings.commit_wait`, `commit_bound`).

        Raises:
            RoundFailed: when the sender did not commit it (a transfer to the group failed) or not in time.
        """
        store, seq = self.store, self.ann.seq
        commit = _store.commit(seq, self.group)

        def committed() -> bool:
            missing = _store.wait_keys(store, [commit], self.timings.commit_wait)
            return not missing and _messages.read(store, commit, _messages.COMMIT).ok

        if not _store.bounded(committed, self.timings.commit_bound, f"the commit of publish {seq}"):
            raise RoundFailed(f"sender did not commit publish {seq} for group {self.group}")

    def acknowledge(self, ack: _messages.Ack) -> None:
        """Post `ack` (and confirm it to the parents), then wait (one step at most) for the children to get
        everything and confirm theirs; report the subtrees cut off.

        Args:
            ack (Ack): this receiver's acknowledgement of the publish.
        """
        key = _store.ack(self.ann.seq, self.ordinal)
        _store.bounded(lambda: _messages.write(self.store, key, ack), self.timings.step, "an acknowledgement")
        for places, parent in zip(self.plans, self.parents, strict=True):
            if places[self.ordinal].parent is not None:
                _relay.confirm(parent)  # the parent sees this edge break if this receiver dies before it
        # acknowledged first: a slow child delays no ack
        self._finish_children()

    def _finish_children(self) -> None:
        """Wait (one step at most) for the children to get everything and confirm their acknowledgements; report
        the subtree (in the child's tree) of each that did not.
        """
        trees = {child.ordinal: child.tree for child in self.children}
        for child, why in self.forwarder.finish(time.monotonic() + self.timings.step).items():
            self._report_lost(_topology.subtree(self.plans[trees[child]], child), f"relay {self.ordinal}: {why}")

    def _receive_transfers(self, inbound: _Inbound) -> None:
        """Receive every transfer after the header, in the sender's order, relaying each one as soon as it is here.

        Each transfer lands on arrival (`Destination.land`); one in a reused staging buffer (in place) is unpacked
        into the policy's tensors then, and its buffer is reused only once the children got it too
        (`Forwarder.release`).

        Transfer i >= 1 comes from the parent in tree `trees_of[i - 1]` (`_topology.split`); one whose edge broke
        is skipped (this publish is then dropped once the other trees' transfers were relayed).

        Raises:
            RuntimeError: when every edge from a parent failed or timed out.
        """
        transfers, trees_of, forwarder, destination = self.transfers, self.trees_of, self.forwarder, self.destination
        # transfers of two trees arrive independently: each is landed and relayed as soon as it is here, whatever
        # the other tree's; waiting for them in order would make a member that relays one tree wait for the other
        # tree's previous transfer, which may itself come through the first (a cycle that serializes the trees)
        done: queue.SimpleQueue[int] = queue.SimpleQueue()  # indices whose receive finished (or failed)
        inflight: dict[int, tuple[int, dist.Work | None]] = {}  # index -> (tree, its receive)
        landed: set[int] = set()
        last_in_slot: list[int | None] = [None] * _inplace.STAGING_SLOTS  # transfer last received into each
        bound = self.timings.edge_from_parent + self.timings.step  # past every receive's own timeout

        def arrive() -> None:
            end = time.monotonic() + bound
            while True:
                left = end - time.monotonic()
                forming = forwarder.forming()  # then checked often, as in `_Inbound.wait`
                try:
                    index = done.get(timeout=max(min(left, _relay.FORMING_POLL_SECONDS) if forming else left, 0.0))
                    break
                except queue.Empty:
                    if time.monotonic() >= end:
                        raise RuntimeError(f"no transfer arrived within {bound:g} s") from None
                    forwarder.push()
            if inbound.wait(*inflight.pop(index)):
                destination.land(index - 1, transfers[index])
                forwarder.arrived(index)  # relay each transfer as soon as it is here
            landed.add(index)

        for index in range(1, len(transfers)):
            if len(inflight) >= _transport.MAX_IN_FLIGHT:
                arrive()
            slot = destination.slot(index - 1)
            if slot is not None:
                previous = last_in_slot[slot]
                if previous is not None:  # its buffer is reused: unpacked and relayed first
                    while previous not in landed:
                        arrive()
                    forwarder.release(previous + 1, time.monotonic() + self.timings.step)
                last_in_slot[slot] = index
            tree = trees_of[index - 1]
            work = inbound.start(tree, transfers[index])
            inflight[index] = (tree, work)
            if work is None:
                done.put(index)
            else:
                work.get_future().add_done_callback(functools.partial(_put_index, done, index))
        while inflight:
            arrive()

    def _report_lost(self, ordinals: list[int], why: str) -> None:
        """Acknowledge the publish as `lost` for `ordinals` where they did not acknowledge yet, so the sender
        stops waiting for them at once; skipped once the sender deleted the publish's keys (it moved on).
        """
        lost = _messages.Ack("lost", -1, why)

        def post() -> None:
            if self.store.check([_store.announce(self.ann.seq)]):
                for ordinal in ordinals:
                    _messages.write_absent(self.store, _store.ack(self.ann.seq, ordinal), lost)

        try:
            _store.bounded(post, self.timings.step, "lost acknowledgements")
        except RuntimeError as exc:  # the sender learns it from the missing acknowledgements, one timeout later
            log.warning("receiver %d: could not report ordinals %s lost: %s", self.ordinal, ordinals, exc)
