"""The evaluator's side: one zmq DEALER to every trainer rank, with credit-based flow control.

zmq round-robins the batches among the ranks it is connected to (`IMMEDIATE`: nothing is queued for a rank that is
not connected, so a dead or not yet started rank gets no batches). At most `credits` batches are in flight (sent,
not yet acknowledged); an acknowledgement from any rank returns a credit, and so does a batch with no
acknowledgement after `ack_timeout` seconds, counted lost (its rank died holding it); a rank that answers no
heartbeat for `ack_timeout` seconds is disconnected, so a silent one (a lost node) stops taking batches. Host
names are resolved by libzmq when it (re)connects, in its I/O thread, so a rank whose name does not resolve yet
(a pod not yet created) is retried from `RECONNECT_SECONDS` on and never fails the sender. Use a sender from one
thread.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Sequence

import zmq
from tensordict import TensorDictBase

from rlightning.trajectories import _codec, _messages
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


@dataclasses.dataclass
class SenderCounts:
    """Cumulative counts of one `TrajectorySender`.

    Attributes:
        sent (int): Batches handed to zmq for a connected rank.
        accepted (int): Acknowledged as held for training.
        stale (int): Acknowledged as dropped for policy lag.
        invalid (int): Acknowledged as dropped for being malformed or failing validation.
        lost (int): Never acknowledged within `ack_timeout`, or not sent because no rank was connected.
    """

    sent: int = 0
    accepted: int = 0
    stale: int = 0
    invalid: int = 0
    lost: int = 0


class TrajectorySender:
    """Stream trajectory batches from one evaluator to the trainer ranks, at most `credits` unacknowledged.

    Args:
        endpoints (Sequence[str]): `"host:port"` of every trainer rank's `TrajectoryIntake`; hosts may not resolve
            yet.
        ordinal (int): This evaluator's ordinal; every stamp sent must carry it.
        credits (int, optional): Most batches in flight (>= 1). Defaults to 2: one being judged, one on the wire.
        ack_timeout (float, optional): Seconds after which an unacknowledged batch counts as lost and its credit
            returns; longer than a trainer's longest pause between intake reads (a training step). Defaults to 60.0.

    Raises:
        ValueError: Naming the argument, when `endpoints` is empty or holds one without a port, or `credits` or
            `ack_timeout` is not positive.

    Attributes:
        counts (SenderCounts): Cumulative counts.

    Examples:
        >>> sender = TrajectorySender(["trainer-0.train:29700", "trainer-1.train:29700"], ordinal=3)
        >>> if sender.wait_for_credit(timeout=5.0):
        ...     sender.send(batch, BatchStamp(version=7, ordinal=3, sequence=1, env_steps=256))
    """

    def __init__(
        self,
        endpoints: Sequence[str],
        ordinal: int,
        credits: int = 2,  # noqa: A002 - flow control's own term; the builtin is never needed here
        ack_timeout: float = 60.0,
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
        self._in_flight: dict[int, float] = {}  # sequence -> monotonic time sent, oldest first
        self._context = zmq.Context()  # its own, so close() ends every connection before returning
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.DEALER)
        self._socket.setsockopt(zmq.IMMEDIATE, 1)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.SNDHWM, credits)
        self._socket.setsockopt(zmq.RCVHWM, ACK_QUEUE_MESSAGES)
        self._socket.setsockopt(zmq.RECONNECT_IVL, int(RECONNECT_SECONDS * 1000))
        self._socket.setsockopt(zmq.RECONNECT_IVL_MAX, int(RECONNECT_MAX_SECONDS * 1000))
        self._socket.setsockopt(zmq.HEARTBEAT_IVL, int(HEARTBEAT_SECONDS * 1000))
        self._socket.setsockopt(zmq.HEARTBEAT_TIMEOUT, int(ack_timeout * 1000))
        for endpoint in endpoints:
            # libzmq 4.3 (checked: 4.3.5) defers name resolution to each connect attempt, retried on failure; it
            # raises only for a malformed address.
            try:
                self._socket.connect(f"tcp://{endpoint}")
            except zmq.ZMQError as err:
                self.close()
                raise ValueError(f"endpoints: {endpoint!r} is not a valid tcp address ({err})") from err

    @property
    def in_flight(self) -> int:
        """Batches sent and neither acknowledged nor counted lost yet."""
        return len(self._in_flight)

    def wait_for_credit(self, timeout: float) -> bool:
        """Process acknowledgements until a credit is free and a rank is connected, or `timeout` passes.

        Args:
            timeout (float): Seconds to wait at most (0 checks once).

        Returns:
            bool: True when `send` may be called now; False when the ranks have not acknowledged enough batches
            (they are busy training: backpressure) or none is connected.
        """
        deadline = time.monotonic() + timeout
        while True:
            self._read_acks()
            now = time.monotonic()
            self._expire(now)
            credit_free = len(self._in_flight) < self.credits
            if credit_free and self._writable():
                return True
            wait = deadline - now
            if wait <= 0:
                return False
            if self._in_flight:
                wait = min(wait, next(iter(self._in_flight.values())) + self.ack_timeout - now)
            self._socket.poll(max(1, int(wait * 1000)), zmq.POLLIN | (zmq.POLLOUT if credit_free else 0))

    def send(self, batch: TensorDictBase, stamp: BatchStamp) -> None:
        """Send one batch to one connected trainer rank, taking a credit.

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
        self._read_acks()
        self._expire(time.monotonic())
        if len(self._in_flight) >= self.credits:
            raise RuntimeError(
                f"trajectory sender {self.ordinal}: no credit ({self.credits} batches unacknowledged); "
                "call wait_for_credit first"
            )
        frames = _messages.batch_frames(stamp.sequence, _codec.encode_batch(batch, stamp))
        try:
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.counts.lost += 1
            log.warning("trajectory sender %d: no trainer rank connected, batch %d dropped",
                        self.ordinal, stamp.sequence)
            return
        self._in_flight[stamp.sequence] = time.monotonic()
        self.counts.sent += 1

    def close(self) -> None:
        """Close the socket and its connections at once; batches still queued in zmq are discarded (`LINGER` 0)."""
        self._socket.close(linger=0)
        self._context.term()

    def _writable(self) -> bool:
        # With IMMEDIATE, POLLOUT means a connected rank has room for a message.
        events = self._socket.get(zmq.EVENTS)
        return isinstance(events, int) and bool(events & zmq.POLLOUT)

    def _read_acks(self) -> None:
        while True:
            try:
                frames = self._socket.recv_multipart(flags=zmq.NOBLOCK)
            except zmq.Again:
                return
            ack = _messages.parse_ack(frames)
            # An ack for a batch already counted lost is late, not double: its credit was returned once.
            if ack is None or self._in_flight.pop(ack[0], None) is None:
                continue
            outcome = ack[1]
            if outcome is _messages.Outcome.ACCEPTED:
                self.counts.accepted += 1
            elif outcome is _messages.Outcome.STALE:
                self.counts.stale += 1
            else:
                self.counts.invalid += 1

    def _expire(self, now: float) -> None:
        for sequence, sent_at in list(self._in_flight.items()):
            if now - sent_at < self.ack_timeout:
                break  # insertion order is send order
            del self._in_flight[sequence]
            self.counts.lost += 1
            log.warning("trajectory sender %d: batch %d unacknowledged after %.1fs, counted lost",
                        self.ordinal, sequence, self.ack_timeout)
