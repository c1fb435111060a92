"""A real node's start removes what a killed node left on the host (its processes SIGKILLed, a pod's shim, sandbox,
cgroups, mounts, bridge and NAT rule left behind), says so in one line and starts; while another run's node lives,
a start refuses and names it. The session's node is started again for later tests."""

from __future__ import annotations

import os
import pathlib
import signal

import pytest
import yaml

import devcluster
from devcluster import _hostrecord, _hoststate, _nodeconfig, _realnode
from realpods_helpers import pod_phase, python_pod, wait_for


def test_a_start_beside_a_live_node_refuses_and_names_it(cluster, real_node):
    with pytest.raises(devcluster.RealNodeError) as refused:
        _realnode.RealNode(cluster, log=lambda line: None).start()
    assert f"owner (pid {os.getpid()})" in str(refused.value)
    assert str(cluster.workdir) in str(refused.value)
    assert real_node.ready()


def test_a_killed_nodes_leftovers_are_removed_and_a_new_node_starts(cluster, real_node, real_namespace):
    cluster.kubectl("apply", "-n", real_namespace, "-f", "-",
                    input=yaml.safe_dump(python_pod("sleeper", "import time; time.sleep(600)")))  # fmt: skip
    wait_for("a pod to run", lambda: pod_phase(cluster, real_namespace, "sleeper") == "Running")
    for proc in real_node.processes:  # as a timeout's SIGKILL of the test run does to them
        os.kill(proc.pid, signal.SIGKILL)
    for proc in real_node.processes:
        assert proc.popen is not None
        proc.popen.wait(10)
    socket = str(real_node.layout.containerd_socket)
    shims = [
        pid for pid in _hoststate.processes(("containerd-shim-runc-v2",))
        if socket in pathlib.Path(f"/proc/{pid}/cmdline").read_text()
    ]  # fmt: skip
    assert shims and pathlib.Path(f"/sys/class/net/{_nodeconfig.BRIDGE}").exists()
    assert _hostrecord.read() is not None

    lines: list[str] = []
    fresh = _realnode.RealNode(cluster, log=lines.append)
    try:
        fresh.start()
        removed = [line for line in lines if "left on this host" in line]
        assert len(removed) == 1, lines
        assert "bridge rlnode0" in removed[0] and "containerd shim" in removed[0], removed
        assert fresh.ready()
    finally:
        fresh.stop()
    assert real_node.baseline is not None
    assert _hoststate.difference(real_node.baseline, _hoststate.snapshot()) == []
    real_node.start()
    assert real_node.ready()
