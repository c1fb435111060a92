"""A local run listens on loopback only: the rendezvous, the weight-sync store, the intakes and gloo's sockets.

Real processes: `rlightning run` with 2 trainer ranks and 2 evaluators; once the trainer has trained (every port
is bound by then), the listening TCP sockets of the launcher's whole process tree are read from /proc.
"""

from __future__ import annotations

import ipaddress
import os
import signal
from pathlib import Path

import pytest

from rlightning.runtime.rundir import RunDir, read_jsonl

from tests._polling import wait_for

pytestmark = pytest.mark.slow
LISTEN = "0A"
"""The state column of a listening socket in /proc/net/tcp."""


def _tree(pid: int) -> list[int]:
    """`pid` and every process below it (Linux /proc)."""
    pids, todo = [], [pid]
    while todo:
        current = todo.pop()
        pids.append(current)
        for task in Path(f"/proc/{current}/task").glob("*"):
            try:
                todo += [int(child) for child in (task / "children").read_text().split()]
            except OSError:  # the process or thread is gone
                continue
    return sorted(set(pids))


def _socket_inodes(pids: list[int]) -> set[str]:
    inodes = set()
    for pid in pids:
        try:
            fds = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(fd)
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[len("socket:[") : -1])
    return inodes


def _address(hex_address: str) -> tuple[str, int]:
    """`0100007F:6989` (/proc/net/tcp, little-endian words) -> ("127.0.0.1", 27017)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    packed = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(packed)), int(port, 16)


def listening(pids: list[int]) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the processes listen on."""
    inodes = _socket_inodes(pids)
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in inodes:
                found.add(_address(fields[1]))
    return found


def test_every_port_of_a_local_run_binds_loopback(tmp_path: Path, write_manifest, run_helpers) -> None:
    tiny_manifest, start_run, finish = run_helpers
    manifest = tiny_manifest("ports", total_env_steps=10**6)
    run = RunDir(tmp_path / "run")
    proc = start_run(write_manifest(manifest), run.root)
    try:
        wait_for("a trained iteration", lambda: proc.poll() is not None or read_jsonl(run.metrics_path), 240)
        assert proc.poll() is None, "the run ended early"
        sockets = listening(_tree(proc.pid))
    finally:
        proc.send_signal(signal.SIGINT)
        finish(proc)
    ports = manifest["spec"]["ports"]
    expected = {ports["torchrun"], ports["weightSync"], ports["trajectories"], ports["trajectories"] + 1}
    assert expected <= {port for _, port in sockets}, sockets
    assert {host for host, _ in sockets} == {"127.0.0.1"}, f"listening beyond loopback: {sorted(sockets)}"
