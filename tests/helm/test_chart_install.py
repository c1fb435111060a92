"""The chart on a real control plane: the server accepts it, it installs, and its RBAC is exactly enough.

The operator's Deployment runs on kwok's fake nodes, so its pod never executes. The proof that the chart's
RBAC suffices is to run the same operator here, as a subprocess, with the chart's settings and a token of the
chart's ServiceAccount, and watch it take examples/cartpole.yaml to Running. The same identity is then shown to
be refused what the operator never needs (Secrets first).
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import signal
import subprocess
import sys

from helm_chart import CHART, RELEASE, REPO, by_kind, documents
from rlightning import contract
from tests._polling import wait_for

EXAMPLE = REPO / "examples" / "cartpole.yaml"
GROUP = "cartpole"
WAIT_SECONDS = 90.0
"""Bound for the PolicyGroup to reach Running (children created, kwok running their pods)."""
NAMESPACE_GONE_SECONDS = 60.0
"""Bound for deleting a namespace that still holds PolicyGroups, with no operator running."""
OPERATOR_STOP_SECONDS = 30.0
"""Bound for the operator to exit after SIGTERM (then it is killed)."""

# (verb, resource, extra kubectl args): what the operator does in a namespace it serves.
ALLOWED = [
    ("watch", "policygroups.rlightning.io", ()),
    ("patch", "policygroups.rlightning.io", ()),
    ("patch", "policygroups.rlightning.io", ("--subresource=status",)),
    ("create", "configmaps", ()),
    ("create", "services", ()),
    ("delete", "services", ()),
    ("create", "serviceaccounts", ()),
    ("create", "roles.rbac.authorization.k8s.io", ()),
    ("create", "rolebindings.rbac.authorization.k8s.io", ()),
    ("delete", "jobs.batch", ()),
    ("patch", "statefulsets.apps", ()),
    ("create", "events", ()),
    ("watch", "pods", ()),
    ("delete", "pods", ()),  # force-deletes a pod stranded on a node that stopped answering
    ("watch", "nodes", ()),  # the trainers' nodes, for a disruption notice (cluster-scoped: a ClusterRole)
    ("create", "leases.coordination.k8s.io", ()),
    ("update", f"leases.coordination.k8s.io/{RELEASE}-rlightning-operator", ()),
]
# What it never does, in its namespace unless the args say otherwise.
DENIED = [
    ("get", "secrets", ()),
    ("list", "secrets", ()),
    ("list", "secrets", ("--all-namespaces",)),
    ("create", "pods", ()),
    ("create", "pods", ("--subresource=exec",)),
    ("patch", "pods", ("--subresource=status",)),
    ("create", "deployments.apps", ()),
    ("delete", "statefulsets.apps", ()),
    ("list", "configmaps", ()),
    ("delete", "policygroups.rlightning.io", ()),
    ("update", "policygroups.rlightning.io", ()),
    ("escalate", "roles.rbac.authorization.k8s.io", ()),
    ("bind", "roles.rbac.authorization.k8s.io", ()),
    ("impersonate", "serviceaccounts", ()),
    ("patch", "nodes", ()),
    ("list", "namespaces", ()),
    ("list", "customresourcedefinitions.apiextensions.k8s.io", ()),
    ("create", "clusterroles.rbac.authorization.k8s.io", ()),
    ("list", "leases.coordination.k8s.io", ()),
    ("update", "leases.coordination.k8s.io/someone-elses", ()),
]


def _can_i(cluster, kubeconfig: pathlib.Path, namespace: str, verb: str, resource: str, *args: str) -> bool:
    """`kubectl auth can-i` as the identity of `kubeconfig` (a SelfSubjectAccessReview)."""
    proc = subprocess.run(
        [str(cluster.bin("kubectl")), f"--kubeconfig={kubeconfig}", "auth", "can-i", verb, resource,
         "-n", namespace, *args],
        capture_output=True, text=True, timeout=30,
    )
    assert proc.stdout.strip() in ("yes", "no"), proc.stderr
    return proc.stdout.strip() == "yes"


def _operator_account(helm, namespace: str) -> tuple[str, dict]:
    """The ServiceAccount and the container of the installed operator Deployment."""
    (deployment,) = by_kind(documents(helm("get", "manifest", RELEASE, "-n", namespace).stdout), "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    return pod["serviceAccountName"], container


@contextlib.contextmanager
def _operator(container: dict, kubeconfig: pathlib.Path, log: pathlib.Path):
    """Run rlightning-operator here with the chart's environment, as the identity of `kubeconfig`.

    The health and metrics endpoints are off: the subprocess shares this machine's ports with other tests.
    """
    chart_env = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    env = {key: value for key, value in os.environ.items() if key != "KUBECONFIG"} | chart_env
    argv = [str(pathlib.Path(sys.executable).parent / "rlightning-operator"), "--kubeconfig", str(kubeconfig),
            "--health-port", "0", "--metrics-port", "0"]
    with log.open("w") as sink:
        process = subprocess.Popen(argv, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        yield process
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=OPERATOR_STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=OPERATOR_STOP_SECONDS)


def _refused(log: pathlib.Path) -> list[str]:
    """Lines of the operator's log where the API server refused it something (kopf's scanning is off, so none)."""
    return [line for line in log.read_text().splitlines() if "forbidden" in line.lower() or " 403" in line]


def _get_json(cluster, *args: str) -> dict | None:
    proc = cluster.kubectl("get", *args, "-o", "json", check=False)
    return json.loads(proc.stdout) if proc.returncode == 0 else None


def test_server_accepts_the_rendered_chart(helm, cluster, namespace):
    for args in ((), ("--set", f"watchNamespaces={{{namespace}}}")):
        stream = helm.template("--include-crds", *args, namespace=namespace)
        cluster.kubectl("apply", "--dry-run=server", "-f", "-", input=stream)


def test_operator_reconciles_with_exactly_the_charts_rbac(helm, cluster, namespace, tmp_path):
    helm("install", RELEASE, str(CHART), "-n", namespace, "--create-namespace",
         "--set", f"watchNamespaces={{{namespace}}}", "--wait", "--timeout", "120s")
    account, container = _operator_account(helm, namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, account)
    log = tmp_path / "operator.log"

    with _operator(container, kubeconfig, log) as process:
        cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))

        def running():
            assert process.poll() is None, f"the operator exited {process.returncode}:\n{log.read_text()}"
            assert not _refused(log), "\n".join(_refused(log))
            group = _get_json(cluster, "policygroup", GROUP, "-n", namespace)
            return group if group and group.get("status", {}).get("phase") == "Running" else None

        group = wait_for("PolicyGroup cartpole to be Running", running, WAIT_SECONDS, explain=log.read_text)
        assert not group["metadata"].get("finalizers"), "PolicyGroups must not need the operator to be deleted"

        children = {
            ("ConfigMap", contract.config_name(GROUP)),
            ("ServiceAccount", contract.service_account_name(GROUP)),
            ("Role", contract.service_account_name(GROUP)),
            ("RoleBinding", contract.service_account_name(GROUP)),
            ("NetworkPolicy", contract.train_name(GROUP)),  # networkPolicy.enabled: the chart's default
            ("Service", contract.train_name(GROUP)),
            ("Job", contract.train_name(GROUP)),
            ("Service", contract.eval_name(GROUP)),
            ("StatefulSet", contract.eval_name(GROUP)),
        }
        for kind, name in sorted(children):
            child = _get_json(cluster, kind.lower(), name, "-n", namespace)
            assert child is not None, f"{kind} {name} was not created"
            (owner,) = child["metadata"]["ownerReferences"]
            assert (owner["kind"], owner["name"]) == (contract.KIND, GROUP)
        events = _get_json(cluster, "events", "-n", namespace, "--field-selector",
                           f"involvedObject.kind={contract.KIND},involvedObject.name={GROUP}")
        assert events["items"], "the operator posted no Event"
        lease = _get_json(cluster, "lease", f"{RELEASE}-rlightning-operator", "-n", namespace)
        assert lease is not None and lease["spec"]["holderIdentity"], "the operator acted without the Lease"

    assert process.returncode == 0, log.read_text()
    assert not _refused(log), "\n".join(_refused(log))

    for verb, resource, args in ALLOWED:
        assert _can_i(cluster, kubeconfig, namespace, verb, resource, *args), f"{verb} {resource} {args} denied"
    for verb, resource, args in DENIED:
        assert not _can_i(cluster, kubeconfig, namespace, verb, resource, *args), f"{verb} {resource} {args} allowed"
    # A namespace the release does not serve: nothing at all.
    assert not _can_i(cluster, kubeconfig, "default", "list", "policygroups.rlightning.io")
    assert not _can_i(cluster, kubeconfig, "default", "create", "jobs.batch")

    # With the operator gone and the chart uninstalled, PolicyGroups and their children do not hold the
    # namespace up: no finalizer waits for a controller that no longer runs.
    helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "60s")
    assert _get_json(cluster, "policygroup", GROUP, "-n", namespace) is not None
    cluster.kubectl("delete", "namespace", namespace, "--wait=false")

    def namespace_gone():
        return cluster.kubectl("get", "namespace", namespace, check=False).returncode != 0

    wait_for(f"namespace {namespace} to be deleted", namespace_gone, NAMESPACE_GONE_SECONDS,
             explain=lambda: cluster.kubectl("get", "all,policygroups", "-n", namespace, check=False).stdout)


def test_all_namespaces_release_grants_cluster_wide_without_secrets(helm, cluster, namespace):
    helm("install", RELEASE, str(CHART), "-n", namespace, "--wait", "--timeout", "120s")
    account, _ = _operator_account(helm, namespace)
    kubeconfig = cluster.service_account_kubeconfig(namespace, account)
    try:
        for where in (namespace, "default"):
            assert _can_i(cluster, kubeconfig, where, "watch", "policygroups.rlightning.io")
            assert _can_i(cluster, kubeconfig, where, "create", "jobs.batch")
        assert _can_i(cluster, kubeconfig, namespace, "list", "statefulsets.apps", "--all-namespaces")
        for verb, resource, args in DENIED:
            assert not _can_i(cluster, kubeconfig, "default", verb, resource, *args), f"{verb} {resource} {args}"
    finally:
        helm("uninstall", RELEASE, "-n", namespace, "--wait", "--timeout", "60s")
    cluster_roles = _get_json(cluster, "clusterroles", "-l", f"app.kubernetes.io/instance={RELEASE}")
    assert not [r for r in cluster_roles["items"] if r["metadata"]["name"].endswith(f"-{namespace}")]
