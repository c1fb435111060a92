"""Stopping the real node leaves the host as it was before it started (bridge, NAT rule, sysctls, cgroups, mounts,
default paths, processes), even with pods running; then the session's node is started again for later tests."""

from __future__ import annotations

import yaml

from realpods_helpers import pod_phase, python_pod, wait_for


def test_stop_leaves_no_host_state_and_the_node_starts_again(cluster, real_node, real_namespace):
    code = "import time; time.sleep(600)"
    cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=yaml.safe_dump(python_pod("sleeper", code)))
    wait_for("a pod to run", lambda: pod_phase(cluster, real_namespace, "sleeper") == "Running")

    real_node.stop()
    assert real_node.leftovers == []

    real_node.start()
    assert real_node.ready()
