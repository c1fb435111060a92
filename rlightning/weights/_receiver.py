"""The receiving side of the protocol: follow announcements, receive, acknowledge, hand versions to the policy.

A receiver's session (`_receiver_session`: store connections, registration, the edges of its group's relay trees)
outlives the publishes; each publish is one round (`_receiver_round`), which relays every transfer on to the
receiver's children in its group's relay tree (`_relay`), or in each of its group's two trees, receiving alternate
transfers from a parent in each (`_topology.relay_trees`).
"""

from __future__ import annotations

import logging
import time
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
    _receiver_round,
    _receiver_session,
    _store,
    _topology,
    _types,
)

log = logging.getLogger(__name__)

EPOCHS_KEPT = 16
"""Versions whose epoch `WeightReceiver.epoch_of` remembers, the newest applied: a batch acted with an older one is
stale for any trainer long before."""


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
        self._session = _receiver_session.ReceiverSession(config, host, port, ordinal)
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

    @property
    def sender_closed(self) -> bool:
        """True after the sender announced `close()`, until the next announcement of a (restarted) sender."""
        return self._session.sender_closed

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
        session = self._session
        while True:
            try:
                store = session.connect(deadline, self.version)
                self._prepare_buckets()
                ann = session.next_announcement(store, deadline)
                if ann is None:
                    return None
                if isinstance(ann, _messages.Close):
                    session.closed_by_sender(store, ann.seq, self.version)
                    return None
                session.sender_closed = False
                got = self._take_part(store, ann, apply, into)
                if got is not None:
                    return got
                continue
            except _receiver_round.RoundFailed as exc:
                log.warning("receiver %d: publish dropped (%s); registering again", self.ordinal, exc)
                try:
                    session.register(self.version)
                    continue
                except RuntimeError as lost:
                    reason = str(lost)
            except TimeoutError:  # no store within the deadline
                return None
            except (RuntimeError, OSError) as lost:  # store lost or silent (heartbeat): the sender is gone
                reason = str(lost)
            log.warning("receiver %d lost the weight-sync store (%s); reconnecting", self.ordinal, reason)
            session.disconnect()
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

    def _take_part(
        self,
        store: dist.TCPStore,
        ann: _messages.Publish,
        apply: _destination.Apply | None,
        into: _inplace.InPlaceTarget | None,
    ) -> tuple[int, Mapping[str, torch.Tensor]] | None:
        verdict = _epoch.judge(self.epoch, (self.version_epoch, self.version), (ann.epoch, ann.version))
        self.epoch = max(self.epoch, ann.epoch)  # seen: a newer attempt's trainer exists
        session = self._session
        group = session.member_of(ann)
        if group is None:
            return None  # registered after the sender planned this publish: wait for the next one
        plans = _topology.relay_trees([m.ordinal for m in group.members], ann.fanout, ann.trees)
        session.join(group, plans)
        layout = session.layout(store, ann.signature)
        device = session.edges.parents[0].device
        if verdict is not _epoch.Verdict.APPLY:  # received aside (so the relay tree stays whole), never applied
            apply, into = None, None
        else:  # before `apply`: rollouts may start with the version before `receive` returns
            self._epochs[ann.version] = ann.epoch
            for version in list(self._epochs)[:-EPOCHS_KEPT]:
                del self._epochs[version]
        destination = self._choose_destination(layout, device, apply, into)
        part = _receiver_round.ReceiverRound(
            store, ann, self.ordinal, plans, session.edges, layout, destination, self._timings
        )
        part.receive()
        ack = self._verdict_ack(verdict, ann)
        state: Mapping[str, torch.Tensor] | None = None
        try:
            state = destination.complete(ann.version)
        except _destination.NotApplied as exc:
            log.error("receiver %d: version %d %s", self.ordinal, ann.version, exc)
            ack = _messages.Ack("failed", self.version, exc.error)
        part.acknowledge(ack)
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
        store = self._session.report_store  # the receiving thread may drop it meanwhile
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
        self._session.close()
