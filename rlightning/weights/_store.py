"""The weight-sync rendezvous store: hosting, connecting with backoff, key names, bounded calls, heartbeat.

One `torch.distributed.TCPStore`, hosted by the sender on the configured weight-sync port, never the DDP
store: an explicit TCPStore ignores `TORCHELASTIC_USE_AGENT_STORE`, which torchrun sets for its own group.
Every barrier or acknowledgement uses a key that is fresh per publish (`seq`), never a reused key. What the
values are, and their encoding, is `_messages`.

torch's c10d names both ends of every store connection it makes with `getnameinfo` (a reverse DNS lookup),
the client while connecting and the hosted store in its one event-loop thread, which then answers no one. Where
a DNS reply is lost, glibc waits its resolver timeout (5 s) for it. Hence the store listens on IPv4 (`host_store`,
so a loopback peer is named from /etc/hosts), every new connection may take `CONNECT_BOUND` whatever the store
calls' own timeout (`connect_again`), and group edges take connections opened ahead of need (`SpareConnections`),
so no connection is made on a publish's critical path. The client's lookup cannot be avoided: c10d connects over
IPv6 first, to the IPv4-mapped address (`::ffff:10.0.0.7`), which no /etc/hosts names.
"""

from __future__ import annotations

import datetime
import functools
import logging
import socket
import threading
import time
from collections.abc import Callable
from typing import TypeVar

import torch.distributed as dist

from rlightning.config import SyncTimings

T = TypeVar("T")

log = logging.getLogger(__name__)

ROOT = "rlightning/wsync/"
MEMBER_COUNT = ROOT + "members/n"
"""Counter of membership events (store.add); event i lives at `member_event(i)`."""
ANNOUNCE_COUNT = ROOT + "announce/n"
"""Sequence number of the newest announcement (store.add); announcement s lives at `announce(s)`."""
HEARTBEAT = ROOT + "heartbeat"
"""Counter the sender's `Heartbeat` thread advances (store.add) every `SyncTimings.heartbeat_period`; receivers that
see it stand still for more than `SyncTimings.heartbeat_stale` treat the sender as gone (e.g. its node vanished
without a RST)."""


CONNECT_BOUND = 15.0
"""Seconds a new store connection may take: above glibc's worst reverse lookup with the default resolver options
(2 attempts of 5 s each, resolv.conf(5)), which c10d makes for every connection it opens."""


def member_event(index: int) -> str:
    """Key of membership event `index` (1-based): a `_messages.Join` or `_messages.Leave`."""
    return f"{ROOT}members/{index}"


def announce(seq: int) -> str:
    """Key of announcement `seq`: a `_messages.Publish` (version, layout, groups) or `_messages.Close`."""
    return f"{ROOT}announce/{seq}"


def commit(seq: int, group: int) -> str:
    """Key of the `_messages.Commit` the sender sets once group `group` finished the broadcast of publish `seq`."""
    return f"{ROOT}commit/{seq}/{group}"


def ack(seq: int, ordinal: int) -> str:
    """Key of receiver `ordinal`'s `_messages.Ack` of announcement `seq`."""
    return f"{ROOT}ack/{seq}/{ordinal}"


def report(ordinal: int) -> str:
    """Key of the newest `ReceiverReport` of receiver `ordinal`; last writer wins, read by the sender."""
    return f"{ROOT}report/{ordinal}"


def group_prefix(group: int, generation: int) -> str:
    """PrefixStore prefix of broadcast group `group` at `generation` (a re-formed group never reuses keys)."""
    return f"{ROOT}pg/{group}/{generation}/"


def edge_prefix(group: int, generation: int, child: int, tree: int) -> str:
    """PrefixStore prefix of the relay edge into receiver `child` in relay tree `tree` of group `group` at
    `generation` (`_topology.relay_trees`).
    """
    return f"{group_prefix(group, generation)}edge/{tree}/{child}/"


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def host_store(port: int, timeout: float, ipv6: bool = False, bind_host: str | None = None) -> dist.TCPStore:
    """Host the weight-sync store on `port` (all interfaces, or `bind_host`) in this process.

    An IPv4 store listens on a socket of its own (`master_listen_fd`), not torch's dual-stack one: torch names
    every accepted peer with a reverse DNS lookup in the store's only thread, and an IPv4-mapped IPv6 peer
    (`::ffff:127.0.0.1`) is in no /etc/hosts, so each connection asked the DNS server; a lost reply stalled
    the whole store for glibc's resolver timeout (5 s), and every store call of the fleet with it. An IPv4
    loopback peer is named from /etc/hosts.

    Args:
        port (int): TCP port.
        timeout (float): default bound of blocking store calls, seconds.
        ipv6 (bool, optional): listen dual-stack (torch's own listener), for senders reached over IPv6, unless
            `bind_host` is given. Defaults to False.
        bind_host (str | None, optional): the one address to listen on (127.0.0.1 for a local run); None: all
            interfaces. Defaults to None.

    Returns:
        dist.TCPStore: the master store.

    Raises:
        torch.distributed.DistNetworkError: when the port is in use.
    """
    if ipv6 and bind_host is None:
        return dist.TCPStore("0.0.0.0", port, None, True, _timedelta(timeout), wait_for_workers=False)
    family = socket.AF_INET6 if bind_host is not None and ":" in bind_host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener does
    try:
        listener.bind((bind_host or "0.0.0.0", port))
    except OSError as exc:
        listener.close()
        raise dist.DistNetworkError(f"weight-sync store: cannot listen on {bind_host or '*'}:{port}: {exc}") from exc
    # the store owns the socket from here (it closes it)
    return dist.TCPStore(
        bind_host or "127.0.0.1", port, None, True, _timedelta(timeout), wait_for_workers=False,
        master_listen_fd=listener.detach(),
    )


class Backoff:
    """Exponential backoff of store connection attempts: 0.1 s doubling to 5 s between attempts, reset on success.

    A refused connection (the host answers, nothing listens on the port yet: a sender still starting) is retried
    `REFUSED_CAP` apart, since such an attempt costs one round trip (about 0.1 ms on loopback) and an evaluator that
    started before its trainer would otherwise find the store up to a backoff step late (`rlightning run` starts the
    evaluators first: the step was on the way to the first trained iteration); those attempts are logged at 1, 2, 4,
    8, ... only (`worth_logging`). A receiver keeps one backoff across its short `receive` calls, so waiting for an
    absent sender makes (and logs) one attempt per backoff step rather than starting again at 0.1 s on every call.
    """

    FIRST, CAP, REFUSED_CAP = 0.1, 5.0, 0.1

    def __init__(self) -> None:
        self.delay = self.FIRST
        self.attempt = 0
        self.not_before = 0.0
        """`time.monotonic()` before which no attempt is made."""
        self.last_error: Exception | None = None

    def failed(self, error: Exception) -> float:
        """Record a failed attempt; the next one waits `delay` seconds, which then doubles (up to `CAP`).

        Returns:
            float: seconds until the next attempt.
        """
        delay = min(self.delay, self.REFUSED_CAP) if isinstance(error, ConnectionRefusedError) else self.delay
        self.attempt += 1
        self.last_error = error
        self.not_before = time.monotonic() + delay
        self.delay = min(delay * 2, self.CAP)
        return delay

    def worth_logging(self) -> bool:
        """Whether the attempt recorded last deserves a log line: every attempt that failed otherwise than refused,
        and refused ones (`REFUSED_CAP` apart) at attempts 1, 2, 4, 8, ... (a power of two).
        """
        refused = isinstance(self.last_error, ConnectionRefusedError)
        return not refused or self.attempt & (self.attempt - 1) == 0

    def reset(self) -> None:
        """Start again at `FIRST` (after a successful connection)."""
        self.delay, self.attempt, self.not_before, self.last_error = self.FIRST, 0, 0.0, None


def probe(host: str, port: int, timeout: float) -> OSError | None:
    """Open and close a plain TCP connection to `host:port` (nothing is sent; the store logs nothing).

    c10d logs an ERROR with a C++ stack for every failed TCPStore client connection, so callers probe first
    and create the TCPStore only once something listens.

    Args:
        host (str): the sender's host.
        port (int): the store's port.
        timeout (float): bound of the connect, seconds.

    Returns:
        OSError | None: None when the connection was accepted, else why not (refused, timeout, DNS).
    """
    try:
        with socket.create_connection((host, port), timeout=max(timeout, 0.01)):
            return None
    except OSError as exc:  # ConnectionRefusedError, socket.timeout, socket.gaierror
        return exc


def _open(host: str, port: int, connect: float) -> dist.TCPStore:
    # bounded: a stopped sender's socket accepts the connection but never answers the handshake
    return bounded(
        functools.partial(dist.TCPStore, host, port, None, False, _timedelta(connect), wait_for_workers=False),
        connect + 1.0,
        "the connection",
    )


def connect_again(store: dist.TCPStore, timeout: float) -> dist.TCPStore:
    """Open another connection to the store `store` is connected to (or hosts), like `store.clone()`, but allowing
    it `CONNECT_BOUND` seconds to connect; its store calls then have `timeout`.

    `clone()` connects within the store calls' timeout, which a single slow reverse lookup (see the module
    docstring) exceeds when that timeout is short.

    Args:
        store (dist.TCPStore): a client or the hosted store.
        timeout (float): default bound of blocking store calls once connected, seconds.

    Returns:
        dist.TCPStore: a new client.

    Raises:
        RuntimeError: (torch's DistNetworkError, or `bounded`'s) when the connection failed within `CONNECT_BOUND`.
    """
    connection = _open(store.host, store.port, max(CONNECT_BOUND, timeout))
    connection.set_timeout(_timedelta(timeout))
    return connection


def connect_store(
    host: str, port: int, timeout: float, deadline: float | None = None, backoff: Backoff | None = None
) -> dist.TCPStore:
    """Connect to the weight-sync store, retrying with exponential backoff (0.1 s doubling to 5 s).

    Each attempt first probes `host:port` with a plain TCP connect (`probe`) and creates the TCPStore client
    only when that succeeds, so waiting for an absent sender logs one INFO line per attempt and no c10d errors.
    The TCPStore client may then take up to `CONNECT_BOUND` seconds (or what is left before `deadline`).

    Args:
        host (str): the sender's host.
        port (int): the store's port.
        timeout (float): default bound of blocking store calls once connected, seconds.
        deadline (float | None, optional): `time.monotonic()` after which to give up; None retries for as
            long as this process lives. Defaults to None.
        backoff (Backoff | None, optional): backoff state carried over from earlier calls (reset on success);
            None starts a fresh one. Defaults to None.

    Returns:
        dist.TCPStore: a client.

    Raises:
        TimeoutError: when `deadline` passes first.
    """
    backoff = backoff or Backoff()
    while True:
        now = time.monotonic()
        wait = backoff.not_before - now
        if wait > 0 and deadline is not None and now + wait > deadline:  # the first attempt is always made
            time.sleep(max(deadline - now, 0.0))
            raise TimeoutError(
                f"weight-sync store {host}:{port} unreachable after {backoff.attempt} attempts: {backoff.last_error}"
            )
        if wait > 0:
            time.sleep(wait)
        left = None if deadline is None else deadline - time.monotonic()
        # the probe is short, so a deadline is honoured closely; the connection itself may take a DNS stall
        short = min(backoff.delay * 10, 5.0)
        error: Exception | None = probe(host, port, max(0.5, short if left is None else min(short, left)))
        connect = max(0.5, CONNECT_BOUND if left is None else min(CONNECT_BOUND, left))
        if error is None:
            try:
                store = _open(host, port, connect)
                store.set_timeout(_timedelta(timeout))
                backoff.reset()
                return store
            except (RuntimeError, OSError) as exc:  # DistStoreError/DistNetworkError subclass RuntimeError
                error = exc
        delay = backoff.failed(error)
        if backoff.worth_logging():
            log.info(
                "weight-sync store %s:%d not reachable yet (attempt %d: %s); retrying in %.1f s",
                host, port, backoff.attempt, error, delay,
            )


def bounded(call: Callable[[], T], timeout: float, what: str) -> T:
    """Run a store call in a daemon thread and wait for it at most `timeout` seconds.

    A TCPStore client's `add`/`get`/`set` wait for the answer without bound (its timeout covers `wait` and
    connecting only), so a call to a sender whose node vanished (no FIN, no RST) would hang for ever. On a
    timeout the thread is left behind, blocked on a connection the caller must then drop.

    Args:
        call (Callable[[], T]): the store call.
        timeout (float): bound, seconds.
        what (str): what the call does, for the error.

    Returns:
        T: what `call` returned.

    Raises:
        RuntimeError: when `call` did not return within `timeout` (or raised it).
    """
    result: list = []
    done = threading.Event()

    def run() -> None:
        try:
            result.append((True, call()))
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            result.append((False, exc))
        finally:
            done.set()

    threading.Thread(target=run, name="wsync-call", daemon=True).start()
    if not done.wait(timeout):
        raise RuntimeError(f"weight-sync store did not answer {what} within {timeout:g} s")
    ok, value = result[0]
    if not ok:
        raise value
    return value


def wait_keys(store: dist.Store, keys: list[str], timeout: float) -> list[str]:
    """Wait until every key exists or `timeout` seconds pass.

    Args:
        store (dist.Store): the store.
        keys (list[str]): keys to wait for.
        timeout (float): bound in seconds (>= 0).

    Returns:
        list[str]: the keys still missing (empty when all arrived).
    """
    if keys:
        try:
            store.wait(keys, _timedelta(max(timeout, 0.001)))
        except (RuntimeError, dist.DistStoreError):
            pass
    return [k for k in keys if not store.check([k])]


class SpareConnections:
    """Store connections opened ahead of need, in the background; each one taken is used by one group only.

    Forming a broadcast group needs a connection of its own (a TCPStore client holds its lock through a blocking
    `get`, so groups forming at once on one client would wait for each other). Connecting may take a DNS stall
    (`CONNECT_BOUND`, see the module docstring), as long as a whole publish may wait for a peer, so connections
    are opened beforehand, each in a thread of its own (`connect_store`: probe, backoff), and `take` only hands one
    over. Keep twice the edges one publish forms: a tree re-formed twice in a row then still finds its connections
    ready (a receiver keeps one formation's worth until its first formation: each connection is a DNS lookup, and
    the fleet's at start come as one burst; docs/weight-sync.md, "The store and DNS"). Attempts go on (the sender
    restarting) until `close`.

    Args:
        store (dist.TCPStore): the store to connect to; only its `host` and `port` are kept, so the pool never
            keeps a hosting store (and its listening socket) alive after its owner dropped it.
        count (int): connections to keep ready (>= 1).
        timeout (float): default bound of the connections' blocking store calls, seconds.
    """

    def __init__(self, store: dist.TCPStore, count: int, timeout: float) -> None:
        self._host, self._port = store.host, store.port
        self._timeout = timeout
        self._count = count
        self._ready: list[dist.Store] = []
        self._opening = 0
        self._changed = threading.Condition()
        self._closed = False
        self._open_missing()

    def _open_missing(self) -> None:
        with self._changed:
            missing = 0 if self._closed else self._count - len(self._ready) - self._opening
            self._opening += max(missing, 0)
        for _ in range(missing):
            threading.Thread(target=self._open_one, name="wsync-spare", daemon=True).start()

    def _open_one(self) -> None:
        backoff = Backoff()  # one per thread: `connect_store` updates it
        while True:
            with self._changed:
                if self._closed:
                    self._opening -= 1
                    return
            try:  # in steps of `CONNECT_BOUND`, so a closed pool stops trying
                spare = connect_store(self._host, self._port, self._timeout,
                                      time.monotonic() + CONNECT_BOUND, backoff)
            except TimeoutError:
                continue
            with self._changed:
                self._opening -= 1
                if not self._closed:
                    self._ready.append(spare)
                    self._changed.notify_all()
                return

    def reserve(self, count: int) -> None:
        """Keep `count` connections ready from now on (opening the missing ones); never fewer than one."""
        with self._changed:
            self._count = max(count, 1)
        self._open_missing()

    def wait_ready(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds until every connection is ready; True when they are."""
        with self._changed:
            return self._changed.wait_for(lambda: self._closed or len(self._ready) >= self._count, timeout)

    def take(self, timeout: float) -> dist.Store:
        """A connection of its own for one group, waiting up to `timeout` seconds for one to be ready.

        Raises:
            RuntimeError: when none was ready within `timeout` or after `close()`.
        """
        with self._changed:
            self._changed.wait_for(lambda: self._closed or bool(self._ready), timeout)
            if self._closed or not self._ready:
                raise RuntimeError(f"no weight-sync store connection ready within {timeout:g} s")
            spare = self._ready.pop()
        self._open_missing()
        return spare

    def close(self) -> None:
        """Stop opening connections and drop the ready ones."""
        with self._changed:
            self._closed = True
            self._ready.clear()
            self._changed.notify_all()


class KeyWatcher:
    """Waits for keys, one at a time, on one long-lived store connection of its own, in a daemon thread.

    Lets a receiver poll with short timeouts without timing out store calls on its main connection, and keeps
    one connection for every publish: back-to-back publishes open no connection each (a connect per publish
    is what the connection test of tests/weights/test_weight_cadence.py rules out). `wait(key, timeout)` asks
    for `key`; the thread waits for the newest key asked for, re-arming its store wait in steps of at most
    `step` seconds (a TCPStore `wait` that times out logs one c10d warning, so steps are long), and moves on
    to a newer key after the current step. It ends when the connection breaks or fails to answer within the
    store's timeout (the sender went away), or on `cancel()`, which drops the connection after the step.

    Args:
        store (dist.Store): a connection of its own (e.g. `connect_again`), used only by this watcher.
        step (float): longest single wait, seconds (the receiver passes `SyncTimings.step`).
    """

    def __init__(self, store: dist.Store, step: float) -> None:
        self.error: Exception | None = None
        self._step = _timedelta(max(step, 0.01))
        self._changed = threading.Condition()
        self._wanted: str | None = None  # the newest key asked for
        self._found: str | None = None  # the newest key seen to exist
        self._cancelled = False
        self._store = store
        threading.Thread(target=self._run, name="wsync-watch", daemon=True).start()

    def _run(self) -> None:
        try:
            while True:
                with self._changed:
                    self._changed.wait_for(lambda: self._cancelled or self._wanted not in (None, self._found))
                    if self._cancelled:
                        return
                    key = self._wanted
                assert key is not None
                try:
                    self._store.wait([key], self._step)
                    present = True
                except RuntimeError:  # a timed-out step, or a lost connection: `check` tells them apart
                    present = self._store.check([key])  # raises when the store does not answer
                if present:
                    with self._changed:
                        self._found = key
                        self._changed.notify_all()
        except RuntimeError as exc:
            with self._changed:
                self.error = exc
                self._changed.notify_all()
        finally:
            self._store = None  # type: ignore[assignment]  # the connection closes with its last reference

    def cancel(self) -> None:
        """Stop at the end of the current step and drop the connection (the receiver dropped the store)."""
        with self._changed:
            self._cancelled = True
            self._changed.notify_all()

    def wait(self, key: str, timeout: float) -> bool:
        """Wait up to `timeout` seconds for `key`, superseding any older key asked for.

        Args:
            key (str): the key to wait for.
            timeout (float): bound, seconds (<= 0 only looks).

        Returns:
            bool: True when the key exists; False on timeout or after `cancel()`.

        Raises:
            RuntimeError: when the store connection broke.
        """
        with self._changed:
            if self._wanted != key:
                self._wanted = key
                self._changed.notify_all()
            self._changed.wait_for(
                lambda: self._found == key or self.error is not None or self._cancelled, max(timeout, 0.0)
            )
            if self.error is not None:
                raise RuntimeError(f"weight-sync store connection lost: {self.error}")
            return self._found == key and not self._cancelled


class Heartbeat:
    """Advances `HEARTBEAT` every `period` seconds from a daemon thread, on its own store connection.

    Args:
        store (dist.Store): a connection of its own (e.g. `connect_again` of the hosted store).
        period (float): seconds between beats (the sender passes `SyncTimings.heartbeat_period`).
    """

    def __init__(self, store: dist.Store, period: float) -> None:
        self._store, self._period = store, period
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="wsync-heartbeat", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            try:
                self._store.add(HEARTBEAT, 1)
            except RuntimeError as exc:  # the store is gone (closed): nothing to beat for
                log.debug("weight-sync heartbeat stopped: %s", exc)
                return
            if self._stop.wait(self._period):
                return

    def stop(self) -> None:
        """Stop beating and wait (bounded by one store call) for the thread to end."""
        self._stop.set()
        self._thread.join(timeout=5.0)


class HeartbeatMonitor:
    """Receiver side: decides from the sender's heartbeat whether the sender is still there.

    Args:
        timings (SyncTimings): the sender is gone when the heartbeat stands still longer than `heartbeat_stale`,
            checked at most every `heartbeat_check` seconds (each read bounded by `step`).
    """

    def __init__(self, timings: SyncTimings) -> None:
        self._timings = timings
        self._value: int | None = None
        self._changed = time.monotonic()
        self._checked = 0.0

    def check(self, store: dist.Store) -> None:
        """Read the heartbeat (at most every `heartbeat_check` s) and raise when it stood still too long.

        Args:
            store (dist.Store): a connection to the store (the read is bounded by `step`, see `bounded`).

        Raises:
            RuntimeError: when the read fails or the heartbeat has not advanced for more than `heartbeat_stale` s.
        """
        now = time.monotonic()
        if now - self._checked < self._timings.heartbeat_check:
            return
        value = bounded(lambda: store.add(HEARTBEAT, 0), self._timings.step, "a heartbeat read")
        now = self._checked = time.monotonic()
        if value != self._value:  # read before judging: a receiver resumed after a pause sees a fresh value
            self._value, self._changed = value, now
        elif now - self._changed > self._timings.heartbeat_stale:
            raise RuntimeError(f"sender heartbeat stood still for {now - self._changed:.1f} s")
