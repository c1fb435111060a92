"""Building is cached, and every process the harness starts is gone after it stops (also via `up`/`down`)."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import textwrap

import pytest

import devcluster
from devcluster import _build
from devcluster import _cluster
from devcluster import _ports
from devcluster import _process
from tests._polling import wait_for

REPO = pathlib.Path(__file__).resolve().parents[2]
SPARE_SLOT = (_ports.slot_from_env() + 5) % (_ports.MAX_SLOT + 1)
"""Port block for the extra clusters started here: never the session cluster's ($RLIGHTNING_DEVCLUSTER_SLOT), nor
another xdist worker's while at most 5 run (workers take consecutive slots)."""


def _counting_go(tmp_path: pathlib.Path) -> tuple[pathlib.Path, pathlib.Path]:
    """A `go` that records each invocation and then runs the real one (GOROOT/VERSION copied beside it)."""
    real = pathlib.Path(os.path.realpath(shutil.which("go") or "/usr/local/go/bin/go"))
    root = tmp_path / "goroot"
    (root / "bin").mkdir(parents=True)
    shutil.copyfile(real.parent.parent / "VERSION", root / "VERSION")
    calls = tmp_path / "go-calls.txt"
    wrapper = root / "bin" / "go"
    wrapper.write_text(f'#!/bin/sh\necho "$@" >> {calls}\nexec {real} "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, calls


@pytest.mark.cluster
def test_second_build_is_a_cache_hit_without_go(tmp_path, monkeypatch):
    first = devcluster.build()  # cold here only when nothing built yet; warm in CI after `make cluster-binaries`
    wrapper, calls = _counting_go(tmp_path)
    monkeypatch.setenv("GO", str(wrapper))
    second = devcluster.build()
    assert second.cache_hit and second.go_invocations == 0
    assert second.bin_dir == first.bin_dir
    cli = subprocess.run(
        [sys.executable, "-m", "devcluster", "build"], capture_output=True, text=True, timeout=120, cwd=REPO,
        env={**os.environ, "GO": str(wrapper)},
    )
    assert cli.returncode == 0, cli.stderr
    assert cli.stdout.startswith("cache hit:"), cli.stdout
    assert not calls.exists(), calls.read_text()
    kubernetes = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
    for name in (*kubernetes, "etcd", "kwok", "helm", "coredns"):
        assert os.access(second.bin_dir / name, os.X_OK), name


@pytest.mark.cluster
def test_taken_port_is_reported_by_name(tmp_path):
    ports = _ports.for_slot(SPARE_SLOT)
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # the port may be in TIME_WAIT from a test above
        holder.bind((_ports.HOST, ports.apiserver))
        holder.listen()
        cluster = devcluster.Cluster(tmp_path, devcluster.build(), ports)
        with pytest.raises(devcluster.PortInUseError, match=rf"{ports.apiserver} \(apiserver\)"):
            cluster.start()
    assert cluster.processes == []


@pytest.mark.cluster
def test_stop_leaves_no_process(tmp_path):
    cluster = devcluster.launch(workdir=tmp_path / "c", slot=SPARE_SLOT)
    try:
        pids = [proc.pid for proc in cluster.processes]
        assert [proc.name for proc in cluster.processes] == list(_cluster.COMPONENTS)
        assert all(_process.alive(pid) for pid in pids)
    finally:
        cluster.stop()
    assert not [pid for pid in pids if _process.alive(pid)]
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.killpg(pid, 0)


@pytest.mark.cluster
def test_up_and_down_commands(tmp_path):
    env = {**os.environ, "RLIGHTNING_DEVCLUSTER_CACHE": str(_build.cache_root())}

    def run(command: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "devcluster", command, "--slot", str(SPARE_SLOT)],
            capture_output=True, text=True, timeout=300, cwd=REPO, env=env,
        )

    up = run("up")
    try:
        assert up.returncode == 0, up.stderr
        kubeconfig = up.stdout.strip().removeprefix("export KUBECONFIG=")
        assert pathlib.Path(kubeconfig).is_file()
        state = _cluster.read_state(_cluster.run_dir(SPARE_SLOT))
        assert state is not None and all(state["alive"].values())
        nodes = subprocess.run(
            [state["bin_dir"] + "/kubectl", f"--kubeconfig={kubeconfig}", "get", "nodes", "-o", "json"],
            capture_output=True, text=True, timeout=60,
        )
        assert len(json.loads(nodes.stdout)["items"]) == 4
        assert run("status").returncode == 0
    finally:
        down = run("down")
    assert down.returncode == 0, down.stderr
    assert not [pid for pid in state["pids"].values() if _process.alive(pid)]
    assert run("status").returncode == 1


def test_processes_die_with_a_killed_launcher(tmp_path):
    """A non-detached child is killed when its launcher is SIGKILLed (no cleanup code runs)."""
    script = textwrap.dedent(
        f"""
        import pathlib, sys, time
        from devcluster import _process
        log = pathlib.Path({str(tmp_path / 'sleep.log')!r})
        proc = _process.start("sleeper", ["/bin/sleep", "300"], log, detach=False)
        print(proc.pid, flush=True)
        time.sleep(300)
        """
    )
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, cwd=REPO)
    try:
        child = int(launcher.stdout.readline())
        assert _process.alive(child)
    finally:
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=30)
    wait_for(f"child {child} of the killed launcher to die", lambda: not _process.alive(child), timeout=10,
             interval=0.05)


def test_sweep_frees_data_of_dead_clusters_only(tmp_path):
    dead_pid = _spawn_and_reap()
    live_pid = os.getpid()
    for name, pid in (("dead", dead_pid), ("live", live_pid)):
        workdir = tmp_path / f"{_cluster.TEMP_PREFIX}{name}"
        (workdir / "etcd-data").mkdir(parents=True)
        (workdir / "logs").mkdir()
        (workdir / _cluster.STATE_FILE).write_text(json.dumps({"pids": {"etcd": pid}}))
    _cluster.sweep_stale(tmp_path, log=lambda _message: None)
    dead, live = tmp_path / f"{_cluster.TEMP_PREFIX}dead", tmp_path / f"{_cluster.TEMP_PREFIX}live"
    assert not (dead / "etcd-data").exists() and not (dead / _cluster.STATE_FILE).exists()
    assert (dead / "logs").is_dir()
    assert (live / "etcd-data").is_dir() and (live / _cluster.STATE_FILE).is_file()


def _spawn_and_reap() -> int:
    """Return the pid of a process that has exited and been reaped."""
    proc = subprocess.Popen(["/bin/true"])
    proc.wait(timeout=30)
    return proc.pid
