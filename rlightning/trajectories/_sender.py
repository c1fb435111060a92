"""The evaluator's side: one zmq DEALER per trainer rank, routed by the room each rank reports, with credits.

Every acknowledgement carries the rank's room (how many more batches its current `fill` wants), and each batch goes to
the connected rank expected to want the most (`_expected_room`), ties rotating with the ordinal, the stamp's version and
the batches already sent of that version, so evaluators spread over the ranks: on-policy, where each sends one batch per
version, the evaluators' batches of a version go to different ranks rather than two to one rank (whose second would wait
unread and be stale by the next fill). A DEALER per rank, rather than one DEALER round-robining among all, is what lets
the sender choose. `IMMEDIATE` keeps a rank that is not connected unwritable, so it gets no batches; a rank that answers
no heartbeat for `ack_timeout` seconds is disconnected, so a silent one (a lost node) stops taking batches; a rank that
disconnects is forgotten (what it reported no longer holds once it restarts). At most `credits` batches are in flight
(sent, not yet acknowledged); an acknowledgement returns a credit, and so does a batch with no acknowledgement after
`ack_timeout` seconds or whose rank disconnected, counted lost (its rank died holding it: a restarted trainer gang
cannot acknowledge it). `wanted(version)` tells an evaluator whether any rank may still take a batch of that version,
and `too_old(version, max_policy_lag)` whether every rank's fill is already more than the lag past it. A
restarted trainer's pull (`[b"pull"]`) is answered with `held_weights()` whenever the sender reads its sockets (every
call but `close`). Host names are resolved by libzmq when it (re)connects, in its I/O thread, so a rank whose name does
not resolve yet (a pod not yet created) is retried from `RECONNECT_SECONDS` on and never fails the sender. Use a sender
from one thread.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from collections.abc import Callable, Mapping, Sequence

import torch
import zmq
from tensordict import TensorDictBase
from zmq.utils import monitor

from rlightning.trajectories import _codec, _messages, _pull
from rlightning.trajectories._stamp import BatchStamp

log = logging.getLogger(__name__)

RECONNECT_SECONDS = 0.2
"""First retry of a connection to a rank that is down or does not resolve (libzmq's `RECONNECT_IVL`)."""

RECONNECT_MAX_SECONDS = 2.0
"""Longest retry interval after repeated failures (`RECONNECT_IVL_MAX`), so a restarted rank is found quickly."""

HEARTBEAT_SECONDS = 1.0
"""Interval of ZMTP heartbeats (PING) to each rank, so a rank that went silent without closing its connection (a
lost node: no FIN, no RST) is disconnected `ack_timeout` seconds later and gets no more batches."""

ACK_QUEUE_MESSAGES = 1000
"""Receive high-water mark for acknowledgements; each is a few bytes and `credits` bound how many can be due."""

CONNECTION_EVENTS = zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED
"""The socket-monitor events that tell whether a rank is connected now (a ZMTP handshake done, and no disconnect
since: closed, reset, or heartbeats missed)."""


@dataclasses.dataclass
class _Rank:
    """One trainer rank as a sender sees it: its socket, whether it is connected, what it last reported."""

    endpoint: str
    socket: zmq.Socket[bytes]
    events: zmq.Socket[bytes]  # the socket's monitor
    connected: bool = False
    room: int | None = None  # from its latest acknowledgement or notice; None before one (or since it disconnected)
    room_version: int = 0  # the stamp version of the batch that acknowledgement answered, or the full fill's version
    fill_version: int | None = None  # the newest version its `full` notices judged against; None before one


@dataclasses.dataclass
class _InFlight:
    """A batch sent and not yet acknowledged: when, to which rank, and its stamp's version."""

    sent_at: float  # time.monotonic()
    rank: _Rank
    version: int


@dataclasses.dataclass
class SenderCounts:
    """Cumulative counts of one `TrajectorySender`.

    Attributes:
        sent (int): Batches handed to zmq for a connected rank.
        accepted (int): Acknowledged as held for training.
        stale (int): Acknowledged as dropped for policy lag.
        invalid (int): Acknowledged as dropped for being malformed or failing validation.
        older_attempt (int): Acknowledged as dropped for being acted with an older trainer attempt's weights.
        lost (int): Never acknowledged within `ack_timeout`, or not sent because no rank was connected.
    """

    sent: int = 0
    accepted: int = 0
    stale: int = 0
    invalid: int = 0
    older_attempt: int = 0
    lost: int = 0


class TrajectorySender:
    """Stream trajectory batches from one evaluator to the trainer ranks that want them, at most `credits` in flight.

    Args:
        endpoints (Sequence[str]): `"host:port"` of every trainer rank's `TrajectoryIntake`; hosts may not resolve
            yet.
        ordinal (int): This evaluator's ordinal; every stamp sent must carry it.
        credits (int, optional): Most batches in flight (>= 1). Defaults to 2: one being judged, one on the wire.
        ack_timeout (float, optional): Seconds after which an unacknowledged batch counts as lost and its credit
            returns; longer than a trainer's longest pause between intake reads (a training step). Defaults to 60.0.
        held_weights (Callable[[], tuple[int, Mapping[str, torch.Tensor]]] | None, optional): The weight version
            this evaluator holds and a snapshot of its weights (clean names; not changed while encoded), for a
            restarted trainer's pull. Defaults to None (every pull is answered with version 0, no weights).

    Raises:
        ValueError: Naming the argument, when `endpoints` is empty or holds one without a port, or `credits` or
            `ack_timeout` is not positive.

    Attributes:
        counts (SenderCounts): Cumulative counts.
        evaluation_asked (int): The newest weight version a rank asked this evaluator to evaluate now (0: none),
            as read with the acknowledgements.
        evaluation_episodes (int | None): The episodes of `evaluation_asked` asked of this evaluator (None: as many
            as a report takes, `eval.episodesPerReport`).

    Examples:
        >>> sender = TrajectorySender(["trainer-0.train:29700", "trainer-1.train:29700"], ordinal=3)
        >>> if sender.wait_for_credit(timeout=5.0):
        ...     sender.send(batch, BatchStamp(version=7, ordinal=3, sequence=1, env_steps=256))
        >>> sender.wanted(7)  # False once every connected rank said it holds enough of version 7 or newer
        True
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        ordinal: int,
        credits: int = 2,  # noqa: A002 - flow control's own term; the builtin is never needed here
        ack_timeout: float = 60.0,
        held_weights: Callable[[], tuple[int, Mapping[str, torch.Tensor]]] | None = None,
    ) -> None:
        if not endpoints:
            raise ValueError("endpoints: must name at least one trainer rank as host:port")
        for endpoint in endpoints:
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"endpoints: {endpoint!r} must be host:port")
        if credits < 1:
            raise ValueError(f"credits: must be >= 1, got {credits}")
        if ack_timeout <= 0:
            raise ValueError(f"ack_timeout: must be > 0 seconds, got {ack_timeout}")
        self.ordinal = ordinal
        self.credits = credits
        self.ack_timeout = ack_timeout
        self.counts = SenderCounts()
        self.evaluation_asked = 0
        self.evaluation_episodes: int | None = None
        self._held_weights = held_weights
        self._in_flight: dict[int, _InFlight] = {}  # sequence -> its batch, oldest first
        self._sent_of_version = (0, 0)  # the newest stamp version sent, and how many batches of it were sent
        self._context = zmq.Context()  # its own, so close() ends every connection before returning
        self._ranks: list[_Rank] = []
        self._poller = zmq.Poller()
        for endpoint in endpoints:
            socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
            socket.setsockopt(zmq.IMMEDIATE, 1)
            socket.setsockopt(zmq.PROBE_ROUTER, 1)  # the rank can address a pull to it before any batch
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.SNDHWM, credits)
            socket.setsockopt(zmq.RCVHWM, ACK_QUEUE_MESSAGES)
            socket.setsockopt(zmq.RECONNECT_IVL, int(RECONNECT_SECONDS * 1000))
            socket.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_MAX_SECONDS * 1000))
            socket.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_SECONDS * 1000))
            socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(ack_timeout * 1000))
            self._ranks.append(_Rank(endpoint, socket, socket.get_monitor_socket(CONNECTION_EVENTS)))
            # libzmq 4.3 (checked: 4.3.5) defers name resolution to each connect attempt, retried on failure; it
            # raises only for a malformed address.
            try:
                socket.connect(f"tcp://{endpoint}")
            except zmq.ZMQError as err:
                self.close()
                raise ValueError(f"endpoints: {endpoint!r} is not a valid tcp address ({err})") from err

    @property
    def in_flight(self) -> int:
        """Batches sent and neither acknowledged nor counted lost yet."""
        return len(self._in_flight)

    @property
    def connected(self) -> int:
        """Trainer ranks connected now: a ZMTP handshake done and no disconnect since (reads what has arrived)."""
        self._read_events()
        return sum(rank.connected for rank in self._ranks)

    def wait_for_credit(self, timeout: float) -> bool:
        """Process acknowledgements until a credit is free and a rank is connected, or `timeout` passes.

        Args:
            timeout (float): Seconds to wait at most (0 checks once).

        Returns:
            bool: True when `send` may be called now; False when the ranks have not acknowledged enough batches
            (they are busy training: backpressure) or none is connected.
        """
        return self._wait(lambda: any(self._writable(rank) for rank in self._ranks), self.credits, timeout)

    def wait_for_acks(self, timeout: float) -> bool:
        """Process acknowledgements until no batch is in flight (each acknowledged or counted lost), or `timeout`
        passes: how an evaluator paces itself to the ranks' reads (`rlightning.runtime.eval.BatchPacing`).

        Args:
            timeout (float): Seconds to wait at most (0 checks once).

        Returns:
            bool: True when nothing is in flight.
        """
        return self._wait(lambda: True, 1, timeout)

    def _wait(self, ready: Callable[[], bool], limit: int, timeout: float) -> bool:
        """Read events and acknowledgements until fewer than `limit` batches are in flight and `ready()` holds."""
        deadline = time.monotonic() + timeout
        while True:
            self._read_events()
            now = time.monotonic()
            self._expire(now)
            below = len(self._in_flight) < limit
            if below and ready():
                return True
            wait = deadline - now
            if wait <= 0:
                return False
            if self._in_flight:
                wait = min(wait, next(iter(self._in_flight.values())).sent_at + self.ack_timeout - now)
            for rank in self._ranks:
                self._poller.register(rank.socket, zmq.POLLIN | (zmq.POLLOUT if below else 0))
            self._poller.poll(max(1, int(wait * 1000)))

    def send(self, batch: TensorDictBase, stamp: BatchStamp) -> None:
        """Send one batch to the connected trainer rank expected to want the most, taking a credit.

        A rank that disconnects between `wait_for_credit` and this call leaves no rank to send to: the batch is
        then counted lost, not sent, and no credit is taken.

        Args:
            batch (TensorDictBase): Experience `[*B]` (see `encode_batch`).
            stamp (BatchStamp): Its stamp, with this sender's ordinal and a sequence not in flight.

        Raises:
            RuntimeError: When no credit is free (call `wait_for_credit` first).
            ValueError: When the stamp's ordinal is not this sender's, or its sequence is in flight.
        """
        if stamp.ordinal != self.ordinal:
            raise ValueError(f"stamp.ordinal: must be this sender's ordinal {self.ordinal}, got {stamp.ordinal}")
        if stamp.sequence in self._in_flight:
            raise ValueError(f"stamp.sequence: {stamp.sequence} is already in flight")
        self._read_events()
        self._expire(time.monotonic())
        if len(self._in_flight) >= self.credits:
            raise RuntimeError(
                f"trajectory sender {self.ordinal}: no credit ({self.credits} batches unacknowledged); "
                "call wait_for_credit first"
            )
        frames = _messages.batch_frames(stamp.sequence, _codec.encode_batch(batch, stamp))
        for rank in self._route(stamp):
            try:
                rank.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
            except zmq.Again:
                continue  # it disconnected since it was found writable: the next choice
            self._in_flight[stamp.sequence] = _InFlight(time.monotonic(), rank, stamp.version)
            self.counts.sent += 1
            version, sent = self._sent_of_version
            self._sent_of_version = (stamp.version, sent + 1 if version == stamp.version else 1)
            return
        self.counts.lost += 1
        log.warning("trajectory sender %d: no trainer rank connected, batch %d dropped", self.ordinal, stamp.sequence)

    def wanted(self, version: int) -> bool:
        """Whether a trainer rank may still take a batch of `version` (processes acknowledgements first).

        A rank's room is what its latest message said: an acknowledgement of this evaluator's batch, or the
        `full` notice a rank sends every evaluator, unasked, when batches from others completed its fill.

        Args:
            version (int): The weight version the next batch would be stamped with.

        Returns:
            bool: False when every connected rank's latest acknowledgement said room 0 for a batch stamped with
            `version` or newer (they hold enough of it; under `maxPolicyLag` 0 they next need a newer version);
            True otherwise, including before any acknowledgement and while no rank is connected.
        """
        self._read_events()
        connected = [rank for rank in self._ranks if rank.connected]
        return not connected or any(rank.room != 0 or rank.room_version < version for rank in connected)

    def too_old(self, version: int, max_policy_lag: int) -> bool:
        """Whether a batch of `version` would be stale on arrival at every connected rank (processes acknowledgements
        first): each rank's `full` notices said its fill judged a version more than `max_policy_lag` newer, and a
        rank's version never goes back while it stays connected.

        Args:
            version (int): The weight version the next batch would be stamped with.
            max_policy_lag (int): `train.maxPolicyLag`, in versions (>= 0).

        Returns:
            bool: True when at least one rank is connected and every connected rank is known to be past
            `version + max_policy_lag`; False otherwise, including before any `full` notice.
        """
        self._read_events()
        connected = [rank for rank in self._ranks if rank.connected]
        return bool(connected) and all(
            rank.fill_version is not None and rank.fill_version - version > max_policy_lag for rank in connected
        )

    def close(self) -> None:
        """Close the sockets and their connections at once; batches still queued in zmq are discarded (`LINGER` 0)."""
        for rank in self._ranks:
            rank.socket.disable_monitor()
            rank.events.close(linger=0)
            rank.socket.close(linger=0)
        self._context.term()

    def _route(self, stamp: BatchStamp) -> list[_Rank]:
        """The writable ranks, best first: most expected room, ties rotated by ordinal + version + the batches of
        that version already sent.
        """
        writable = [rank for rank in self._ranks if self._writable(rank)]
        if not writable:
            return []
        version, sent = self._sent_of_version
        shift = (self.ordinal + stamp.version + (sent if version == stamp.version else 0)) % len(writable)
        rotated = writable[shift:] + writable[:shift]
        return sorted(rotated, key=lambda rank: -self._expected_room(rank, stamp.version))  # stable: keeps rotation

    def _expected_room(self, rank: _Rank, version: int) -> float:
        """How many more batches `rank` is expected to want.

        Its reported room less this sender's batches sent to it since (acknowledgements come back in order). A rank
        that has not reported wants without limit while nothing is pending to it; while its answer is on the way it
        may be full already, so it ranks after every rank known to want one more (0.5: a tie with a known room of 1
        could send a full rank a batch it never reads while another rank waits for it). A room of 0 reported for a
        batch older than `version` counts as 1: that fill is over or ending, and the rank will want newer data.
        """
        pending = sum(1 for batch in self._in_flight.values() if batch.rank is rank)
        if rank.room is None:
            return math.inf if pending == 0 else 0.5
        room = 1 if rank.room == 0 and rank.room_version < version else rank.room
        return room - pending

    @staticmethod
    def _writable(rank: _Rank) -> bool:
        # With IMMEDIATE, POLLOUT means the rank is connected and has room for a message.
        events = rank.socket.get(zmq.EVENTS)
        return isinstance(events, int) and bool(events & zmq.POLLOUT)

    def _read_events(self) -> None:
        for rank in self._ranks:
            self._read_connection_events(rank)
            self._read_acks(rank)

    def _read_connection_events(self, rank: _Rank) -> None:
        while True:
            try:
                event = monitor.recv_monitor_message(rank.events, flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            rank.connected = event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED
            if not rank.connected:
                rank.room = rank.fill_version = None  # a rank that comes back is a new fill, perhaps a new process
                self._lose_batches_of(rank)

    def _lose_batches_of(self, rank: _Rank) -> None:
        """Count the batches in flight to a rank that disconnected as lost and return their credits now: the ROUTER
        of the process that comes back (a restarted trainer gang) sees a new peer, so no acknowledgement can come.
        """
        lost = [sequence for sequence, batch in self._in_flight.items() if batch.rank is rank]
        for sequence in lost:
            del self._in_flight[sequence]
        if lost:
            self.counts.lost += len(lost)
            log.warning("trajectory sender %d: %s disconnected with batches %s unacknowledged, counted lost",
                        self.ordinal, rank.endpoint, lost)

    def _read_acks(self, rank: _Rank) -> None:
        while True:
            try:
                frames = rank.socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            if frames == [_messages.PULL]:
                self._answer_pull(rank)
                continue
            full = _messages.parse_notice(_messages.FULL, frames)
            if full is not None:  # the rank's fill at version `full` holds its count
                rank.room, rank.room_version = 0, full[0]
                rank.fill_version = max(full[0], rank.fill_version or 0)
                continue
            evaluate = _messages.parse_notice(_messages.EVALUATE, frames)
            if evaluate is not None:
                self._asked(*evaluate)
                continue
            ack = _messages.parse_ack(frames)
            # An ack for a batch already counted lost is late, not double: its credit was returned once.
            if ack is None or (batch := self._in_flight.pop(ack.sequence, None)) is None:
                continue
            rank.room, rank.room_version = ack.room, batch.version
            if ack.outcome is _messages.Outcome.ACCEPTED:
                self.counts.accepted += 1
            elif ack.outcome is _messages.Outcome.STALE:
                self.counts.stale += 1
            elif ack.outcome is _messages.Outcome.OLDER_ATTEMPT:
                self.counts.older_attempt += 1
            else:
                self.counts.invalid += 1

    def _asked(self, version: int, episodes: int | None = None) -> None:
        """Keep the newest request to evaluate; an older one, from a rank that was behind, changes nothing."""
        if version > self.evaluation_asked:
            self.evaluation_asked, self.evaluation_episodes = version, episodes

    def _answer_pull(self, rank: _Rank) -> None:
        version, state = self._held_weights() if self._held_weights is not None else (0, {})
        frames = _messages.weights_frames(_pull.encode_weights(version, self.ordinal, state))
        try:
            rank.socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:  # its queue holds batches up to SNDHWM: the rank asks another evaluator meanwhile
            log.warning("trajectory sender %d: cannot answer %s's pull now (queue full)", self.ordinal, rank.endpoint)
            return
        log.info("trajectory sender %d: answered %s's pull with weight version %d", self.ordinal, rank.endpoint,
                 version)

    def _expire(self, now: float) -> None:
        for sequence, batch in list(self._in_flight.items()):
            if now - batch.sent_at < self.ack_timeout:
                break  # insertion order is send order
            del self._in_flight[sequence]
            self.counts.lost += 1
            log.warning("trajectory sender %d: batch %d unacknowledged after %.1fs, counted lost",
                        self.ordinal, sequence, self.ack_timeout)
