"""The sending side of the protocol: assign the version, announce, (re)form groups, stream buckets, commit, acks.

The sender owns the weight version: each publish takes the next one, above both the newest version this sender
published or started from (the checkpoint's) and the newest one any receiver registered or reported with.

One publish, in order (keys in `_store`, values in `_messages`):
1. fold new membership events; assign the version; plan groups (only changed groups get a new generation);
   each group is a relay tree (`_topology`) whose root this sender feeds, and whose members relay to each other
   (or two trees, `config.relay_trees`, each fed about half the transfers' bytes: `_topology.split`);
2. announce the publish (version, layout signature, groups) under a fresh sequence number, so receivers
   wait on the store, never inside a collective, between publishes;
3. form the edges to new groups' roots (one per tree) concurrently, each bounded by `SyncTimings.step`
   (`timeout_seconds`);
4. send each root a header (seq, version, bucket count, signature) and then the buckets' segments: runs of
   small tensors packed (cast to `config.dtype` when set) into one of two reused staging buffers (so at most
   two exist), each large tensor straight from its own memory in chunks; at most `_transport.MAX_IN_FLIGHT`
   transfers in flight;
5. commit each group ("ok" only when every transfer to its root succeeded), then wait for the acks of every
   member of the committed groups. Receivers use a version only after the commit, so a failed edge never yields
   a partial or torn version. Members that did not acknowledge (a dead relay's subtree) are evicted and
   re-register. An ack says whether the receiver applied the version or ignored it, already holding it
   (counted in `receivers_ignored`); a tree neighbour that saw an edge break acknowledges `lost` for every
   member it cut off, so the wait for a dead relay's subtree ends when the break is seen, not after a timeout;
6. delete the keys of publish `seq - 2` (and membership events once read), so the store stays bounded.

A daemon thread advances `_store.HEARTBEAT` every `SyncTimings.heartbeat_period` until `close()`, so receivers
notice a sender that went silent. Every bound comes from `config.timings` (`SyncTimings`).
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import threading
import time
from collections.abc import Mapping

import torch
import torch.distributed as dist

from rlightning.config import WeightSyncConfig
from rlightning.weights import _buckets, _membership, _messages, _state, _store, _topology, _transport, _types

log = logging.getLogger(__name__)


def _direct(tensor: torch.Tensor, device: torch.device, dtype: torch.dtype) -> bool:
    """Whether `tensor` can be sent as is to groups on `device` in `dtype` (no staging copy)."""
    return tensor.device == device and tensor.dtype == dtype and tensor.is_contiguous()


class _LiveGroup:
    """A planned group (one or two relay trees), the edges to its roots once formed (one per tree, in tree order),
    and the first error seen in this publish.
    """

    def __init__(self, plan: _membership.GroupPlan, backend: str, trees: int) -> None:
        self.plan, self.backend = plan, backend
        ordinals = [m.ordinal for m in plan.members]
        self.roots = [_topology.root(p) for p in _topology.relay_trees(ordinals, 1, trees)]  # any fan-out: same roots
        self.forming: list[_transport.BroadcastGroup | None] = [None] * trees  # the edge to each tree's root
        self.error: str | None = None
        self._lock = threading.Lock()  # the trees' edges form in threads of their own

    @property
    def transports(self) -> list[_transport.BroadcastGroup]:
        """The edges to the roots, in tree order, once every one formed; empty before, and once failed."""
        edges = list(self.forming)  # one snapshot: another thread may fail the group meanwhile
        return [e for e in edges if e is not None] if all(e is not None for e in edges) else []

    def formed(self, tree: int, edge: _transport.BroadcastGroup) -> None:
        """Keep the edge to `tree`'s root (closed at once if the group failed meanwhile); the group is usable once
        every tree's edge formed.
        """
        with self._lock:
            if self.error is None:
                self.forming[tree] = edge
                return
        edge.close()

    def fail(self, error: str) -> None:
        with self._lock:
            if self.error is None:
                self.error = error
            edges = [e for e in self.forming if e is not None]
            self.forming = [None] * len(self.forming)
        for edge in edges:
            edge.close()


class _Pipeline:
    """The broadcasts of one publish in flight, oldest first: at most `_transport.MAX_IN_FLIGHT`, each with the
    staging slot (0 or 1) its tensors were packed into, or None when sent from the tensors themselves.

    Args:
        groups (list[_LiveGroup]): The groups every transfer goes to; a group whose broadcast fails is failed (its
            transport closed) and skipped from then on.
        step_seconds (float): Bound on each transfer (`SyncTimings.step`); works issued together expire together.
    """

    def __init__(self, groups: list[_LiveGroup], step_seconds: float) -> None:
        self._groups, self._step = groups, step_seconds
        self._fifo: collections.deque[
            tuple[int | None, list[tuple[_LiveGroup, _transport.BroadcastGroup, dist.Work, float]]]
        ] = collections.deque()

    def devices(self) -> set[torch.device]:
        """The devices of the groups still alive (where each transfer's tensors must be)."""
        return {live.transports[0].device for live in self._groups if live.transports}

    def send(self, tensors: dict[torch.device, torch.Tensor], slot: int | None = None, tree: int | None = None) -> None:
        """Start broadcasting `tensors` (one per device) to every live group, down relay tree `tree` of each (None:
        down every tree, as the header).
        """
        deadline = time.monotonic() + self._step
        works = []
        for live in self._groups:
            for edge in live.transports if tree is None else live.transports[tree : tree + 1]:
                try:
                    works.append((live, edge, edge.broadcast(tensors[edge.device]), deadline))
                except RuntimeError as exc:
                    live.fail(f"broadcast failed: {exc}")
                    break
        self._fifo.append((slot, works))

    def free(self, slot: int) -> None:
        """Wait until no transfer in flight reads staging buffer `slot`."""
        while any(used == slot for used, _ in self._fifo):
            self._wait_oldest()

    def make_room(self) -> None:
        """Wait until fewer than `_transport.MAX_IN_FLIGHT` transfers are in flight."""
        while len(self._fifo) >= _transport.MAX_IN_FLIGHT:
            self._wait_oldest()

    def drain(self) -> None:
        """Wait for every transfer in flight."""
        while self._fifo:
            self._wait_oldest()

    def _wait_oldest(self) -> None:
        _, works = self._fifo.popleft()
        for live, edge, work, deadline in works:
            if not live.transports:
                continue
            try:
                edge.wait_work(work, deadline)
            except RuntimeError as exc:
                live.fail(f"broadcast failed: {exc}")


class WeightSender:
    """Publishes versioned weights to the evaluation fleet; hosts the weight-sync store.

    Runs on trainer rank 0 (other DDP ranks hold the same weights). Not thread-safe: call from one thread,
    and do not modify the weights during `publish` (the buckets of single tensors are sent from the tensors).

    Args:
        config (WeightSyncConfig): bucket size, group size, backend, timeout.
        host (str): the address receivers use to reach this process (gloo binds the interface toward it).
        port (int): port of the weight-sync store hosted here (`PortsConfig`, default
            `rlightning.contract.WEIGHT_SYNC_PORT`).
        version (int, optional): the newest version published before this sender started (a resumed
            trainer's checkpoint holds it); every publish goes above it. Defaults to 0.
        bind_host (str | None, optional): the one address the store listens on (127.0.0.1 in a local run);
            None: all interfaces. Defaults to None.
        epoch (int, optional): the trainer attempt's epoch (`contract.ENV_TRAIN_EPOCH`), announced with every
            publish: receivers that have seen a newer epoch refuse this sender's publishes (`_epoch`). Defaults to 0.

    Raises:
        RuntimeError: (from torch) when the port is in use.
        ValueError: when `version` or `epoch` is negative.

    Examples:
        >>> sender = WeightSender(WeightSyncConfig(), "127.0.0.1", 29600)
        >>> stats = sender.publish(named_state(model))
        >>> stats.version, stats.receivers_acked
        (1, [0, 1])
    """

    def __init__(
        self,
        config: WeightSyncConfig,
        host: str,
        port: int,
        version: int = 0,
        bind_host: str | None = None,
        epoch: int = 0,
    ) -> None:
        if version < 0:
            raise ValueError(f"version must be >= 0, got {version}")
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.config, self.epoch = config, epoch
        self._timings = config.timings
        self._store = _store.host_store(port, self._timings.step, ipv6=":" in host, bind_host=bind_host)
        self._host, self._port = host, port
        self._address = ""  # local address toward `host`, found when the first group forms (the name may
        # not resolve yet when a pod starts)
        beats = _store.connect_again(self._store, self._timings.step)
        self._heartbeat = _store.Heartbeat(beats, self._timings.heartbeat_period)
        # for the edges to re-formed trees' roots
        self._spares = _store.SpareConnections(self._store, 2, self._timings.step)
        self._published: dict[int, tuple[list[int], list[int]]] = {}  # seq -> (groups, ordinals), for cleanup
        self._membership = _membership.Membership()
        self._events_read = 0
        self._event_missing_since: float | None = None
        self._groups: dict[int, _LiveGroup] = {}
        self._next_generation = 1
        self._seq = 0
        self._version = int(version)
        self._reported_version = 0  # highest applied version seen in reports
        self._layout: _buckets.BucketLayout | None = None
        self._layout_entries: list[tuple[str, torch.dtype, tuple[int, ...]]] = []  # what `_layout` was built from
        self._staging: dict[torch.device, list[torch.Tensor | None]] = {}
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="wsync-form")

    # -- membership ------------------------------------------------------------------------------------
    def _read_membership(self) -> None:
        count = self._store.add(_store.MEMBER_COUNT, 0)
        while self._events_read < count:
            key = _store.member_event(self._events_read + 1)
            if self._store.check([key]):
                event = _messages.read(self._store, key, _messages.MEMBER_EVENT)
                if isinstance(event, _messages.Join):
                    self._membership.join(_membership.Member(event.ordinal, event.session, event.cuda), event.version)
                else:
                    self._membership.evict(event.ordinal, event.session)
                self._store.delete_key(key)  # read once, by this sender only: the store stays bounded
            else:  # the writer is between add() and set(); skip it only if it never completes
                now = time.monotonic()
                self._event_missing_since = self._event_missing_since or now
                if now - self._event_missing_since < self._timings.step:
                    return
                log.warning("membership event %s never written; skipped", key)
            self._events_read += 1
            self._event_missing_since = None

    def _plan(self) -> list[int]:
        previous = {g: live.plan for g, live in self._groups.items() if live.transports}
        plans, self._next_generation = _membership.plan_groups(
            self._membership.members, self.config.group_size, previous, self._next_generation
        )
        formed = []
        for index in set(self._groups) - set(plans):
            self._groups.pop(index).fail("group emptied")
        for index, plan in plans.items():
            live = self._groups.get(index)
            if live is not None and live.plan is plan:
                live.error = None
                continue
            if live is not None:
                live.fail("re-formed")
            backend = _transport.resolve_backend(self.config.backend, all(m.cuda for m in plan.members))
            self._groups[index] = _LiveGroup(plan, backend, self.config.relay_trees)
            formed.append(index)
        return formed

    def _form(self, live: _LiveGroup, tree: int) -> None:
        plan = live.plan
        try:
            if not self._address:
                self._address = _transport.local_address_toward(self._host, self._port)
            live.formed(
                tree,
                _transport.BroadcastGroup(  # the edge to the tree's root (`_topology`)
                    self._spares.take(self._timings.step),
                    _store.edge_prefix(plan.index, plan.generation, live.roots[tree], tree),
                    0,
                    2,
                    self._timings.step,
                    live.backend,
                    self._address,
                ),
            )
        except (RuntimeError, OSError) as exc:  # OSError: `host` does not resolve (yet)
            live.fail(f"forming generation {plan.generation} failed: {exc}")

    # -- buckets ---------------------------------------------------------------------------------------
    def _prepare_layout(self, state: Mapping[str, torch.Tensor]) -> _buckets.BucketLayout:
        cast = self.config.dtype
        entries = [(name, _state.wire_dtype(t.dtype, cast), tuple(t.shape)) for name, t in state.items()]
        if self._layout is not None and entries == self._layout_entries:  # same tensors: skip layout and hash
            return self._layout
        layout = _buckets.BucketLayout(entries, self.config.bucket_size_bytes)
        self._layout_entries = entries
        if self._layout is None or layout.signature != self._layout.signature:
            self._layout, self._staging = layout, {}
            self._store.set(_store.ROOT + "layout/" + layout.signature, layout.to_json())
        return self._layout

    def _source(
        self, segment: _buckets.Segment, state: Mapping[str, torch.Tensor], device: torch.device, slot: int | None
    ) -> torch.Tensor:
        """The flat tensor to send for `segment` to groups on `device`: the tensor itself, or packed into staging."""
        dtype = self._layout.buckets[segment.bucket].dtype  # type: ignore[union-attr]
        if segment.direct:
            t, first = state[segment.slots[0].name], segment.offset - segment.slots[0].offset
            if _direct(t, device, dtype):
                return t.reshape(-1)[first : first + segment.numel]  # a view: no copy
        assert slot is not None
        nbytes = segment.numel * dtype.itemsize
        buffers = self._staging.setdefault(device, [None, None])
        if buffers[slot] is None or buffers[slot].numel() < nbytes:  # type: ignore[union-attr]
            buffers[slot] = torch.empty(nbytes, dtype=torch.uint8, device=device)
        out = buffers[slot][:nbytes].view(dtype)  # type: ignore[index]
        return self._layout.pack_segment(segment, state, out)  # type: ignore[union-attr]

    # -- publish ---------------------------------------------------------------------------------------
    def publish(self, state: Mapping[str, torch.Tensor]) -> _types.SyncStats:
        """Send `state` under the next weight version to every registered receiver and wait for their acks.

        The version is `max(version, fleet_version) + 1`: above everything this sender published or started
        from, and above what any receiver holds (a trainer restarted without its checkpoint, or a late
        evaluator that rejoined with a newer version), since receivers ignore versions not newer than theirs.
        Bounded: forming a group, each broadcast and the wait for acks each take at most
        `config.timeout_seconds`. A failing group does not stop the others.

        Args:
            state (Mapping[str, torch.Tensor]): clean name -> tensor (`named_state` of the trained module); any
                device; names, dtypes and shapes may change between versions (a new layout is announced).

        Returns:
            SyncStats: the version published, bytes, seconds, groups, acknowledging receivers.

        Raises:
            RuntimeError: after `close()`.
            WeightSyncError: when some group failed or some receiver did not acknowledge in time; the message
                names the groups and ordinals, `.stats` holds the rest (the version counts as published).
        """
        if self._store is None:
            raise RuntimeError("publish on a closed WeightSender")
        start = time.monotonic()
        layout = self._prepare_layout(state)
        self._read_membership()
        fleet = self._known_fleet_version()
        if fleet > self._version:  # the fleet would refuse anything older: continue above it
            log.warning("evaluators hold weight version %d, above this sender's %d; publishing %d",
                        fleet, self._version, fleet + 1)
        version = self._version = max(self._version, fleet) + 1
        formed = self._plan()
        # one edge per group and tree, for two re-forms in a row
        self._spares.reserve(2 * self.config.relay_trees * len(self._groups))
        self._seq += 1
        seq = self._seq
        groups = [self._groups[g] for g in sorted(self._groups)]
        announced = tuple(
            _messages.AnnouncedGroup(live.plan.index, live.plan.generation, live.backend, live.plan.members)
            for live in groups
        )
        publish = _messages.Publish(
            seq, version, layout.signature, self._events_read, announced, self.config.relay_fanout, self.epoch,
            self.config.relay_trees,
        )
        _messages.write(self._store, _store.announce(seq), publish)
        self._store.add(_store.ANNOUNCE_COUNT, 1)
        trees = range(self.config.relay_trees)  # formed together: a member may be a root in one tree, a child in
        # the other, and form its edge from the sender only after its edge from its parent
        list(self._pool.map(lambda pair: self._form(*pair), [(self._groups[g], t) for g in formed for t in trees]))
        self._stream(seq, version, layout, state, groups)
        stats, errors = self._finish(seq, version, layout, groups, formed)
        self._forget(seq, groups)
        stats.seconds = time.monotonic() - start
        if stats.failed:
            detail = "; ".join(f"group {g} (ordinals {stats.failed[g]}): {errors[g]}" for g in sorted(stats.failed))
            raise _types.WeightSyncError(f"weight version {version} did not reach every receiver: {detail}", stats)
        return stats

    def _stream(
        self,
        seq: int,
        version: int,
        layout: _buckets.BucketLayout,
        state: Mapping[str, torch.Tensor],
        groups: list[_LiveGroup],
    ) -> None:
        inflight = _Pipeline(groups, self._timings.step)
        count, signature = len(layout.buckets), layout.signature
        inflight.send({d: _transport.header_tensor(seq, version, count, signature, d) for d in inflight.devices()})
        packed, trees_of = 0, _topology.split(layout.segment_nbytes(), self.config.relay_trees)
        for index, segment in enumerate(layout.segments):
            targets = inflight.devices()
            if not targets:
                break
            slot = None
            dtype = layout.buckets[segment.bucket].dtype
            if not segment.direct or not all(_direct(state[segment.slots[0].name], d, dtype) for d in targets):
                slot, packed = packed % 2, packed + 1
                inflight.free(slot)  # its staging buffer is written next
            inflight.make_room()
            inflight.send({d: self._source(segment, state, d, slot) for d in targets}, slot, trees_of[index])
        inflight.drain()

    def _finish(
        self, seq: int, version: int, layout: _buckets.BucketLayout, groups: list[_LiveGroup], formed: list[int]
    ) -> tuple[_types.SyncStats, dict[int, str]]:
        stats = _types.SyncStats(version=version, seq=seq, bytes=layout.nbytes, formed_groups=sorted(formed))
        stats.groups = {live.plan.index: live.plan.generation for live in groups}
        for live in groups:
            _messages.write(self._store, _store.commit(seq, live.plan.index), _messages.Commit(live.error is None))
        expected = {m.ordinal: live for live in groups if live.error is None for m in live.plan.members}
        missing = set(_store.wait_keys(self._store, [_store.ack(seq, o) for o in expected], self._timings.step))
        errors: dict[int, str] = {}
        for live in groups:
            absent = [m for m in live.plan.members if live.error is not None or _store.ack(seq, m.ordinal) in missing]
            refused: dict[int, str] = {}  # ordinal -> why its apply failed, or why it refused this epoch
            lost: dict[int, str] = {}  # ordinal -> why a tree neighbour reported it cut off
            for member in live.plan.members:
                if member not in absent:  # acknowledged: applied, failed to apply, ignored, refused, or lost
                    ack = _messages.read(self._store, _store.ack(seq, member.ordinal), _messages.ACK)
                    if ack.outcome in ("failed", "refused"):
                        verb = "failed to apply" if ack.outcome == "failed" else "refused the publish"
                        refused[member.ordinal] = f"{verb}: {ack.error}"
                    elif ack.outcome == "lost":
                        lost[member.ordinal] = ack.error
                    elif ack.outcome == "applied" and ack.version == version:
                        stats.receivers_acked.append(member.ordinal)
                    else:
                        stats.receivers_ignored.append(member.ordinal)
            if absent or refused or lost:
                stats.failed[live.plan.index] = sorted([m.ordinal for m in absent] + list(refused) + list(lost))
                why = [live.error or f"no acknowledgement within {self._timings.step:g} s"] if absent else []
                why += [f"ordinal {o} {error}" for o, error in sorted(refused.items())]
                why += [f"ordinal {o} lost: {error}" for o, error in sorted(lost.items())]
                errors[live.plan.index] = "; ".join(why)
            absent += [m for m in live.plan.members if m.ordinal in lost]
            if absent:  # evicted: they register again (a refusing receiver stays, its tree intact)
                live.fail("failed")
                for member in absent:
                    self._membership.evict(member.ordinal, member.session)
        stats.receivers_acked.sort()
        stats.receivers_ignored.sort()
        return stats, errors

    def _forget(self, seq: int, groups: list[_LiveGroup]) -> None:
        """Delete the keys of publish `seq - 2` (receivers are done with them), so the store stays bounded.

        Publish `seq - 1` is kept: a receiver that read the announcement count just before `seq` was announced
        may still fetch it. Group rendezvous keys are left: gloo's key names are internal to it.
        """
        ordinals = [m.ordinal for live in groups for m in live.plan.members]
        self._published[seq] = ([live.plan.index for live in groups], ordinals)
        old = self._published.pop(seq - 2, None)
        if old is None:
            return
        keys = [_store.announce(seq - 2)]
        keys += [_store.commit(seq - 2, g) for g in old[0]] + [_store.ack(seq - 2, o) for o in old[1]]
        for key in keys:
            self._store.delete_key(key)  # False (not an error) for an ack that never came

    # -- versions, reports and shutdown ----------------------------------------------------------------
    @property
    def version(self) -> int:
        """The newest version published, or the one this sender started from before its first publish."""
        return self._version

    def continue_from(self, version: int) -> None:
        """Publish above `version` from now on: the caller holds weights of that version from elsewhere (a trainer
        gang restarted without a checkpoint pulls them from the fleet). Never lowers the version.

        Args:
            version (int): The version of the weights the caller now holds (>= 0).
        """
        self._version = max(self._version, int(version))

    def _known_fleet_version(self) -> int:
        return max(self._membership.highest_version, self._reported_version)

    @property
    def fleet_version(self) -> int:
        """The highest weight version any receiver of this store registered with or reported applied (0 if none).

        Receivers send the newest version they hold when they register (again), so a trainer restarted without
        its checkpoint learns what the fleet holds once the receivers have re-registered (they reconnect with
        backoff up to 5 s, `_store.Backoff`), and its next publish goes above it. Reads new membership events.
        """
        self._read_membership()
        return self._known_fleet_version()

    def reports(self) -> dict[int, _types.ReceiverReport]:
        """The newest report of every receiver that ever registered and reported.

        Returns:
            dict[int, ReceiverReport]: ordinal -> report.
        """
        self._read_membership()
        out: dict[int, _types.ReceiverReport] = {}
        for ordinal in sorted(self._membership.seen):
            key = _store.report(ordinal)
            if self._store.check([key]):
                out[ordinal] = _messages.read(self._store, key, _messages.REPORT)
                self._reported_version = max(self._reported_version, out[ordinal].applied.version)
        return out

    @property
    def members(self) -> list[int]:
        """Ordinals currently registered (reads new membership events from the store)."""
        self._read_membership()
        return sorted(self._membership.members)

    def close(self, linger: float = 5.0) -> None:
        """Announce the end to receivers, release every group, and stop hosting the store.

        On return the store no longer listens: a next sender (a restarted trainer in the same process) may host
        its store on the same port at once. Forms still running in the pool end on their own (they hold only
        client connections).

        Args:
            linger (float, optional): seconds to wait, at most, for registered receivers to read the end
                (they acknowledge it), so they see `sender_closed` instead of a lost connection. Defaults to 5.0.
        """
        if self._store is None:
            return
        try:
            self._seq += 1
            _messages.write(self._store, _store.announce(self._seq), _messages.Close(self._seq))
            self._store.add(_store.ANNOUNCE_COUNT, 1)
            self._read_membership()
            keys = [_store.ack(self._seq, o) for o in self._membership.members]
            _store.wait_keys(self._store, keys, min(linger, self._timings.step))
        finally:
            self._heartbeat.stop()
            self._spares.close()
            for live in self._groups.values():
                live.fail("closed")
            self._groups.clear()
            self._pool.shutdown(wait=False)
            self._store = None  # type: ignore[assignment]
