"""The real node's host-wide record tells a live node of another run from what a dead run left (real processes)."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from devcluster import _hostrecord


@pytest.fixture
def running():
    """`[pid, start time]` of a process that runs until the test ends."""
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        yield _hostrecord.process_id(proc.pid)
    finally:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def ended():
    """`[pid, start time]` of a process that has exited and been reaped."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    entry = _hostrecord.process_id(proc.pid)
    proc.wait(10)
    return entry


def _record(owner, detached=False, **components) -> dict:
    return {"owner": owner, "detached": detached, "workdir": "/w", "components": components}


def test_a_node_whose_owner_and_components_are_gone_is_a_dead_runs(running, ended):
    assert _hostrecord.live(_record(ended, kubelet=ended, containerd=ended)) == []


def test_a_node_whose_components_were_killed_under_a_live_owner_is_a_dead_runs(running, ended):
    assert _hostrecord.live(_record(running, kubelet=ended, containerd=ended)) == []


def test_a_node_that_outlived_its_test_sessions_owner_is_removed_but_one_of_devcluster_up_lives(running, ended):
    assert _hostrecord.live(_record(ended, kubelet=running)) == []
    assert _hostrecord.live(_record(ended, True, kubelet=running)) == [f"kubelet (pid {running[0]})"]
    assert _hostrecord.live(_record(ended, True, kubelet=ended)) == []


def test_a_node_being_started_lives_and_names_its_owner(running):
    assert _hostrecord.live(_record(running)) == [f"owner (pid {running[0]})"]
    assert _hostrecord.live(_record(running, kubelet=running)) == [
        f"owner (pid {running[0]})", f"kubelet (pid {running[0]})"
    ]


def test_a_reused_pid_is_not_taken_for_the_recorded_process(running):
    pid, started = running
    assert _hostrecord.runs([pid, started]) and not _hostrecord.runs([pid, started - 1])
    assert _hostrecord.live(_record([os.getpid(), 1], kubelet=[pid, started + 1])) == []


def test_the_record_is_removed_only_by_its_own_run(tmp_path):
    path = tmp_path / "run" / "realnode.json"
    _hostrecord.write(_record([1, 1]), path)
    assert _hostrecord.read(path) == _record([1, 1])
    _hostrecord.remove(tmp_path / "other", path)
    assert path.exists()
    _hostrecord.remove(pathlib.Path("/w"), path)
    assert not path.exists() and _hostrecord.read(path) is None
