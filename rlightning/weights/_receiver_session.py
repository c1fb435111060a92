"""A receiver's session with the sender: its store connections, its registration, the announcements it waits for,
and its edges in its group's relay trees; it outlives the publishes (`_receiver_round`) until the store is lost.
"""

from __future__ import annotations

import concurrent.futures
import logging
import time
import uuid

import torch.distributed as dist

from rlightning.config import WeightSyncConfig
from rlightning.weights import _buckets, _messages, _nccl, _receiver_round, _relay, _store, _topology, _transport

log = logging.getLogger(__name__)

CLOSED_RECONNECT_SECONDS = 1.0
"""After a sender's close, how long a receiver waits before it connects again. It drops its store connections on
reading the close, and the sender stops its store once every receiver has acknowledged (at once, normally): a call
still in flight on a store that stops makes torch log a warning with a C++ stack trace. A restarted sender (a new
attempt) takes longer than this to come up."""


class ReceiverSession:
    """The connection of one receiver (`WeightReceiver`) to the sender's store and its place in the fleet.

    `connect` connects (retrying with backoff) and registers `ordinal` with the version the receiver holds; while
    idle, `next_announcement` waits on the store checking the sender's heartbeat (`_store.HeartbeatMonitor`);
    `join` forms the edges of the receiver's group when the group (or its generation) changed.

    Args:
        config (WeightSyncConfig): must equal the sender's.
        host (str): the sender's host.
        port (int): the weight-sync store's port.
        ordinal (int): this evaluator's stable ordinal.
    """

    def __init__(self, config: WeightSyncConfig, host: str, port: int, ordinal: int) -> None:
        self.config, self.host, self.port, self.ordinal = config, host, port, ordinal
        self._timings = config.timings
        self.store: dist.TCPStore | None = None
        """The connection to the sender's store; None while disconnected."""
        self.report_store: dist.Store | None = None
        """A second connection, for reports: they must not queue behind a blocking wait()."""
        self._watcher: _store.KeyWatcher | None = None
        self._spares: _store.SpareConnections | None = None  # for the edges of a (re-)formed tree
        self._address = ""  # local address toward `host`, found once the store connected (the name resolves)
        self._monitor = _store.HeartbeatMonitor(self._timings)
        self._session = ""
        self._backoff = _store.Backoff()  # kept across `receive` calls: one attempt per backoff step
        self._join_event = 0
        self._next_seq = 1
        self._group: tuple[int, int] | None = None  # (group, generation) of the tree `edges` belong to
        self.edges = _receiver_round.GroupEdges(-1, -1)
        """This receiver's edges in its group's relay trees (none before the first `join`)."""
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None  # forms child edges in the background
        self._layouts: dict[str, _buckets.BucketLayout] = {}
        self.sender_closed = False
        """True after the sender announced `close()`, until the next announcement of a (restarted) sender."""
        self._closed_at = 0.0  # monotonic time the close was read

    def connect(self, deadline: float, version: int) -> dist.TCPStore:
        """The store, connected and registered with `version` unless it is already.

        Raises:
            TimeoutError: when no store answered before `deadline` (monotonic seconds).
            RuntimeError: when the store was lost.
        """
        if self.store is None:
            if self.sender_closed:  # let the closing sender's store stop with no call of ours on it
                resume = self._closed_at + CLOSED_RECONNECT_SECONDS
                time.sleep(max(0.0, min(resume, deadline) - time.monotonic()))
                if time.monotonic() < resume:
                    raise TimeoutError("the closed sender's store may still be stopping")
            store = _store.connect_store(self.host, self.port, self._timings.step, deadline, self._backoff)
            self.store = store
            self._monitor = _store.HeartbeatMonitor(self._timings)
            if not self._address:
                self._address = _transport.local_address_toward(self.host, self.port)
            # bounded: a listening socket of a stopped sender accepts connections but never answers
            count = _store.bounded(lambda: store.add(_store.ANNOUNCE_COUNT, 0), self._timings.step, "a first read")
            self.report_store = _store.connect_again(store, self._timings.step)
            # one connection waits for announcements, for as long as this one lives (not one per publish)
            self._watcher = _store.KeyWatcher(_store.connect_again(store, self._timings.step), self._timings.step)
            # the edges of one formation (from the parent and to each child, in every tree); two once the first
            # formed (`_form_edges`), not at once: the fleet's connections at start are a burst of DNS lookups
            self._spares = _store.SpareConnections(store, self._edges_per_formation(), self._timings.step)
            self._next_seq = count + 1
            # joined once its edges need no new connection (within the caller's time), so its first publish does
            # not wait for one
            self._spares.wait_ready(min(_store.CONNECT_BOUND, max(deadline - time.monotonic(), 0.0)))
            self.register(version)
            log.info("receiver %d connected to %s:%d", self.ordinal, self.host, self.port)
        return self.store

    def register(self, version: int) -> None:
        """Drop the group's edges and join the fleet again under a new session id, holding `version`.

        Raises:
            RuntimeError: when the store does not answer within one step.
        """
        assert self.store is not None
        self.drop_group()
        self._session = uuid.uuid4().hex
        cuda = self.config.backend != "gloo" and _nccl.available()
        store = self.store
        # `version` lets a restarted sender publish above what the fleet already holds (`fleet_version`)
        event = _messages.Join(self.ordinal, self._session, cuda, version)

        def post() -> int:
            index = store.add(_store.MEMBER_COUNT, 1)
            _messages.write(store, _store.member_event(index), event)
            return index

        self._join_event = _store.bounded(post, self._timings.step, "a registration")  # a vanished sender never answers

    def drop_group(self) -> None:
        """Close the edges of the group (its children's transfers fail at once: they register again)."""
        self.edges.close()
        self.edges, self._group = _receiver_round.GroupEdges(-1, -1), None

    def disconnect(self) -> None:
        """Drop the group and every store connection."""
        self.drop_group()
        if self._watcher is not None:
            self._watcher.cancel()
        if self._spares is not None:
            self._spares.close()
        self.store, self.report_store, self._watcher, self._spares = None, None, None, None

    def closed_by_sender(self, store: dist.TCPStore, seq: int, version: int) -> None:
        """The sender announced its close (`seq`): acknowledge it `closed` holding `version`, and disconnect."""
        _messages.write(store, _store.ack(seq, self.ordinal), _messages.Ack("closed", version))
        self.sender_closed, self._closed_at = True, time.monotonic()
        log.info("receiver %d: the sender closed (weight version %d held); connecting again after %g s",
                 self.ordinal, version, CLOSED_RECONNECT_SECONDS)
        self.disconnect()

    def next_announcement(
        self, store: dist.TCPStore, deadline: float
    ) -> _messages.Publish | _messages.Close | None:
        """The next announcement (publishes already missed skipped); None when none came before `deadline`.

        Raises:
            RuntimeError: when the store does not answer within one step, or the sender's heartbeat stood still.
        """
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
            assert watcher is not None  # set with the store (`connect`)
            # wait in steps, checking the sender's heartbeat between them: a vanished sender sends no RST
            while not watcher.wait(key, min(deadline - time.monotonic(), self._timings.heartbeat_check)):
                self._monitor.check(store)
                if time.monotonic() >= deadline:
                    return None
        self._next_seq += 1
        return _store.bounded(
            lambda: _messages.read(store, key, _messages.ANNOUNCEMENT), self._timings.step, "an announcement"
        )

    def member_of(self, ann: _messages.Publish) -> _messages.AnnouncedGroup | None:
        """The group of publish `ann` this receiver (this session) belongs to; None when it registered too late.

        Raises:
            RoundFailed: when the sender planned the publish after this registration yet left it out (evicted).
        """
        for group in ann.groups:
            if any(m.ordinal == self.ordinal and m.session == self._session for m in group.members):
                return group
        if self._join_event <= ann.log_upto:
            raise _receiver_round.RoundFailed(f"not a member of publish {ann.seq} (evicted)")
        return None

    def join(self, group: _messages.AnnouncedGroup, plans: tuple[dict[int, _topology.Place], ...]) -> None:
        """Form this receiver's edges in `group` (relay trees `plans`) unless they are formed already.

        Raises:
            RoundFailed: when an edge from a parent did not form.
        """
        key = (group.index, group.generation)
        if self._group != key:
            self.drop_group()
            self._form_edges(group, plans)
            self._group = key

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
        assert spares is not None  # set with the store (`connect`)
        spares.reserve(2 * self._edges_per_formation())
        self.edges = edges = _receiver_round.GroupEdges(group.index, group.generation)

        def edge(child: int, tree: int, rank: int, timeout: float) -> _transport.BroadcastGroup:
            prefix = _store.edge_prefix(group.index, group.generation, child, tree)
            return _transport.BroadcastGroup(
                spares.take(timeout), prefix, rank, 2, timeout, group.backend, self._address
            )

        if any(places[self.ordinal].children for places in plans) and self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(thread_name_prefix="wsync-relay")
        edges.children = [
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
                    edges.parents.append(future.result())  # (closed with the group, also when another failed)
                except RuntimeError as exc:
                    failure = failure or exc
        if failure is not None:
            raise _receiver_round.RoundFailed(
                f"forming group {group.index} generation {group.generation} failed: {failure}"
            )

    def layout(self, store: dist.TCPStore, signature: str) -> _buckets.BucketLayout:
        """The bucket layout of `signature` (read from the store once; the last one kept).

        Raises:
            RoundFailed: when the layout read does not match its signature.
        """
        if signature not in self._layouts:
            layout = _buckets.BucketLayout.from_json(store.get(_store.ROOT + "layout/" + signature).decode())
            if layout.signature != signature:
                raise _receiver_round.RoundFailed(f"layout {signature[:12]} does not match its signature")
            self._layouts = {signature: layout}
        return self._layouts[signature]

    def close(self) -> None:
        """Leave the fleet (the sender re-forms this receiver's group without it) and drop the connection."""
        if self.store is not None and not self.sender_closed:  # after a close the store is gone
            try:
                idx = self.store.add(_store.MEMBER_COUNT, 1)
                _messages.write(self.store, _store.member_event(idx), _messages.Leave(self.ordinal, self._session))
            except RuntimeError as exc:
                log.info("receiver %d: leave not posted (%s)", self.ordinal, exc)
        self.disconnect()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
