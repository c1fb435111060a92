"""The receiving side of the protocol: register, follow announcements, form the relay edges, receive, acknowledge.

While it receives, a receiver relays each transfer on to its children in its group's relay tree (`_relay`), or in
each of its group's two trees, receiving alternate transfers from a parent in each (`_topology.relay_trees`).
"""

from __future__ import annotations

import concurrent.futures
import functools
import logging
import queue
import threading
import time
import uuid
from collections.abc import Mapping

import torch
import torch.distributed as dist

from rlightning.config import WeightSyncConfig
from rlightning.weights import (
    _buckets,
    _destination,
    _epoch,
    _fingerprint,
    _inplace,
    _messages,
    _nccl,
    _relay,
    _store,
    _topology,
    _transport,
    _types,
)

log = logging.getLogger(__name__)

CLOSED_RECONNECT_SECONDS = 1.0
"""After a sender's close, how long a receiver waits before it connects again. It drops its store connections on
reading the close, and the sender stops its store once every receiver has acknowledged (at once, normally): a call
still in flight on a store that stops makes torch log a warning with a C++ stack trace. A restarted sender (a new
attempt) takes longer than this to come up."""
EPOCHS_KEPT = 16
"""Versions whose epoch `WeightReceiver.epoch_of` remembers, the newest applied: a batch acted with an older one is
stale for any trainer long before."""


class _RoundFailed(Exception):
    """This publish cannot be used; the receiver drops its group and registers again."""


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


class WeightReceiver:
    """Receives versioned weights from a `WeightSender` (one per evaluator process).

    Nothing blocks in the constructor: `receive` connects to the store (retrying with backoff, so an evaluator
    may start before the trainer), registers `ordinal` with the newest version it received (so a restarted
    sender publishes above it, see `WeightSender.fleet_version`) and then waits for announcements. Between publishes
    the receiver waits on the store, never inside a collective; call `receive` continuously (e.g. from a
    background thread) so it joins every publish within `timeout_seconds`, else it is evicted and registers
    again. Publishes are ordered by `(epoch, version)`, the epoch being the sender's trainer attempt (`_epoch`): a
    publish not above the one received last is never returned, and one of an epoch below the highest this receiver
    has seen (a trainer of an older attempt that came back) is refused, acknowledged `refused`, logged naming both
    epochs and counted in `refused`. The receiver's collectives wait
    up to `SyncTimings.edge_from_parent` (twice `timeout_seconds`): the sender may spend one timeout on a stalled
    group before it goes on with the others, and a healthy group must outlast that. Every bound comes from
    `config.timings` (`SyncTimings`).

    In its group's relay tree (`_topology`) a receiver forwards each transfer to its children (at most
    `relay_fanout`) as soon as it has arrived; `receive` returns once its children got the whole publish and
    confirmed their acknowledgements (`_relay.confirm`), or one `timeout_seconds` after its own acknowledgement,
    whichever comes first.

    The sender's host name is resolved only once its store answers (a trainer pod's DNS name does not resolve
    before the pod exists; until then the receiver keeps retrying, logging INFO). Every store call is bounded
    (`_store.bounded`) and, while idle, the receiver checks the sender's heartbeat (`_store.HeartbeatMonitor`):
    when it stands still for more than `SyncTimings.heartbeat_stale` (a node that vanished without FIN or RST) the
    receiver drops the connection and connects again, registering with the version it holds.

    Args:
        config (WeightSyncConfig): must equal the sender's (bucket size, timeout, backend).
        host (str): the sender's host.
        port (int): the weight-sync store's port.
        ordinal (int): this evaluator's stable ordinal (>= 0).

    Raises:
        ValueError: on a negative ordinal.

    Examples:
        >>> receiver = WeightReceiver(WeightSyncConfig(), "127.0.0.1", 29600, ordinal=0)
        >>> got = receiver.receive(timeout=30.0)
        >>> if got is not None:
        ...     version, state = got  # state: name -> CPU tensor (gloo) or CUDA tensor (nccl)
    """

    def __init__(self, config: WeightSyncConfig, host: str, port: int, ordinal: int) -> None:
        if ordinal < 0:
            raise ValueError(f"ordinal must be >= 0, got {ordinal}")
        self.config, self.host, self.port, self.ordinal = config, host, port, ordinal
        self._timings = config.timings
        self._store: dist.TCPStore | None = None
        self._report_store: dist.Store | None = None
        self._watcher: _store.KeyWatcher | None = None
        self._spares: _store.SpareConnections | None = None  # for the edges of a (re-)formed tree
        self._address = ""  # local address toward `host`, found once the store connected (the name resolves)
        self._monitor = _store.HeartbeatMonitor(self._timings)
        self._session = ""
        self._backoff = _store.Backoff()  # kept across `receive` calls: one attempt per backoff step
        self._join_event = 0
        self._next_seq = 1
        self._group: tuple[int, int] | None = None  # (group, generation) of the tree the edges below belong to
        self._parents: list[_transport.BroadcastGroup] = []  # the edge from this receiver's parent in each tree
        self._children: list[_relay.ChildEdge] = []  # the edges to the receivers it relays to
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # forms child edges in the background
        self._layouts: dict[str, _buckets.BucketLayout] = {}
        self._last_layout: tuple[_buckets.BucketLayout, torch.device] | None = None
        self._ready: tuple[tuple[str, torch.device], list[torch.Tensor]] | None = None
        self.version = 0
        """The newest version received (0 before the first)."""
        self.version_epoch = 0
        """The epoch of the sender `version` came from."""
        self.epoch = 0
        """The highest epoch seen in any announcement: publishes of a lower one are refused."""
        self.refused = 0
        """Publishes refused so far, their epoch below `epoch`."""
        self._epochs: dict[int, int] = {}  # version -> epoch of the newest versions applied, oldest first
        self.sender_closed = False
        """True after the sender announced `close()`, until the next announcement of a (restarted) sender."""
        self._closed_at = 0.0  # monotonic time the close was read

    # -- connection and membership ---------------------------------------------------------------------
    def _connect(self, deadline: float) -> dist.TCPStore:
        if self._store is None:
            if self.sender_closed:  # let the closing sender's store stop with no call of ours on it
                resume = self._closed_at + CLOSED_RECONNECT_SECONDS
                time.sleep(max(0.0, min(resume, deadline) - time.monotonic()))
                if time.monotonic() < resume:
                    raise TimeoutError("the closed sender's store may still be stopping")
            store = _store.connect_store(self.host, self.port, self._timings.step, deadline, self._backoff)
            self._store = store
            self._monitor = _store.HeartbeatMonitor(self._timings)
            if not self._address:
                self._address = _transport.local_address_toward(self.host, self.port)
            # bounded: a listening socket of a stopped sender accepts connections but never answers
            count = _store.bounded(lambda: store.add(_store.ANNOUNCE_COUNT, 0), self._timings.step, "a first read")
            # reports must not queue behind a blocking wait()
            self._report_store = _store.connect_again(store, self._timings.step)
            # one connection waits for announcements, for as long as this one lives (not one per publish)
            self._watcher = _store.KeyWatcher(_store.connect_again(store, self._timings.step), self._timings.step)
            # the edges of one formation (from the parent and to each child, in every tree); two once the first
            # formed (`_form_edges`), not at once: the fleet's connections at start are a burst of DNS lookups
            self._spares = _store.SpareConnections(store, self._edges_per_formation(), self._timings.step)
            self._next_seq = count + 1
            # joined once its edges need no new connection (within the caller's time), so its first publish does
            # not wait for one
            self._spares.wait_ready(min(_store.CONNECT_BOUND, max(deadline - time.monotonic(), 0.0)))
            self._register()
            log.info("receiver %d connected to %s:%d", self.ordinal, self.host, self.port)
        return self._store

    def _register(self) -> None:
        assert self._store is not None
        self._drop_group()
        self._session = uuid.uuid4().hex
        cuda = self.config.backend != "gloo" and _nccl.available()
        store = self._store
        # `version` lets a restarted sender publish above what the fleet already holds (`fleet_version`)
        event = _messages.Join(self.ordinal, self._session, cuda, self.version)

        def post() -> int:
            index = store.add(_store.MEMBER_COUNT, 1)
            _messages.write(store, _store.member_event(index), event)
            return index

        self._join_event = _store.bounded(post, self._timings.step, "a registration")  # a vanished sender never answers

    def _drop_group(self) -> None:
        for parent in self._parents:
            parent.close()
        for child in self._children:
            child.close()  # the children's transfers fail at once: they register again, re-planned without it
        self._parents, self._group, self._children = [], None, []

    def _disconnect(self) -> None:
        self._drop_group()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._spares is not None:
            self._spares.close()
        self._store, self._report_store, self._watcher, self._spares = None, None, None, None

    # -- receiving -------------------------------------------------------------------------------------
    def receive(
        self, timeout: float, apply: _destination.Apply | None = None, into: _inplace.InPlaceTarget | None = None
    ) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        """Wait up to `timeout` seconds for the next publish and receive it completely.

        A publish that has begun is finished (bounded by `timeout_seconds` per step) even past `timeout`.
        With `apply`, the acknowledgement means applied: `apply(version, state)` runs after the sender's commit
        and before the acknowledgement, so once `publish` returns, every receiver it counts in
        `receivers_acked` uses the version for every rollout that starts afterwards; when `apply` raises, the
        receiver acknowledges `failed` (the sender reports it in `failed`, never as acknowledged), keeps its
        version and returns None. It must return within `timeout_seconds` (the sender waits no longer).
        Without it, the acknowledgement means received (the caller applies what is returned).

        With `into`, the publish is received in place (`_inplace`): rollouts pause from the first transfer to the
        commit, the transfers land in `into`'s own tensors (the model plus two transfer buffers in memory, no
        second copy), the version is applied once committed, and the acknowledgement means applied as with
        `apply` (which is then not called). A receive that fails part way leaves `into` holding no version
        (`end_weight_receive(None)`); one whose tensors do not fit is received aside and acknowledged `failed`.

        Args:
            timeout (float): seconds to wait for a connection and an announcement.
            apply (Apply | None, optional): applies a received version, e.g. stage it and wait until the
                policy applied it between rollouts. Defaults to None.
            into (InPlaceTarget | None, optional): receive in place into this policy's tensors. Defaults to None.

        Returns:
            tuple[int, Mapping[str, torch.Tensor]] | None: (version, name -> tensor) in fresh memory owned by the
            caller (with `into`: `into`'s own tensors), or None when nothing complete arrived in time (or the
            sender announced its close).
        """
        deadline = time.monotonic() + timeout
        while True:
            try:
                store = self._connect(deadline)
                ann = self._next_announcement(store, deadline)
                if ann is None:
                    return None
                if isinstance(ann, _messages.Close):
                    _messages.write(store, _store.ack(ann.seq, self.ordinal), _messages.Ack("closed", self.version))
                    self.sender_closed, self._closed_at = True, time.monotonic()
                    log.info("receiver %d: the sender closed (weight version %d held); connecting again after %g s",
                             self.ordinal, self.version, CLOSED_RECONNECT_SECONDS)
                    self._disconnect()
                    return None
                self.sender_closed = False
                got = self._take_part(store, ann, apply, into)
                if got is not None:
                    return got
                continue
            except _RoundFailed as exc:
                log.warning("receiver %d: publish dropped (%s); registering again", self.ordinal, exc)
                try:
                    self._register()
                    continue
                except RuntimeError as lost:
                    reason = str(lost)
            except TimeoutError:  # no store within the deadline
                return None
            except (RuntimeError, OSError) as lost:  # store lost or silent (heartbeat): the sender is gone
                reason = str(lost)
            log.warning("receiver %d lost the weight-sync store (%s); reconnecting", self.ordinal, reason)
            self._disconnect()
            if time.monotonic() >= deadline:
                return None

    def _take_buckets(self, layout: _buckets.BucketLayout, device: torch.device) -> list[torch.Tensor]:
        ready, self._ready = self._ready, None
        if ready is not None and ready[0] == (layout.signature, device):
            return ready[1]
        return [layout.allocate(i, device) for i in range(len(layout.buckets))]

    def _prepare_buckets(self) -> None:
        """Allocate and page in fresh buckets for the next publish while waiting for it.

        The returned state owns its buckets (never reused), so fresh memory is needed per version; touching one
        byte per page here moves the page faults off the critical path. Same layout expected as last time.
        """
        if self._ready is not None or self._last_layout is None:
            return
        layout, device = self._last_layout
        flats = [layout.allocate(i, device) for i in range(len(layout.buckets))]
        if device.type == "cpu":
            for flat in flats:
                flat.view(-1).view(torch.uint8)[::4096].zero_()
        self._ready = ((layout.signature, device), flats)

    def _next_announcement(
        self, store: dist.TCPStore, deadline: float
    ) -> _messages.Publish | _messages.Close | None:
        self._prepare_buckets()
        self._monitor.check(store)

        def poll() -> tuple[int, bool]:
            newest = store.add(_store.ANNOUNCE_COUNT, 0)
            seq = max(newest, self._next_seq)  # skip publishes already missed: the sender has moved on
            return seq, store.check([_store.announce(seq)])

        # every call on the store is bounded (`_store.bounded`): a vanished sender never answers
        self._next_seq, present = _store.bounded(poll, self._timings.step, "a poll for announcements")
        key = _store.announce(self._next_seq)
        if not present:
            watcher = self._watcher
            assert watcher is not None  # set with the store (`_connect`)
            # wait in steps, checking the sender's heartbeat between them: a vanished sender sends no RST
            while not watcher.wait(key, min(deadline - time.monotonic(), self._timings.heartbeat_check)):
                self._monitor.check(store)
                if time.monotonic() >= deadline:
                    return None
        self._next_seq += 1
        return _store.bounded(
            lambda: _messages.read(store, key, _messages.ANNOUNCEMENT), self._timings.step, "an announcement"
        )

    def _take_part(
        self,
        store: dist.TCPStore,
        ann: _messages.Publish,
        apply: _destination.Apply | None,
        into: _inplace.InPlaceTarget | None,
    ) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        verdict = _epoch.judge(self.epoch, (self.version_epoch, self.version), (ann.epoch, ann.version))
        self.epoch = max(self.epoch, ann.epoch)  # seen: a newer attempt's trainer exists
        group = self._member_of(ann)
        if group is None:
            return None  # registered after the sender planned this publish: wait for the next one
        key = (group.index, group.generation)
        plans = _topology.relay_trees([m.ordinal for m in group.members], ann.fanout, ann.trees)
        if self._group != key:
            self._drop_group()
            self._form_edges(group, plans)
            self._group = key
        layout = self._layout(store, ann.signature)
        device = self._parents[0].device
        if verdict is not _epoch.Verdict.APPLY:  # received aside (so the relay tree stays whole), never applied
            apply, into = None, None
        else:  # before `apply`: rollouts may start with the version before `receive` returns
            self._epochs[ann.version] = ann.epoch
            for version in list(self._epochs)[:-EPOCHS_KEPT]:
                del self._epochs[version]
        destination = self._choose_destination(layout, device, apply, into)
        transfers = [torch.zeros(4, dtype=torch.int64, device=device), *destination.segments]  # header first
        trees_of = _topology.split(layout.segment_nbytes(), ann.trees)
        forwarder = _relay.Forwarder(self._children, transfers, trees_of)
        try:
            self._receive_broadcast(store, ann, plans, layout, transfers, trees_of, destination, forwarder)
            self._wait_commit(store, ann.seq, group.index)
        except BaseException:
            destination.abort()
            raise
        ack = self._verdict_ack(verdict, ann)
        state: Mapping[str, torch.Tensor] | None = None
        try:
            state = destination.complete(ann.version)
        except _destination.NotApplied as exc:
            log.error("receiver %d: version %d %s", self.ordinal, ann.version, exc)
            ack = _messages.Ack("failed", self.version, exc.error)
        self._acknowledge(store, ann.seq, ack, plans, forwarder)
        if verdict is _epoch.Verdict.IGNORE:
            log.warning("receiver %d: ignoring version %d, not newer than %d", self.ordinal, ann.version, self.version)
            return None
        if verdict is _epoch.Verdict.REFUSE:
            self.refused += 1
            log.error("receiver %d: %s (%d refused so far)", self.ordinal, ack.error, self.refused)
            return None
        # buckets for the next publish are prepared between publishes only on the staged path
        self._last_layout = (layout, device) if destination.staged else None
        if state is None:
            return None
        self.version, self.version_epoch = ann.version, ann.epoch
        return ann.version, state

    def _verdict_ack(self, verdict: _epoch.Verdict, ann: _messages.Publish) -> _messages.Ack:
        """The acknowledgement of `ann` for `verdict` (before `apply` ran: `failed` replaces `applied` if it raises)."""
        if verdict is _epoch.Verdict.APPLY:
            return _messages.Ack("applied", ann.version)
        if verdict is _epoch.Verdict.IGNORE:
            return _messages.Ack("ignored", self.version)
        return _messages.Ack(
            "refused",
            self.version,
            f"publish {ann.seq} of epoch {ann.epoch} (weight version {ann.version}) refused: epoch {self.epoch} was "
            f"seen; holding weight version {self.version} of epoch {self.version_epoch}",
        )

    def _member_of(self, ann: _messages.Publish) -> _messages.AnnouncedGroup | None:
        """The group of publish `ann` this receiver (this session) belongs to; None when it registered too late.

        Raises:
            _RoundFailed: when the sender planned the publish after this registration yet left it out (evicted).
        """
        for group in ann.groups:
            if any(m.ordinal == self.ordinal and m.session == self._session for m in group.members):
                return group
        if self._join_event <= ann.log_upto:
            raise _RoundFailed(f"not a member of publish {ann.seq} (evicted)")
        return None

    def _choose_destination(
        self,
        layout: _buckets.BucketLayout,
        device: torch.device,
        apply: _destination.Apply | None,
        into: _inplace.InPlaceTarget | None,
    ) -> _destination.Destination:
        """Choose where this publish lands: in place into `into` when given and its tensors fit, else staged."""
        unfit: ValueError | None = None  # the policy's tensors do not fit: received aside, acknowledged failed
        if into is not None:
            try:
                return _destination.InPlace(layout, into, device)
            except ValueError as exc:
                unfit = exc
        return _destination.Staged(layout, self._take_buckets(layout, device), apply, unfit)

    def _receive_broadcast(
        self,
        store: dist.TCPStore,
        ann: _messages.Publish,
        plans: tuple[dict[int, _topology.Place], ...],
        layout: _buckets.BucketLayout,
        transfers: list[torch.Tensor],
        trees_of: list[int],
        destination: _destination.Destination,
        forwarder: _relay.Forwarder,
    ) -> None:
        """Receive the header and every transfer of publish `ann` from the parents (transfer i >= 1 down tree
        `trees_of[i - 1]`), relaying each on arrival.

        When the edge from the parent in one of two trees breaks, the other tree's transfers are still received
        and relayed (its children there get the publish) before the publish is dropped here.

        Raises:
            _RoundFailed: when the header does not match the announcement, rollouts did not pause in time, or an
                edge from a parent broke (the subtree it cut off is then reported `lost`).
        """
        inbound = _Inbound(self._parents, forwarder)
        try:
            expected = _transport.header_tensor(
                ann.seq, ann.version, len(layout.buckets), layout.signature, transfers[0].device
            )
            transfers[0].copy_(expected)  # what the children get: the announcement's header
            headers = [torch.zeros_like(expected) for _ in self._parents]
            works = [inbound.start(tree, header) for tree, header in enumerate(headers)]
            # relayed at once, down every tree, before this member's own headers arrive: waiting for them would
            # make a root of one tree wait for its header in the other, which comes down that tree's depth first
            # (a first publish, whose edges form on the way, could run out of time); each child checks its own
            forwarder.advance(1)
            for tree, header in enumerate(headers):
                if inbound.wait(tree, works[tree]) and not torch.equal(header, expected):
                    raise _RoundFailed(
                        f"header {header.tolist()} does not match announcement {ann.seq} (version {ann.version})"
                    )
            if not destination.begin(self._timings.pause):
                raise _RoundFailed(f"rollouts did not pause within {self._timings.pause:.1f} s for publish {ann.seq}")
            self._receive_transfers(inbound, transfers, trees_of, forwarder, destination)
        except RuntimeError as exc:
            for tree in range(len(self._parents)):  # every tree is cut here: as if each edge broke
                inbound.broken.setdefault(tree, str(exc))
        if not inbound.broken:
            return
        for tree, error in sorted(inbound.broken.items()):
            # the edge from the parent broke: this subtree cannot have the version, nor acknowledges a parent that
            # has not yet: it died, or dropped this publish and closed its edges (the sender knows when its edge
            # to a root broke)
            parent = plans[tree][self.ordinal].parent
            cut = _topology.subtree(plans[tree], self.ordinal) + ([] if parent is None else [parent])
            self._report_lost(
                store, ann.seq, cut, f"the edge into ordinal {self.ordinal} in tree {tree} broke: {error}"
            )
        if len(inbound.broken) < len(self._parents):  # the other tree's children got their transfers: let them end
            self._finish_children(store, ann.seq, plans, forwarder)
        raise _RoundFailed(f"broadcast of publish {ann.seq} failed: {inbound.broken}")

    def _wait_commit(self, store: dist.TCPStore, seq: int, group: int) -> None:
        """Wait for the sender's commit of publish `seq` for `group` (`SyncTimings.commit_wait`, `commit_bound`).

        Raises:
            _RoundFailed: when the sender did not commit it (a transfer to the group failed) or not in time.
        """
        commit = _store.commit(seq, group)

        def committed() -> bool:
            missing = _store.wait_keys(store, [commit], self._timings.commit_wait)
            return not missing and _messages.read(store, commit, _messages.COMMIT).ok

        if not _store.bounded(committed, self._timings.commit_bound, f"the commit of publish {seq}"):
            raise _RoundFailed(f"sender did not commit publish {seq} for group {group}")

    def _acknowledge(
        self,
        store: dist.TCPStore,
        seq: int,
        ack: _messages.Ack,
        plans: tuple[dict[int, _topology.Place], ...],
        forwarder: _relay.Forwarder,
    ) -> None:
        """Post `ack` (and confirm it to the parents), then wait (one step at most) for the children to get
        everything and confirm theirs; report the subtrees cut off.
        """
        _store.bounded(
            lambda: _messages.write(store, _store.ack(seq, self.ordinal), ack), self._timings.step, "an acknowledgement"
        )
        for places, parent in zip(plans, self._parents, strict=True):
            if places[self.ordinal].parent is not None:
                _relay.confirm(parent)  # the parent sees this edge break if this receiver dies before it
        # acknowledged first: a slow child delays no ack
        self._finish_children(store, seq, plans, forwarder)

    def _finish_children(
        self, store: dist.TCPStore, seq: int, plans: tuple[dict[int, _topology.Place], ...], forwarder: _relay.Forwarder
    ) -> None:
        """Wait (one step at most) for the children to get everything and confirm their acknowledgements; report
        the subtree (in the child's tree) of each that did not.
        """
        trees = {child.ordinal: child.tree for child in self._children}
        for child, why in forwarder.finish(time.monotonic() + self._timings.step).items():
            self._report_lost(store, seq, _topology.subtree(plans[trees[child]], child), f"relay {self.ordinal}: {why}")

    def _receive_transfers(
        self,
        inbound: _Inbound,
        transfers: list[torch.Tensor],
        trees_of: list[int],
        forwarder: _relay.Forwarder,
        destination: _destination.Destination,
    ) -> None:
        """Receive every transfer after the header, in the sender's order, relaying each one as soon as it is here.

        Each transfer lands on arrival (`Destination.land`); one in a reused staging buffer (in place) is unpacked
        into the policy's tensors then, and its buffer is reused only once the children got it too
        (`Forwarder.release`).

        Transfer i >= 1 comes from the parent in tree `trees_of[i - 1]` (`_topology.split`); one whose edge broke
        is skipped (this publish is then dropped once the other trees' transfers were relayed).

        Raises:
            RuntimeError: when every edge from a parent failed or timed out.
        """
        # transfers of two trees arrive independently: each is landed and relayed as soon as it is here, whatever
        # the other tree's; waiting for them in order would make a member that relays one tree wait for the other
        # tree's previous transfer, which may itself come through the first (a cycle that serializes the trees)
        done: queue.SimpleQueue[int] = queue.SimpleQueue()  # indices whose receive finished (or failed)
        inflight: dict[int, tuple[int, dist.Work | None]] = {}  # index -> (tree, its receive)
        landed: set[int] = set()
        last_in_slot: list[int | None] = [None] * _inplace.STAGING_SLOTS  # transfer last received into each
        bound = self._timings.edge_from_parent + self._timings.step  # past every receive's own timeout

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
                    forwarder.release(previous + 1, time.monotonic() + self._timings.step)
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

    def _report_lost(self, store: dist.TCPStore, seq: int, ordinals: list[int], why: str) -> None:
        """Acknowledge publish `seq` as `lost` for `ordinals` where they did not acknowledge yet, so the sender
        stops waiting for them at once; skipped once the sender deleted the publish's keys (it moved on).
        """
        lost = _messages.Ack("lost", -1, why)

        def post() -> None:
            if store.check([_store.announce(seq)]):
                for ordinal in ordinals:
                    _messages.write_absent(store, _store.ack(seq, ordinal), lost)

        try:
            _store.bounded(post, self._timings.step, "lost acknowledgements")
        except RuntimeError as exc:  # the sender learns it from the missing acknowledgements, one timeout later
            log.warning("receiver %d: could not report ordinals %s lost: %s", self.ordinal, ordinals, exc)

    def _edges_per_formation(self) -> int:
        """Store connections one formation of this receiver's edges takes at most: from its parent and to each of
        its children, in every tree.
        """
        return self.config.relay_trees * (1 + self.config.relay_fanout)

    def _form_edges(self, group: _messages.AnnouncedGroup, plans: tuple[dict[int, _topology.Place], ...]) -> None:
        """Form the edges from the parents (here, bounded) and the edges to the children (in the background), in
        every tree; then keep connections for two formations ready, so that a tree re-formed twice in a row finds
        them.
        """
        spares = self._spares
        assert spares is not None  # set with the store (`_connect`)
        spares.reserve(2 * self._edges_per_formation())

        def edge(child: int, tree: int, rank: int, timeout: float) -> _transport.BroadcastGroup:
            prefix = _store.edge_prefix(group.index, group.generation, child, tree)
            return _transport.BroadcastGroup(
                spares.take(timeout), prefix, rank, 2, timeout, group.backend, self._address
            )

        if any(places[self.ordinal].children for places in plans) and self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="wsync-relay")
        self._children = [
            _relay.ChildEdge(child, self._pool.submit(edge, child, tree, 0, self._timings.step), tree)  # type: ignore[union-attr]
            for tree, places in enumerate(plans)
            for child in places[self.ordinal].children
        ]
        # a stalled sibling tree may hold the sender up to one timeout: wait twice as long for it. The trees' edges
        # form at once: one after the other, a root of one tree would meet the sender only once its parent in the
        # other tree had reached this publish, and the sender waits for its roots one timeout only
        failure: RuntimeError | None = None
        with concurrent.futures.ThreadPoolExecutor(len(plans), thread_name_prefix="wsync-parent") as parents:
            forming = [
                parents.submit(edge, self.ordinal, tree, _relay.CHILD_RANK, self._timings.edge_from_parent)
                for tree in range(len(plans))
            ]
            for future in forming:
                try:
                    self._parents.append(future.result())  # (closed with the group, also when another failed)
                except RuntimeError as exc:
                    failure = failure or exc
        if failure is not None:
            raise _RoundFailed(f"forming group {group.index} generation {group.generation} failed: {failure}")

    def _layout(self, store: dist.TCPStore, signature: str) -> _buckets.BucketLayout:
        if signature not in self._layouts:
            layout = _buckets.BucketLayout.from_json(store.get(_store.ROOT + "layout/" + signature).decode())
            if layout.signature != signature:
                raise _RoundFailed(f"layout {signature[:12]} does not match its signature")
            self._layouts = {signature: layout}
        return self._layouts[signature]

    def epoch_of(self, version: int) -> int:
        """The epoch of the publish that brought weight `version` (for a trajectory batch's stamp); safe to call from
        any thread.

        Args:
            version (int): One of the last `EPOCHS_KEPT` versions applied (or being applied).

        Returns:
            int: Its epoch; 0 for any other version (none held yet, or long replaced).
        """
        return self._epochs.get(version, 0)

    # -- reports and shutdown --------------------------------------------------------------------------
    def report(self, applied: _fingerprint.WeightRecord, metrics: dict[str, float]) -> bool:
        """Post this receiver's state for the sender's `reports()` (last report wins).

        Args:
            applied (WeightRecord): the weights now in the policy: `weight_version`, fingerprint and digests
                of its `named_state`.
            metrics (dict[str, float]): latest metrics, e.g. {"eval_return": 475.0}.

        Returns:
            bool: True when posted; False when the store is not reachable now (logged, not raised).
        """
        store = self._report_store  # the receiving thread may drop it meanwhile
        if store is None:
            return False
        report = _types.ReceiverReport(self.ordinal, applied, dict(metrics), time.time())
        try:
            _messages.write(store, _store.report(self.ordinal), report)
        except RuntimeError as exc:
            log.warning("receiver %d could not post a report: %s", self.ordinal, exc)
            return False
        return True

    def close(self) -> None:
        """Leave the fleet (the sender re-forms this receiver's group without it) and drop the connection."""
        if self._store is not None and not self.sender_closed:  # after a close the store is gone
            try:
                idx = self._store.add(_store.MEMBER_COUNT, 1)
                _messages.write(self._store, _store.member_event(idx), _messages.Leave(self.ordinal, self._session))
            except RuntimeError as exc:
                log.info("receiver %d: leave not posted (%s)", self.ordinal, exc)
        self._disconnect()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
