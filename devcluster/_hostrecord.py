"""The host-wide record of the real node on this host, and whether the run that owns it still lives.

The node's bridge, NAT rule and cgroups are host-wide, so one host holds one node. Its record (a JSON file in
:data:`HOST_RECORD`) names the process that started it, its work folder and component processes (pid and start
time, so a reused pid is not taken for them) and what the host held before it started; a later start reads it to
tell a live node of another run (refused) from what a killed run left behind (removed). ``/run`` is a tmpfs, so a
reboot, which ends every node, also forgets the record.
"""

from __future__ import annotations

import json
import os
import pathlib

HOST_RECORD = pathlib.Path("/run/rlightning-devcluster/realnode.json")
"""Where the record of the node on this host lives while the node exists."""


def start_time(pid: int) -> int | None:
    """Return when a process started (clock ticks since boot, ``/proc/<pid>/stat`` field 22), None when it is gone.

    A zombie counts as gone. Source: proc(5).

    Args:
        pid (int): Process id.

    Returns:
        int | None: The start time; None when no such process runs.
    """
    try:
        fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return None if fields[0] == "Z" else int(fields[19])


def process_id(pid: int) -> list[int]:
    """Return ``[pid, start time]`` of a running process, as the record keeps it (start time 0 when gone)."""
    return [pid, start_time(pid) or 0]


def runs(entry: list[int]) -> bool:
    """Return True when the process a record entry (``[pid, start time]``) names still runs (same start time)."""
    pid, started = entry
    return started != 0 and start_time(pid) == started


def live(record: dict) -> list[str]:
    """Return the processes that make a recorded node live; empty when it is what a dead run left.

    A node lives while its owner runs (a test session, a starting ``devcluster up``) and a component does or none
    is started yet, or while a component of a node that outlives its owner (``devcluster up``, ``detached``) runs.

    Args:
        record (dict): A record as :func:`read` returns it (keys ``owner``, ``detached``, ``components``).

    Returns:
        list[str]: ``"<name> (pid N)"`` of the live owner and components.
    """
    components = record.get("components", {})
    running = [f"{name} (pid {entry[0]})" for name, entry in components.items() if runs(entry)]
    owner = [f"owner (pid {record['owner'][0]})"] if runs(record["owner"]) else []
    if (owner or (record.get("detached") and running)) and (running or not components):
        return owner + running
    return []


def write(record: dict, path: pathlib.Path = HOST_RECORD) -> None:
    """Write the record (its folder is created), replacing the file in one rename so a reader never sees half."""
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(f".{os.getpid()}.partial")
    partial.write_text(json.dumps(record, indent=2))
    partial.replace(path)


def read(path: pathlib.Path = HOST_RECORD) -> dict | None:
    """Return the record, or None when there is none (or it is unreadable: a write never completed)."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def remove(workdir: pathlib.Path, path: pathlib.Path = HOST_RECORD) -> None:
    """Remove the record if it is the node's of ``workdir`` (a record of another run's node is left alone)."""
    record = read(path)
    if record is not None and record.get("workdir") == str(workdir):
        path.unlink(missing_ok=True)
