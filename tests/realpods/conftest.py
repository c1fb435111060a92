"""Real-node test fixtures: the PolicyGroup CRD, the operator as a host process serving the test namespace, and a
checkpoint claim on a local volume."""

from __future__ import annotations

import pytest

from realpods_helpers import CLAIM, local_claim
from tests.operator.operator_cluster import OperatorProcess, install_crd


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
    with local_claim(cluster, real_node, real_namespace, CLAIM) as folder:
        yield folder
