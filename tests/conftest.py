"""Fixtures shared by every test folder: the real control plane from ``devcluster`` and a namespace per test.

``cluster`` (session): a started :class:`devcluster.Cluster` (etcd, kube-apiserver with RBAC, controller-manager,
scheduler, kwok with 4 fake nodes) on the port block of ``RLIGHTNING_DEVCLUSTER_SLOT`` (default 0), stopped at
the end of the session. The binaries are built on first use (``make cluster-binaries`` builds them ahead; a cold
build takes far longer than one test's timeout). ``namespace`` (function): a fresh namespace with its default
ServiceAccount, deleted after the test. Tests that use either are marked ``cluster`` (added automatically when
missing). When such a test fails, the tail of each control-plane log is added to its report.
"""

from __future__ import annotations

import time
import uuid

import pytest

import devcluster

NAMESPACE_READY_SECONDS = 30.0
"""Bound for a new namespace's ``default`` ServiceAccount to appear."""


@pytest.fixture(scope="session")
def cluster():
    """A running dev cluster for the whole session (see the module docstring)."""
    started = devcluster.launch()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture
def namespace(cluster):
    """A new namespace (``t-<8 hex>``) whose default ServiceAccount exists; deleted (without waiting) after."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    deadline = time.monotonic() + NAMESPACE_READY_SECONDS
    while cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode != 0:
        if time.monotonic() > deadline:
            raise devcluster.ClusterError(
                f"namespace {name}: no default ServiceAccount after {NAMESPACE_READY_SECONDS}s"
            )
        time.sleep(0.2)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


def pytest_collection_modifyitems(items):
    """Mark every test that uses the ``cluster`` fixture (directly or through ``namespace``) as ``cluster``."""
    for item in items:
        if "cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("cluster") is None:
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Append the control-plane log tails to the report of a failed test that used the cluster."""
    outcome = yield
    report = outcome.get_result()
    started = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(started, devcluster.Cluster):
        report.sections.append(("control-plane logs", started.log_tails(30)))
