"""A trainer rank's side: one zmq ROUTER that evaluators connect to, judged and acknowledged batch by batch.

The socket is read only inside `fill`, so a rank busy training reads nothing: the batches in flight stay queued
(bounded by `QUEUE_MESSAGES` per evaluator and by each sender's credits), acknowledgements stop, and the
evaluators' credits run out (backpressure, never unbounded memory). Every batch read is judged at once (stale,
invalid or accepted) and acknowledged to its sender with that outcome and the fill's room (how many more batches it
still wants), by which senders route their next batches. Accepted batches are held until `drain`;
those that became stale for a newer version by the next `fill` are dropped and counted then. A restarted trainer's
rank 0 may first `pull_weights` from an evaluator (the batches it reads meanwhile wait for the next `fill`, judged and
acknowledged there as if still queued). Use an intake from one thread.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import logging
import time
from collections.abc import Callable

import zmq
from tensordict import TensorDict

from rlightning.trajectories import _codec, _messages, _pull
from rlightning.trajectories._stamp import BatchStamp

log = logging.getLogger(__name__)

QUEUE_MESSAGES = 8
"""Receive high-water mark per connected evaluator, in batches; above a sender's credits, so it never binds in
normal operation and only caps a misbehaving sender."""

PEERS_REMEMBERED = 4096
"""Evaluators (zmq identities) an intake remembers for its notices, the most recently heard from; an evaluator that
restarts is a new identity, so the oldest are forgotten first."""

ACK_QUEUE_MESSAGES = 1000
"""Send high-water mark for acknowledgements per evaluator (a few bytes each); past it zmq drops them."""

PULL_ANSWER_SECONDS = 5.0
"""How long `pull_weights` waits for one evaluator's answer before it asks the next. An evaluator answers when it
next reads its sockets: between batches and evaluation episodes (CartPole: well under a second)."""


@dataclasses.dataclass
class IntakeStats:
    """Cumulative counts of one `TrajectoryIntake`.

    Attributes:
        accepted (int): Batches handed out by `drain`.
        stale (int): Batches dropped for policy lag, on arrival or while held for a newer version.
        invalid (int): Batches dropped as malformed or rejected by `validate`.
        older_attempt (int): Batches dropped as acted with the weights of an older trainer attempt (`BatchStamp.epoch`
            below the intake's `epoch`): evaluators that had not yet taken this attempt's first publish, or that
            reach a trainer of an older attempt which came back.
        env_steps (dict[int, int]): Evaluator ordinal -> env steps of its batches handed out by `drain`.
        lag_sum (int): Sum over batches handed out of their policy lag, in versions (the `fill` version minus the
            stamp's, at least 0).
        lag_max (int): Largest such lag.
        wait_seconds (float): Seconds spent inside `fill`.
    """

    accepted: int = 0
    stale: int = 0
    invalid: int = 0
    older_attempt: int = 0
    env_steps: dict[int, int] = dataclasses.field(default_factory=dict)
    lag_sum: int = 0
    lag_max: int = 0
    wait_seconds: float = 0.0

    @property
    def lag_mean(self) -> float:
        """Mean policy lag of the batches handed out, in versions (0.0 before any)."""
        return self.lag_sum / self.accepted if self.accepted else 0.0


class TrajectoryIntake:
    """Receive trajectory batches from the evaluators on one port, keeping those fresh and valid enough to train on.

    Args:
        port (int): TCP port to bind.
        validate (Callable[[TensorDict], str | None] | None, optional): The trainer's check of a decoded batch:
            None when it can train on it, else the reason it cannot (keys, shapes, dtypes). Defaults to None (any
            well-formed batch).
        bind_host (str, optional): Interface to bind; `"*"` for all. Defaults to "*".
        epoch (int, optional): This trainer attempt's epoch (`contract.ENV_TRAIN_EPOCH`): batches stamped with an older
            one are dropped, counted in `stats.older_attempt` and logged once per evaluator. Defaults to 0.

    Raises:
        OSError: Naming the port, when it is taken (`errno.EADDRINUSE`) or cannot be bound.

    Attributes:
        stats (IntakeStats): Cumulative counts.

    Examples:
        >>> intake = TrajectoryIntake(29700)
        >>> if intake.fill(count=4, version=7, max_policy_lag=0, timeout=30.0):
        ...     batches = intake.drain()  # 4 x (TensorDict [T, N], BatchStamp with version >= 7)
    """

    def __init__(
        self,
        port: int,
        validate: Callable[[TensorDict], str | None] | None = None,
        bind_host: str = "*",
        epoch: int = 0,
    ) -> None:
        self.port, self.epoch = port, epoch
        self.stats = IntakeStats()
        self._validate = validate
        self._held: list[tuple[TensorDict, BatchStamp]] = []
        self._version = 0
        self._count = 0  # the current (or last) fill's count, for the room acknowledged
        self._logged_drops: set[str] = set()  # sources whose dropped batches were logged (once each)
        self._peers: dict[bytes, None] = {}  # identities heard from, oldest first
        self._connected: dict[bytes, None] = {}  # identities that announced a connection (PROBE_ROUTER), oldest first
        self._unread: list[list[bytes]] = []  # batches read by `pull_weights`, for the next fill to judge
        # A context of its own, so that close() can wait for libzmq to release the port (Context.term).
        self._context = zmq.Context()
        self._socket: zmq.Socket[bytes] = self._context.socket(zmq.ROUTER)
        self._socket.setsockopt(zmq.LINGER, 0)
        self._socket.setsockopt(zmq.RCVHWM, QUEUE_MESSAGES)
        self._socket.setsockopt(zmq.SNDHWM, ACK_QUEUE_MESSAGES)
        try:
            self._socket.bind(f"tcp://{bind_host}:{port}")
        except zmq.ZMQError as err:
            self.close()
            if err.errno == errno.EADDRINUSE:
                raise OSError(errno.EADDRINUSE, f"trajectory intake: port {port} is already in use") from err
            raise OSError(err.errno, f"trajectory intake: cannot bind {bind_host}:{port} ({err})") from err

    @property
    def held(self) -> int:
        """Accepted batches held for the next `drain`."""
        return len(self._held)

    def fill(self, count: int, version: int, max_policy_lag: int, timeout: float) -> bool:
        """Read, judge and acknowledge batches until `count` accepted ones are held, or `timeout` passes.

        A batch is accepted when `version - stamp.version <= max_policy_lag` (a stamp newer than `version` counts as
        lag 0) and `validate` returns None; otherwise it is dropped, counted as stale or invalid (an invalid one
        logged once per evaluator with the reason). Held batches that are stale for `version` are dropped first.
        Each acknowledgement carries the room left after that batch: `count` minus the batches held, at least 0.

        Args:
            count (int): Accepted batches wanted (>= 1).
            version (int): The weight version the next update starts from.
            max_policy_lag (int): `spec.train.maxPolicyLag`, in versions (>= 0).
            timeout (float): Seconds to read at most.

        Returns:
            bool: True when `count` batches are held (more may arrive later); False on timeout, keeping what is held
            for the next call.
        """
        started = time.monotonic()
        deadline = started + timeout
        self._version = version
        self._count = count
        fresh = [(batch, stamp) for batch, stamp in self._held if version - stamp.version <= max_policy_lag]
        self.stats.stale += len(self._held) - len(fresh)
        self._held = fresh
        try:
            while len(self._held) < count:
                if self._unread:
                    self._judge(self._unread.pop(0), version, max_policy_lag)
                    continue
                wait = deadline - time.monotonic()
                if wait <= 0 or not self._socket.poll(max(1, int(wait * 1000)), zmq.POLLIN):
                    return len(self._held) >= count
                self._judge(self._socket.recv_multipart(), version, max_policy_lag)
            return True
        finally:
            self.stats.wait_seconds += time.monotonic() - started

    def drain(self) -> list[tuple[TensorDict, BatchStamp]]:
        """Hand out the held batches, oldest first, and count them as accepted.

        Returns:
            list[tuple[TensorDict, BatchStamp]]: Each batch (CPU, `[*B]` as sent) with its stamp.
        """
        held, self._held = self._held, []
        for _, stamp in held:
            lag = max(0, self._version - stamp.version)
            self.stats.accepted += 1
            self.stats.env_steps[stamp.ordinal] = self.stats.env_steps.get(stamp.ordinal, 0) + stamp.env_steps
            self.stats.lag_sum += lag
            self.stats.lag_max = max(self.stats.lag_max, lag)
        return held

    def pull_weights(self, version: int, timeout: float) -> _pull.HeldWeights | None:
        """Ask the connected evaluators, one at a time, for the weights they hold (a restarted trainer's start).

        An evaluator is asked once it has connected; the next one is asked when it answers without `version`, or
        after `PULL_ANSWER_SECONDS` without an answer (a late answer still counts). Batches read meanwhile wait for
        the next `fill`.

        Args:
            version (int): The fleet's newest version (the weight-sync store's registrations): the first answer
                holding it (or a newer one) ends the pull.
            timeout (float): Seconds to wait at most.

        Returns:
            HeldWeights | None: The first answer holding `version` or newer; else, once every evaluator that connected
            has answered and none connected for `PULL_ANSWER_SECONDS` (or at `timeout`), the newest answer holding
            any weights; None when no evaluator answered with weights.
        """
        deadline = time.monotonic() + timeout
        asked: set[bytes] = set()
        waiting: bytes | None = None  # asked, not answered yet
        asked_at = quiet_since = time.monotonic()
        best: _pull.HeldWeights | None = None
        while (now := time.monotonic()) < deadline:
            if waiting is not None and now - asked_at >= PULL_ANSWER_SECONDS:
                waiting = None
            if waiting is None:
                waiting = next((peer for peer in self._connected if peer not in asked), None)
                if waiting is not None:
                    asked.add(waiting)
                    asked_at = quiet_since = now
                    with contextlib.suppress(zmq.ZMQError):  # gone: no answer, the next is asked in time
                        self._socket.send_multipart([waiting, _messages.PULL], flags=zmq.NOBLOCK)
                elif best is not None and now - quiet_since >= PULL_ANSWER_SECONDS:
                    return best
            wake = deadline
            if waiting is not None:
                wake = min(wake, asked_at + PULL_ANSWER_SECONDS)
            elif best is not None:
                wake = min(wake, quiet_since + PULL_ANSWER_SECONDS)
            if not self._socket.poll(max(1, int((wake - now) * 1000)), zmq.POLLIN):
                continue
            frames = self._socket.recv_multipart()
            identity, body = frames[0], frames[1:]
            payload = _messages.parse_weights(body)
            if payload is None:
                if body == [_messages.PROBE]:
                    quiet_since = now
                self._read_later(frames)
                continue
            if identity == waiting:
                waiting = None
            try:
                held = _pull.decode_weights(payload)
            except ValueError as err:
                log.warning("trajectory intake %d: an evaluator's answer to the pull is malformed: %s", self.port, err)
                continue
            if held.version >= version:
                return held
            if held.version > 0 and (best is None or held.version > best.version):
                best = held
        return best

    def _read_later(self, frames: list[bytes]) -> None:
        """Remember a probe's identity at once; keep anything else for the next `fill` to judge."""
        if frames[1:] == [_messages.PROBE]:
            self._remember(self._connected, frames[0])
        else:
            self._unread.append(frames)

    @staticmethod
    def _remember(peers: dict[bytes, None], identity: bytes) -> None:
        peers.pop(identity, None)
        peers[identity] = None
        if len(peers) > PEERS_REMEMBERED:
            del peers[next(iter(peers))]

    def close(self) -> None:
        """Close the socket, releasing the port before returning; evaluators send their next batches to other ranks."""
        self._socket.close(linger=0)
        self._context.term()

    def _judge(self, frames: list[bytes], version: int, max_policy_lag: int) -> None:
        identity, body = frames[0], frames[1:]
        if body == [_messages.PROBE]:
            self._remember(self._connected, identity)
            return
        if _messages.parse_weights(body) is not None:
            return  # a late answer to a pull that already ended
        self._remember(self._peers, identity)
        sequence = body[0] if body else b""
        if len(body) != 2:
            self._reject(identity, sequence, f"peer {identity.hex()}", f"{len(body)} frames, expected 2")
            return
        try:
            batch, stamp = _codec.decode_batch(body[1])
        except _codec.BatchError as err:
            self._reject(identity, sequence, f"peer {identity.hex()}", str(err))
            return
        if stamp.epoch < self.epoch:
            self.stats.older_attempt += 1
            self._log_once(f"older attempt {stamp.ordinal}", "batches of evaluator %d acted with weights of attempt %d "
                           "dropped: this trainer is of attempt %d (logged once per evaluator)",
                           stamp.ordinal, stamp.epoch, self.epoch)
            self._ack(identity, sequence, _messages.Outcome.OLDER_ATTEMPT)
            return
        if version - stamp.version > max_policy_lag:
            self.stats.stale += 1
            self._ack(identity, sequence, _messages.Outcome.STALE)
            return
        reason = self._validate(batch) if self._validate is not None else None
        if reason is not None:
            self._reject(identity, sequence, f"evaluator {stamp.ordinal}", reason)
            return
        self._held.append((batch, stamp))
        self._ack(identity, sequence, _messages.Outcome.ACCEPTED)
        if len(self._held) == self._count:
            self._notify_full(version, but=identity)

    def ask_evaluation(self, version: int, episodes: int) -> None:
        """Ask every evaluator connected or heard from to play `episodes` evaluation episodes of `version` now (rank 0
        holds training to confirm the target on it). A notice that cannot be queued is skipped: that evaluator
        evaluates on its own schedule (`rlightning.runtime.eval.EvaluationSchedule`).

        Args:
            version (int): The weight version just published.
            episodes (int): Episodes asked of each evaluator (>= 1).
        """
        for peer in {**self._connected, **self._peers}:
            self._notify(peer, _messages.notice_frames(_messages.EVALUATE, version, episodes))

    def _notify_full(self, version: int, but: bytes) -> None:
        """Tell every other evaluator heard from that this fill holds its count (the last one knows from its ack)."""
        for peer in self._peers:
            if peer != but:  # one it cannot reach learns from its next acknowledgement instead
                self._notify(peer, _messages.notice_frames(_messages.FULL, version))

    def _notify(self, peer: bytes, frames: list[bytes]) -> None:
        with contextlib.suppress(zmq.ZMQError):  # gone, or its queue is full
            self._socket.send_multipart([peer, *frames], flags=zmq.NOBLOCK)

    def _reject(self, identity: bytes, sequence: bytes, source: str, reason: str) -> None:
        self.stats.invalid += 1
        self._log_once(source, "invalid batch from %s dropped (logged once per source): %s", source, reason)
        self._ack(identity, sequence, _messages.Outcome.INVALID)

    def _log_once(self, key: str, message: str, *args: object) -> None:
        """Log a dropped batch's reason at WARNING, once per `key`."""
        if key not in self._logged_drops:
            self._logged_drops.add(key)
            log.warning("trajectory intake %d: " + message, self.port, *args)

    def _ack(self, identity: bytes, sequence: bytes, outcome: _messages.Outcome) -> None:
        room = max(0, self._count - len(self._held))
        try:
            frames = [identity, *_messages.ack_frames(sequence, outcome, room)]
            self._socket.send_multipart(frames, flags=zmq.NOBLOCK)
        except zmq.ZMQError:
            pass  # the sender is gone or its queue is full: it counts the batch lost after its ack_timeout
