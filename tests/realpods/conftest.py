"""Real-node test fixtures: the PolicyGroup CRD, the operator as a host process serving the test namespace, and a
checkpoint claim on a local volume."""

from __future__ import annotations

import json
import shutil

import pytest

from realpods_helpers import CLAIM, WAIT_SECONDS, local_volume, volume_claim, wait_for
from tests.operator.operator_cluster import OperatorProcess, apply, get_json, install_crd


@pytest.fixture(scope="session")
def real_crd(cluster):
    """The PolicyGroup CRD from crds/, installed and established."""
    install_crd(cluster)
    return cluster


@pytest.fixture
def real_operator(real_crd, real_node, real_namespace, tmp_path):
    """`rlightning-operator` (host process) serving the test's namespace; its log is printed when the test fails."""
    process = OperatorProcess(real_crd, real_namespace, tmp_path / "operator.log").start()
    yield process
    code = process.stop()
    print(f"--- operator log (exit {code}) ---\n{process.log()[-20000:]}")


@pytest.fixture
def checkpoint_claim(cluster, real_node, real_namespace):
    """A Bound claim `CLAIM` on a local volume under the node's folder; yields that folder. Removed after."""
    volume = f"{real_namespace}-checkpoints"
    folder = real_node.layout.root / "volumes" / volume
    folder.mkdir(parents=True)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(local_volume(volume, folder, real_namespace, CLAIM)))
    apply(cluster, real_namespace, volume_claim(CLAIM, volume))
    wait_for(f"claim {CLAIM} to bind to {volume}",
             lambda: get_json(cluster, "pvc", CLAIM, "-n", real_namespace)["status"].get("phase") == "Bound")
    try:
        yield folder
    finally:
        # A completed trainer pod still uses the claim (pvc-protection), and a bound volume is not deleted
        # (pv-protection): the group and its pods go first, then the claim, then the volume.
        timeout = f"--timeout={WAIT_SECONDS:.0f}s"
        cluster.kubectl("delete", "pg", "--all", "-n", real_namespace, timeout, check=False)
        wait_for("the group's pods to be gone", lambda: not get_json(cluster, "pods", "-n", real_namespace)["items"],
                 timeout=180.0)
        cluster.kubectl("delete", "pvc", CLAIM, "-n", real_namespace, timeout, check=False)
        cluster.kubectl("delete", "pv", volume, timeout, check=False)
        shutil.rmtree(folder, ignore_errors=True)
