"""Fixtures of the autoscaling tests: the add-ons (metrics-server, Karpenter, KEDA) started once per session on
first use, and Kueue once per module (the CRD and the operator: ``crd`` and ``operator`` of tests/conftest.py).

Every test module here sets ``pytestmark = pytest.mark.autoscaling`` (``cluster`` comes with the fixtures):
``pytest -m autoscaling`` runs them against the devcluster, within 10 minutes in all (bounded waits only).
"""

from __future__ import annotations

import pytest

import devcluster


@pytest.fixture(scope="session")
def metrics_server(crd):
    """metrics-server serving the session's cluster (built from its module on first use, then cached)."""
    server = devcluster.MetricsServer(crd).start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def karpenter(crd):
    """Karpenter's kwok provider autoscaling the session cluster's fake nodes (built from its module on first use,
    then cached). Its log: `karpenter.log` in the cluster's log folder."""
    node_autoscaler = devcluster.Karpenter(crd).start()
    yield node_autoscaler
    node_autoscaler.stop()


@pytest.fixture(scope="session")
def keda(crd):
    """KEDA's operator and metrics adapter serving the session's cluster (built from its module on first use, then
    cached). Their logs: `keda-operator.log` and `keda-adapter.log` in the cluster's log folder."""
    event_autoscaler = devcluster.Keda(crd).start()
    yield event_autoscaler
    event_autoscaler.stop()


@pytest.fixture(scope="module")
def kueue(crd):
    """Kueue admitting Jobs on the session's cluster (built from its module on first use, then cached), for one
    module only: its webhooks see every Job of the cluster while it runs. Its log: `kueue.log` in the cluster's log
    folder."""
    admission = devcluster.Kueue(crd).start()
    yield admission
    admission.stop()
