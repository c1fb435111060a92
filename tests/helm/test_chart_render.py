"""The chart renders what the operator needs and nothing more: lint, schema, hardening, settings, RBAC scope."""

from __future__ import annotations

import re

import pytest

import devcluster
from rlightning import contract
from rlightning_operator import OperatorSettings
from helm_chart import CHART, REPO, by_kind, documents

pytestmark = pytest.mark.cluster  # helm comes from the devcluster build

NAMESPACED = ("--set", "watchNamespaces={team-a,team-b}")
MONITORING = tuple(f"--set=monitoring.{switch}.enabled=true"
                   for switch in ("operator.podMonitor", "policyGroups.podMonitor", "grafanaDashboard"))
MODES = {"all-namespaces": (), "namespaced": NAMESPACED, "monitoring": MONITORING,
         "namespaced monitoring": (*NAMESPACED, *MONITORING)}


def _container(docs: list[dict]) -> dict:
    (deployment,) = by_kind(docs, "Deployment")
    (container,) = deployment["spec"]["template"]["spec"]["containers"]
    return container


@pytest.mark.parametrize("args", MODES.values(), ids=MODES.keys())
def test_lint_strict(offline_helm, args):
    offline_helm("lint", "--strict", "--kube-version", devcluster.KUBERNETES, str(CHART), *args)


@pytest.mark.parametrize(
    ("args", "complaint"),
    [
        (("--set", "replicas=0"), "replicas"),
        (("--set", "watchNamespace=team-a"), "watchNamespace"),
        (("--set", "logFormat=xml"), "logFormat"),
        (("--set", "watchNamespaces={Team_A}"), "watchNamespaces"),
        (("--set", "monitoring.policyGroups.podMonitor.interval=often"), "interval"),
        (("--set", "monitoring.grafanaDashboard.label="), "label"),
        (("--set", "networkPolicy.metricsNamespace=Monitoring"), "metricsNamespace"),
    ],
)
def test_schema_refuses_bad_values(offline_helm, args, complaint):
    proc = offline_helm("template", "x", str(CHART), *args, check=False)
    assert proc.returncode != 0
    assert complaint in proc.stderr


def test_deployment_is_hardened(offline_helm):
    docs = documents(offline_helm.template())
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    container = _container(docs)
    assert deployment["spec"]["replicas"] == 1
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    security = container["securityContext"]
    assert security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"]}
    assert security["seccompProfile"] == {"type": "RuntimeDefault"}
    # The only writable path is an emptyDir on /tmp.
    (mount,) = container["volumeMounts"]
    assert mount["mountPath"] == "/tmp"
    assert {v["name"]: v for v in pod["volumes"]}[mount["name"]]["emptyDir"]
    assert container["resources"]["requests"] and container["resources"]["limits"]["memory"]


def test_chart_user_is_the_image_user(offline_helm):
    dockerfile = (REPO / "operator" / "Dockerfile").read_text()
    uid = int(re.search(r"useradd --uid (\d+)", dockerfile).group(1))
    gid = int(re.search(r"groupadd --gid (\d+)", dockerfile).group(1))
    assert re.search(rf"^USER {uid}:{gid}$", dockerfile, re.MULTILINE)
    (deployment,) = by_kind(documents(offline_helm.template()), "Deployment")
    pod_security = deployment["spec"]["template"]["spec"]["securityContext"]
    assert (pod_security["runAsUser"], pod_security["runAsGroup"]) == (uid, gid)


def test_probes_hit_the_liveness_endpoint(offline_helm):
    container = _container(documents(offline_helm.template()))
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": contract.OPERATOR_HEALTH_PORT, "metrics": contract.OPERATOR_METRICS_PORT}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}


def _settings(container: dict) -> OperatorSettings:
    environ = {item["name"]: item["value"] for item in container["env"] if "value" in item}
    unknown = {
        name for name in environ
        if name.startswith("RLIGHTNING_OPERATOR_")
        and name.removeprefix("RLIGHTNING_OPERATOR_").lower() not in OperatorSettings.model_fields
    }
    assert not unknown, f"the chart sets variables the operator does not read: {unknown}"
    return OperatorSettings.from_env(environ)


def test_env_configures_the_operator(offline_helm):
    settings = _settings(_container(documents(offline_helm.template("--set", "logLevel=debug,logFormat=json"))))
    assert settings.all_namespaces and settings.served_namespaces == []
    assert (settings.log_level, settings.log_format) == ("DEBUG", "json")
    assert settings.health_port == contract.OPERATOR_HEALTH_PORT
    assert settings.metrics_port == contract.OPERATOR_METRICS_PORT

    settings = _settings(_container(documents(offline_helm.template(*NAMESPACED))))
    assert not settings.all_namespaces and settings.served_namespaces == ["team-a", "team-b"]


@pytest.mark.parametrize("replicas", [1, 3])
def test_replicas_elect_a_leader_on_a_lease_they_alone_may_update(offline_helm, replicas):
    docs = documents(offline_helm.template("--set", f"replicas={replicas}"))
    (deployment,) = by_kind(docs, "Deployment")
    assert deployment["spec"]["replicas"] == replicas
    # A new pod waits as a standby until the old one releases the Lease: never none acting, never two.
    assert deployment["spec"]["strategy"] == {
        "type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}}
    settings = _settings(_container(docs))
    assert settings.leader_election and settings.lease_namespace == "rlightning-system"
    lease_role = next(r for r in by_kind(docs, "Role") if r["metadata"]["name"].endswith("-leader-election"))
    assert lease_role["metadata"]["namespace"] == "rlightning-system"
    assert lease_role["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": [settings.lease_name],
         "verbs": ["get", "update"]},
    ]
    (binding,) = [b for b in by_kind(docs, "RoleBinding") if b["roleRef"]["name"] == lease_role["metadata"]["name"]]
    (account,) = by_kind(docs, "ServiceAccount")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]


def test_metrics_off_removes_port_and_service(offline_helm):
    docs = documents(offline_helm.template("--set", "metrics.enabled=false"))
    container = _container(docs)
    assert [port["name"] for port in container["ports"]] == ["health"]
    assert _settings(container).metrics_port == 0
    assert not by_kind(docs, "Service")

    (service,) = by_kind(documents(offline_helm.template()), "Service")
    (port,) = service["spec"]["ports"]
    assert port["targetPort"] == "metrics"
    (deployment,) = by_kind(documents(offline_helm.template()), "Deployment")
    assert service["spec"]["selector"].items() <= deployment["spec"]["template"]["metadata"]["labels"].items()


def _serving(docs: list[dict], kind: str) -> list[dict]:
    """The (Cluster)Roles or their bindings that grant the served namespaces' rules (not the leader election's, nor
    the nodes' ClusterRole)."""
    return [doc for doc in by_kind(docs, kind) if not doc["metadata"]["name"].endswith(("-leader-election", "-nodes"))]


def _nodes_role(docs: list[dict], kind: str) -> list[dict]:
    """The ClusterRole (or its binding) that lets the operator read nodes, in either mode."""
    return [doc for doc in by_kind(docs, kind) if doc["metadata"]["name"].endswith("-nodes")]


def test_all_namespaces_uses_a_cluster_role(offline_helm):
    docs = documents(offline_helm.template())
    assert not _serving(docs, "Role") and not _serving(docs, "RoleBinding")
    (role,) = _serving(docs, "ClusterRole")
    (binding,) = _serving(docs, "ClusterRoleBinding")
    (account,) = by_kind(docs, "ServiceAccount")
    assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                                  "name": role["metadata"]["name"]}
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": account["metadata"]["name"],
                                    "namespace": "rlightning-system"}]
    # Cluster-scoped names carry the release namespace: two releases in two namespaces do not collide.
    assert role["metadata"]["name"].endswith("-rlightning-system")


def test_watch_namespaces_use_a_role_in_each(offline_helm):
    docs = documents(offline_helm.template(*NAMESPACED))
    assert not _serving(docs, "ClusterRole") and not _serving(docs, "ClusterRoleBinding")
    roles = _serving(docs, "Role")
    bindings = _serving(docs, "RoleBinding")
    assert sorted(r["metadata"]["namespace"] for r in roles) == ["team-a", "team-b"]
    assert sorted(b["metadata"]["namespace"] for b in bindings) == ["team-a", "team-b"]
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == "rlightning-system"


def test_rules_are_least_privilege(offline_helm):
    (cluster_role,) = _serving(documents(offline_helm.template()), "ClusterRole")
    roles = _serving(documents(offline_helm.template(*NAMESPACED)), "Role")
    rules = cluster_role["rules"]
    assert all(role["rules"] == rules for role in roles), "both scopes grant the same rules"
    granted = {
        (group, resource): set(rule["verbs"])
        for rule in rules for group in rule["apiGroups"] for resource in rule["resources"]
    }
    for (group, resource), verbs in granted.items():
        assert "*" not in (group, resource) and "*" not in verbs
        assert not verbs & {"escalate", "bind", "impersonate", "deletecollection"}
    assert granted[("", "pods")] == {"get", "list", "watch", "delete"}, \
        "pods are read (status reports what they do) and deleted only when stranded on a node that stopped answering"
    assert not _granted(rules, {"secrets", "pods/exec", "pods/log", "nodes", "namespaces",
                                     "customresourcedefinitions", "clusterroles", "clusterrolebindings",
                                     "kopfpeerings", "clusterkopfpeerings", "leases"})
    assert granted[("", "events")] == {"create"}
    # The operator can grant its trainer pods' Role only what it holds itself (no `escalate`).
    assert {"get", "patch"} <= granted[(contract.API_GROUP, f"{contract.PLURAL}/status")]


@pytest.mark.parametrize("args", [(), NAMESPACED], ids=["all namespaces", "namespaced"])
def test_nodes_are_read_only_through_a_cluster_role_of_their_own(offline_helm, args):
    docs = documents(offline_helm.template(*args))
    (role,) = _nodes_role(docs, "ClusterRole")
    (binding,) = _nodes_role(docs, "ClusterRoleBinding")
    assert role["rules"] == [{"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]}]
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (account,) = by_kind(docs, "ServiceAccount")
    assert binding["subjects"][0]["name"] == account["metadata"]["name"]


@pytest.mark.parametrize("args", [(), NAMESPACED], ids=["all namespaces", "namespaced"])
def test_network_policies_are_switched_by_one_value(offline_helm, args):
    docs = documents(offline_helm.template(*args, "--set", "networkPolicy.metricsNamespace=monitoring"))
    options = _settings(_container(docs)).network_policy_options
    assert options is not None and options.metrics_namespace == "monitoring"
    assert all("networkpolicies" in _granted(role["rules"], {"networkpolicies"})
               for role in _serving(docs, "Role") + _serving(docs, "ClusterRole"))
    off = documents(offline_helm.template(*args, "--set", "networkPolicy.enabled=false"))
    assert _settings(_container(off)).network_policy_options is None
    assert not any(_granted(role["rules"], {"networkpolicies"})
                   for role in _serving(off, "Role") + _serving(off, "ClusterRole")), "no access it does not use"


def _granted(rules: list[dict], resources: set[str]) -> set[str]:
    """The names of `resources` that some rule grants."""
    return {resource for rule in rules for resource in rule["resources"] if resource in resources}
