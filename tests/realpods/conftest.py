"""Real-node test fixtures: the PolicyGroup CRD, and the operator as a host process serving the test namespace."""

from __future__ import annotations

import pytest

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
