"""The weight-sync rendezvous store: hosting, connecting with backoff, key names and JSON values.

One `torch.distributed.TCPStore`, hosted by the sender on the configured weight-sync port, never the DDP
store: an explicit TCPStore ignores `TORCHELASTIC_USE_AGENT_STORE`, which torchrun sets for its own group.
Every barrier or acknowledgement uses a key that is fresh per publish (`seq`), never a reused key.
"""

from __future__ import annotations

import datetime
import json
import logging
import socket
import threading
import time

import torch.distributed as dist

log = logging.getLogger(__name__)

ROOT = "rlightning/wsync/"
MEMBER_COUNT = ROOT + "members/n"
"""Counter of membership events (store.add); event i lives at `member_event(i)`."""
ANNOUNCE_COUNT = ROOT + "announce/n"
"""Sequence number of the newest announcement (store.add); announcement s lives at `announce(s)`."""


def member_event(index: int) -> str:
    """Key of membership event `index` (1-based): JSON {"event": "join"|"leave", "ordinal", "session", ...}."""
    return f"{ROOT}members/{index}"


def announce(seq: int) -> str:
    """Key of announcement `seq`: JSON with the version, layout and groups of one publish."""
    return f"{ROOT}announce/{seq}"


def commit(seq: int, group: int) -> str:
    """Key the sender sets to "ok" or "failed" once group `group` finished the broadcast of publish `seq`."""
    return f"{ROOT}commit/{seq}/{group}"


def ack(seq: int, ordinal: int) -> str:
    """Key a receiver sets to the version it received in publish `seq`."""
    return f"{ROOT}ack/{seq}/{ordinal}"


def report(ordinal: int) -> str:
    """Key of the newest report (JSON) of receiver `ordinal`; last writer wins, read by the sender."""
    return f"{ROOT}report/{ordinal}"


def group_prefix(group: int, generation: int) -> str:
    """PrefixStore prefix of broadcast group `group` at `generation` (a re-formed group never reuses keys)."""
    return f"{ROOT}pg/{group}/{generation}/"


def _timedelta(seconds: float) -> datetime.timedelta:
    return datetime.timedelta(seconds=seconds)


def host_store(port: int, timeout: float) -> dist.TCPStore:
    """Host the weight-sync store on `port` (all interfaces) in this process.

    Args:
        port (int): TCP port.
        timeout (float): default bound of blocking store calls, seconds.

    Returns:
        dist.TCPStore: the master store.

    Raises:
        RuntimeError: (from torch) when the port is in use.
    """
    return dist.TCPStore("0.0.0.0", port, None, True, _timedelta(timeout), wait_for_workers=False)


class Backoff:
    """Exponential backoff of store connection attempts: 0.1 s doubling to 5 s between attempts, reset on success.

    A receiver keeps one across its short `receive` calls, so waiting for an absent sender makes (and logs) one
    attempt per backoff step rather than starting again at 0.1 s on every call.
    """

    FIRST, CAP = 0.1, 5.0

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
        delay = self.delay
        self.attempt += 1
        self.last_error = error
        self.not_before = time.monotonic() + delay
        self.delay = min(delay * 2, self.CAP)
        return delay

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


def connect_store(
    host: str, port: int, timeout: float, deadline: float | None = None, backoff: Backoff | None = None
) -> dist.TCPStore:
    """Connect to the weight-sync store, retrying with exponential backoff (0.1 s doubling to 5 s).

    Each attempt first probes `host:port` with a plain TCP connect (`probe`) and creates the TCPStore client
    only when that succeeds, so waiting for an absent sender logs one INFO line per attempt and no c10d errors.

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
        # each attempt's own connect bound is short, so a deadline is honoured closely
        bound = min(backoff.delay * 10, 5.0)
        connect = max(0.5, bound if left is None else min(bound, left))
        error: Exception | None = probe(host, port, connect)
        if error is None:
            try:
                store = dist.TCPStore(host, port, None, False, _timedelta(connect), wait_for_workers=False)
                store.set_timeout(_timedelta(timeout))
                backoff.reset()
                return store
            except (RuntimeError, dist.DistStoreError) as exc:  # DistNetworkError subclasses RuntimeError
                error = exc
        delay = backoff.failed(error)
        log.info(
            "weight-sync store %s:%d not reachable yet (attempt %d: %s); retrying in %.1f s",
            host, port, backoff.attempt, error, delay,
        )


def set_json(store: dist.Store, key: str, value: object) -> None:
    """Set `key` to `value` as JSON."""
    store.set(key, json.dumps(value, separators=(",", ":")))


def get_json(store: dist.Store, key: str) -> object:
    """The JSON value of `key`; blocks up to the store's timeout when the key is absent."""
    return json.loads(store.get(key))


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


class KeyWatcher:
    """Waits for one key on its own store connection in a daemon thread; callers wait on an event.

    Lets a receiver poll with short timeouts without timing out store calls: a TCPStore `wait` that times out
    logs a c10d warning each time, which would flood an idle evaluator's log. The thread ends when the key
    appears or the connection breaks (the sender went away).

    Args:
        store (dist.Store): a connection of its own (e.g. `clone()`), used only by this watcher.
        key (str): the key to wait for.
    """

    _FOREVER = datetime.timedelta(days=7)

    def __init__(self, store: dist.Store, key: str) -> None:
        self.key = key
        self.error: Exception | None = None
        self._done = threading.Event()
        self._store = store
        threading.Thread(target=self._run, name="wsync-watch", daemon=True).start()

    def _run(self) -> None:
        try:
            self._store.wait([self.key], self._FOREVER)
        except RuntimeError as exc:  # connection lost (or, after a week, a timeout)
            self.error = exc
        finally:
            self._done.set()

    @property
    def finished(self) -> bool:
        """Whether the key appeared or the wait failed."""
        return self._done.is_set()

    def wait(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for the key.

        Returns:
            bool: True when the key exists; False on timeout.

        Raises:
            RuntimeError: when the store connection broke.
        """
        if not self._done.wait(max(timeout, 0.0)):
            return False
        if self.error is not None:
            raise RuntimeError(f"weight-sync store connection lost: {self.error}")
        return True
