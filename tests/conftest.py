"""Fixtures shared by every test folder: the real control plane from ``devcluster`` and a namespace per test.

``cluster`` (session): a started :class:`devcluster.Cluster` (etcd, kube-apiserver with RBAC, controller-manager,
scheduler, kwok with 4 fake nodes) on the port block of ``RLIGHTNING_DEVCLUSTER_SLOT`` (default 0), stopped at
the end of the session. The binaries are built on first use (``make cluster-binaries`` builds them ahead; a cold
build takes far longer than one test's timeout). ``namespace`` (function): a fresh namespace with its default
ServiceAccount, deleted after the test. Tests that use either are marked ``cluster`` (added automatically when
missing). When such a test fails, the tail of each control-plane log is added to its report.

``real_node`` (session): one real kubelet node (containerd, runc, bridge CNI, CoreDNS; root needed) joined to
``cluster`` on first use and stopped, with every host change undone, at the end of the session. Pods reach it with
the nodeSelector ``{devcluster.NODE_LABEL: "true"}`` and the image ``devcluster.IMAGE``. ``real_namespace``
(function): a ``namespace`` for such pods. Tests that use either are marked ``realpods`` (and ``cluster``).

Parallel runs (pytest-xdist, ``-n N``): worker ``gwK`` takes the devcluster slot ``base + K`` (base: the
session's ``RLIGHTNING_DEVCLUSTER_SLOT``, default 0), so each worker that runs cluster tests starts a control plane
of its own on its own ports, and tests/_ports.py moves the tests' own ports with the slot.

``crd`` (session): ``cluster`` with the PolicyGroup CRD from crds/ installed and established. ``operator``
(function): an ``rlightning-operator`` process serving the test's namespace; its log is printed after the test
(shown when it fails).
"""

from __future__ import annotations

import os
import pathlib
import uuid

import pytest

import devcluster
from devcluster import _ports as devcluster_ports
from rlightning import launch
from tests._polling import wait_for
from tests.operator.operator_cluster import OperatorProcess, install_crd

# As `rlightning run` gives its children: a lost DNS reply to c10d's reverse lookups costs 1 s, not 5 (the 8-receiver
# tests' first publish, bounded by a 5 s timeout, failed on one). Inherited by every process the tests start.
os.environ.setdefault(launch.RESOLVER_ENV, launch.LOCAL_RESOLVER_OPTIONS)

NAMESPACE_READY_SECONDS = 30.0
"""Bound for a new namespace's ``default`` ServiceAccount to appear."""
REAL_NAMESPACE_GONE_SECONDS = 100.0
"""Bound on waiting for a real-node test's namespace to be deleted (its pods' grace periods included); below
devcluster's kubectl timeout."""


@pytest.fixture(scope="session")
def cluster():
    """A running dev cluster for the whole session (see the module docstring)."""
    started = devcluster.launch()
    try:
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def real_node(cluster):
    """A Ready real node on the session's cluster (see the module docstring)."""
    node = devcluster.RealNode(cluster).start()
    try:
        yield node
    finally:
        node.stop()


@pytest.fixture
def real_namespace(real_node, namespace, cluster):
    """A fresh namespace (as ``namespace``) for pods on the real node; deleted after, waiting (bounded) until its
    pods are gone: real pods hold the real node's CPU until they exit, and the next test must find it free."""
    yield namespace
    cluster.kubectl(
        "delete", "namespace", namespace, "--wait=true", f"--timeout={REAL_NAMESPACE_GONE_SECONDS:.0f}s", check=False
    )


@pytest.fixture
def namespace(cluster):
    """A new namespace (``t-<8 hex>``) whose default ServiceAccount exists; deleted (without waiting) after."""
    name = f"t-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    wait_for(f"namespace {name}'s default ServiceAccount",
             lambda: cluster.kubectl("get", "serviceaccount", "default", "-n", name, check=False).returncode == 0,
             timeout=NAMESPACE_READY_SECONDS, interval=0.2)
    yield name
    cluster.kubectl("delete", "namespace", name, "--wait=false", check=False)


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


def same_named_test_files(root: pathlib.Path) -> dict[str, list[str]]:
    """Test modules under `root` whose file names repeat across folders: basename -> their paths.

    The test folders are not packages, so pytest imports each test module by its basename (rootdir-relative
    imports, `rootdir/conftest`); a second folder's module of the same name fails to collect ("import file
    mismatch"), and only in a run that collects both.
    """
    seen: dict[str, list[str]] = {}
    for path in sorted(root.glob("*/test_*.py")):
        seen.setdefault(path.name, []).append(str(path.relative_to(root.parent)))
    return {name: paths for name, paths in seen.items() if len(paths) > 1}


def pytest_configure(config):
    """Refuse test modules of the same name; give each pytest-xdist worker a devcluster slot of its own (see the
    module docstring)."""
    worker = getattr(config, "workerinput", {}).get("workerid")
    if worker is None:
        if clashes := same_named_test_files(pathlib.Path(__file__).parent):
            raise pytest.UsageError("test modules share a file name, so only one of each can be imported: " +
                                    "; ".join(" and ".join(paths) for paths in clashes.values()) + ": rename one")
        return
    slot = devcluster_ports.slot_from_env() + int(worker.removeprefix("gw"))
    if slot > devcluster_ports.MAX_SLOT:
        raise pytest.UsageError(
            f"xdist worker {worker} would take devcluster slot {slot} (at most {devcluster_ports.MAX_SLOT}): "
            "run fewer workers or start from a lower RLIGHTNING_DEVCLUSTER_SLOT"
        )
    os.environ["RLIGHTNING_DEVCLUSTER_SLOT"] = str(slot)


SHARED_WORKER_GROUPS = ("realpods", "autoscaling")
"""Markers whose tests share one xdist worker (``--dist loadgroup``): the real node owns the host's bridge and
containerd, so one at a time; the autoscalers are session fixtures that are costly to start on every worker."""


@pytest.hookimpl(tryfirst=True)  # before xdist reads the xdist_group marks
def pytest_collection_modifyitems(items):
    """Mark tests using ``cluster`` (directly or through a fixture) ``cluster``, and ``real_node`` ``realpods``;
    put each shared-worker group on one xdist worker; record each test's tier for ``make test``'s report."""
    for item in items:
        names = getattr(item, "fixturenames", ())
        if "cluster" in names and item.get_closest_marker("cluster") is None:
            item.add_marker(pytest.mark.cluster)
        if "real_node" in names and item.get_closest_marker("realpods") is None:
            item.add_marker(pytest.mark.realpods)
        group = next((name for name in SHARED_WORKER_GROUPS if item.get_closest_marker(name)), None)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        item.user_properties.append(("tier", _tier(item)))


def _tier(item) -> str:
    """The tier ``make test`` reports a test under: its most specific marker (tools/test_phases.py)."""
    for marker in ("realpods", "autoscaling", "cluster", "slow"):
        if item.get_closest_marker(marker) is not None:
            return marker
    return "unit"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Append the control-plane log tails to the report of a failed test that used the cluster."""
    outcome = yield
    report = outcome.get_result()
    started = getattr(item, "funcargs", {}).get("cluster")
    if report.failed and isinstance(started, devcluster.Cluster):
        report.sections.append(("control-plane logs", started.log_tails(30)))
    node = getattr(item, "funcargs", {}).get("real_node")
    if report.failed and isinstance(node, devcluster.RealNode):
        report.sections.append(("real node logs", node.log_tails(30)))
