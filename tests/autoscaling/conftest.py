"""Fixtures of the autoscaling tests: the PolicyGroup CRD installed once, an operator process per test, and the
add-ons (metrics-server, Karpenter, KEDA) started once per session on first use, and Kueue once per module.

Every test module here sets ``pytestmark = pytest.mark.autoscaling`` (``cluster`` comes with the fixtures):
``pytest -m autoscaling`` runs them against the devcluster, within 10 minutes in all (bounded waits only).
"""

from __future__ import annotations

import pytest

import devcluster
from tests.operator.operator_cluster import OperatorProcess, install_crd


@pytest.fixture(scope="session")
def autoscaling_crd(cluster):
    """The PolicyGroup CRD from crds/, installed and established."""
    install_crd(cluster)
    return cluster


@pytest.fixture
def autoscaling_operator(autoscaling_crd, namespace, tmp_path):
    """`rlightning-operator` serving the test's namespace; its log is printed when the test fails."""
    process = OperatorProcess(autoscaling_crd, namespace, tmp_path / "operator.log").start()
    yield process
    code = process.stop()
    print(f"--- operator log (exit {code}) ---\n{process.log()[-20000:]}")


@pytest.fixture(scope="session")
def metrics_server(autoscaling_crd):
    """metrics-server serving the session's cluster (built from its module on first use, then cached)."""
    server = devcluster.MetricsServer(autoscaling_crd).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def karpenter(autoscaling_crd):
    """Karpenter's kwok provider autoscaling the session cluster's fake nodes (built from its module on first use,
    then cached). Its log: `karpenter.log` in the cluster's log folder."""
    node_autoscaler = devcluster.Karpenter(autoscaling_crd).start()
    yield node_autoscaler
    node_autoscaler.stop()


@pytest.fixture(scope="session")
def keda(autoscaling_crd):
    """KEDA's operator and metrics adapter serving the session's cluster (built from its module on first use, then
    cached). Their logs: `keda-operator.log` and `keda-adapter.log` in the cluster's log folder."""
    event_autoscaler = devcluster.Keda(autoscaling_crd).start()
    yield event_autoscaler
    event_autoscaler.stop()


@pytest.fixture(scope="module")
def kueue(autoscaling_crd):
    """Kueue admitting Jobs on the session's cluster (built from its module on first use, then cached), for one
    module only: its webhooks see every Job of the cluster while it runs. Its log: `kueue.log` in the cluster's log
    folder."""
    admission = devcluster.Kueue(autoscaling_crd).start()
    yield admission
    admission.stop()
