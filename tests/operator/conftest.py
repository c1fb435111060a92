"""Fixtures of the operator's integration tests: the CRD installed once, an operator process per test."""

from __future__ import annotations

import pytest

from operator_cluster import OperatorProcess, install_crd


@pytest.fixture(scope="session")
def crd(cluster):
    """The PolicyGroup CRD from crds/, installed and established."""
    install_crd(cluster)
    return cluster


@pytest.fixture
def operator(crd, namespace, tmp_path):
    """`rlightning-operator` serving the test's namespace; its log is printed when the test fails."""
    process = OperatorProcess(crd, namespace, tmp_path / "operator.log").start()
    yield process
    code = process.stop()
    print(f"--- operator log (exit {code}) ---\n{process.log()[-20000:]}")
