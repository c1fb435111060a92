"""Prometheus Operator monitors and the Grafana dashboard: rendered only when asked, selecting the pods the operator
really builds, and querying only metrics the code really exports."""

from __future__ import annotations

import json
import re

import pytest
from prometheus_client import CollectorRegistry, Metric
from prometheus_client import REGISTRY as OPERATOR_REGISTRY  # where rlightning_operator._metrics registers

import rlightning_operator._metrics  # noqa: F401 (registers the operator's metrics)
from rlightning import contract
from rlightning.config import load_manifest
from rlightning.runtime._prometheus import EvaluatorMetrics, TrainerMetrics
from rlightning_operator import build_children
from helm_chart import REPO, by_kind, documents

pytestmark = pytest.mark.cluster  # helm comes from the devcluster build

OPERATOR_MONITOR = ("--set", "monitoring.operator.podMonitor.enabled=true")
GROUPS_MONITOR = ("--set", "monitoring.policyGroups.podMonitor.enabled=true")
DASHBOARD = ("--set", "monitoring.grafanaDashboard.enabled=true")
ALL = (*OPERATOR_MONITOR, *GROUPS_MONITOR, *DASHBOARD)
COMPLETION_INDEX_LABEL = "batch.kubernetes.io/job-completion-index"
"""The label Kubernetes (1.28+) puts on an Indexed Job's pods: their completion index, the trainers' node rank."""

SAMPLE_SUFFIXES = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                   "summary": ("", "_count", "_sum", "_created")}
"""The sample names prometheus-client exposes for a family of each type (its name with these suffixes); others: the
name itself."""


def _monitors(docs: list[dict]) -> dict[str, dict]:
    """The PodMonitors by what they watch: `operator` or `policygroups`."""
    return {"policygroups" if doc["metadata"]["name"].endswith("-policygroups") else "operator": doc
            for doc in by_kind(docs, "PodMonitor")}


def _dashboards(docs: list[dict]) -> list[dict]:
    return [doc for doc in by_kind(docs, "ConfigMap") if "rlightning.json" in doc.get("data", {})]


def _meta_label(label: str) -> str:
    """Prometheus' Kubernetes discovery name of a pod label (every character outside [a-zA-Z0-9_] becomes _)."""
    return "__meta_kubernetes_pod_label_" + re.sub(r"[^a-zA-Z0-9_]", "_", label)


def _relabel(config: list[dict], labels: dict[str, str]) -> dict[str, str] | None:
    """Apply the `replace` (default) and `drop` relabelings of a PodMonitor endpoint to a target's labels, as
    Prometheus does (regex anchored, source values joined by ';'); None when the target is dropped."""
    labels = dict(labels)
    for rule in config:
        value = rule.get("separator", ";").join(labels.get(name, "") for name in rule["sourceLabels"])
        match = re.fullmatch(rule.get("regex", "(.*)"), value)
        if rule.get("action", "replace").lower() == "drop":
            if match:
                return None
        elif match:
            labels[rule["targetLabel"]] = match.expand(rule.get("replacement", r"\1"))
    return labels


def _pods(namespace: str) -> dict[str, dict]:
    """Trainer and evaluator pod templates the builders make for examples/cartpole.yaml."""
    children = build_children(load_manifest(REPO / "examples" / "cartpole.yaml"), namespace)
    (job,) = [c for c in children if c["kind"] == "Job"]
    (sts,) = [c for c in children if c["kind"] == "StatefulSet"]
    return {"train": job["spec"]["template"], "eval": sts["spec"]["template"]}


def _selects(selector: dict, labels: dict[str, str]) -> bool:
    """A Kubernetes label selector (matchLabels and In/Exists expressions) matches `labels`."""
    if not selector.get("matchLabels", {}).items() <= labels.items():
        return False
    for expression in selector.get("matchExpressions", []):
        if expression["operator"] == "In" and labels.get(expression["key"]) not in expression["values"]:
            return False
        if expression["operator"] == "Exists" and expression["key"] not in labels:
            return False
    return True


def test_nothing_is_rendered_unless_asked(offline_helm):
    docs = documents(offline_helm.template())
    assert not _monitors(docs) and not _dashboards(docs)


@pytest.mark.parametrize(
    ("args", "monitors", "dashboards"),
    [(OPERATOR_MONITOR, ["operator"], 0), (GROUPS_MONITOR, ["policygroups"], 0), (DASHBOARD, [], 1),
     (ALL, ["operator", "policygroups"], 1)],
    ids=["operator monitor", "policygroups monitor", "dashboard", "all"],
)
def test_each_switch_renders_its_object(offline_helm, args, monitors, dashboards):
    docs = documents(offline_helm.template(*args, "--set", "monitoring.labels.release=prometheus"))
    assert sorted(_monitors(docs)) == monitors
    assert len(_dashboards(docs)) == dashboards
    for monitor in _monitors(docs).values():
        assert monitor["apiVersion"] == "monitoring.coreos.com/v1"
        assert monitor["metadata"]["labels"]["release"] == "prometheus", "the Prometheus selects monitors by label"


def test_operator_monitor_scrapes_the_operator_pods_metrics_port(offline_helm):
    docs = documents(offline_helm.template(*OPERATOR_MONITOR, "--set", "monitoring.operator.podMonitor.interval=15s"))
    monitor = _monitors(docs)["operator"]
    (deployment,) = by_kind(docs, "Deployment")
    pod = deployment["spec"]["template"]
    assert _selects(monitor["spec"]["selector"], pod["metadata"]["labels"])
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    (container,) = pod["spec"]["containers"]
    assert {"name": endpoint["port"], "containerPort": contract.OPERATOR_METRICS_PORT, "protocol": "TCP"} in container[
        "ports"]
    assert endpoint["interval"] == "15s"
    proc = offline_helm("template", "x", str(REPO / "charts" / "rlightning-operator"), *OPERATOR_MONITOR, "--set",
                        "metrics.enabled=false", check=False)
    assert proc.returncode != 0 and "needs metrics.enabled" in proc.stderr


def test_policygroup_monitor_scrapes_trainer_rank_0_and_every_evaluator(offline_helm):
    (monitor,) = by_kind(documents(offline_helm.template(*GROUPS_MONITOR)), "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"any": True}
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert "interval" not in endpoint, "empty: the Prometheus's own"
    pods = _pods("team-a")
    for role, pod in pods.items():
        labels = pod["metadata"]["labels"]
        assert _selects(monitor["spec"]["selector"], labels), role
        container = next(c for c in pod["spec"]["containers"] if c["name"] == role)
        assert endpoint["port"] == contract.METRICS_PORT_NAME
        assert {"name": endpoint["port"], "containerPort": contract.METRICS_PORT, "protocol": "TCP"} in container[
            "ports"]
        meta = {_meta_label(k): v for k, v in labels.items()} | {"__meta_kubernetes_pod_name": f"cartpole-{role}-0"}
        if role == "train":
            meta[_meta_label(COMPLETION_INDEX_LABEL)] = "0"
        target = _relabel(endpoint["relabelings"], meta)
        assert target is not None and (target["policy_group"], target["role"]) == ("cartpole", role)
        assert target["instance"] == f"cartpole-{role}-0", "a replaced pod continues its series"
    # Only rank 0 serves /metrics: the trainer pods of node rank 1 and up are no targets.
    train_labels = {_meta_label(k): v for k, v in pods["train"]["metadata"]["labels"].items()}
    for index, scraped in (("1", False), ("10", False), ("0", True)):
        target = _relabel(endpoint["relabelings"], train_labels | {_meta_label(COMPLETION_INDEX_LABEL): index})
        assert (target is not None) == scraped, index
    # An object the operator does not build is not selected.
    assert not _selects(monitor["spec"]["selector"], {contract.LABEL_ROLE: "train"})


def test_policygroup_monitor_watches_the_operators_namespaces(offline_helm):
    docs = documents(offline_helm.template(*GROUPS_MONITOR, "--set", "watchNamespaces={team-a,team-b}"))
    (monitor,) = by_kind(docs, "PodMonitor")
    assert monitor["spec"]["namespaceSelector"] == {"matchNames": ["team-a", "team-b"]}


def test_dashboard_label_and_namespace_are_settable(offline_helm):
    (default,) = _dashboards(documents(offline_helm.template(*DASHBOARD)))
    assert default["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert default["metadata"]["namespace"] == "rlightning-system"
    docs = documents(offline_helm.template(
        *DASHBOARD, "--set", "monitoring.grafanaDashboard.label=dashboards",
        "--set-string", "monitoring.grafanaDashboard.labelValue=rl",
        "--set", "monitoring.grafanaDashboard.namespace=monitoring",
        "--set", "monitoring.grafanaDashboard.annotations.grafana_folder=rlightning",
    ))
    (configmap,) = _dashboards(docs)
    assert configmap["metadata"]["labels"]["dashboards"] == "rl" and "grafana_dashboard" not in configmap["metadata"][
        "labels"]
    assert configmap["metadata"]["namespace"] == "monitoring"
    assert configmap["metadata"]["annotations"] == {"grafana_folder": "rlightning"}


def _exported(registry: CollectorRegistry) -> set[str]:
    families: list[Metric] = list(registry.collect())
    return {f.name + suffix for f in families for suffix in SAMPLE_SUFFIXES.get(f.type, ("",))}


def _metric_names(expr: str) -> set[str]:
    """The metric names a PromQL expression selects: its identifiers outside strings, label matchers, ranges,
    grouping clauses and function calls, less the operators that are words."""
    expr = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
    expr = re.sub(r"\{[^}]*\}|\[[^\]]*\]", "", expr)
    expr = re.sub(r"\b(?:by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", expr)
    names = set(re.findall(r"(?<![\w:$])([a-zA-Z_:][\w:]*)(?![\w:])(?!\s*\()", expr))
    return names - {"and", "or", "unless", "bool", "offset"}


def test_dashboard_queries_only_metrics_the_code_exports(offline_helm):
    (configmap,) = _dashboards(documents(offline_helm.template(*DASHBOARD)))
    dashboard = json.loads(configmap["data"]["rlightning.json"])
    panels = [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]
    variables = [re.fullmatch(r"label_values\((.*), *\w+\)", v["query"]["query"]).group(1)
                 for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = set().union(*map(_metric_names, panels + variables))
    exported = _exported(TrainerMetrics(0).registry) | _exported(EvaluatorMetrics(0).registry) | _exported(
        OPERATOR_REGISTRY)
    assert used and used <= exported, f"not exported by the runtime or the operator: {sorted(used - exported)}"
    # What the dashboard is for, per group: throughput, lag, idle share, weight version and consistency, restarts
    # and sync time.
    assert {
        "rlightning_train_env_steps_per_second", "rlightning_policy_lag_mean", "rlightning_train_idle_fraction",
        "rlightning_weight_version", "rlightning_eval_consistent", "rlightning_train_attempt",
        "rlightning_weight_sync_seconds_total",
    } <= used
    # Per group: the labels the PolicyGroup monitor gives its targets.
    (monitor,) = by_kind(documents(offline_helm.template(*GROUPS_MONITOR)), "PodMonitor")
    target_labels = {rule["targetLabel"] for rule in monitor["spec"]["podMetricsEndpoints"][0]["relabelings"]
                     if "targetLabel" in rule}
    grouped = [e for e in panels if "rlightning_operator_" not in e]
    assert grouped and all("policy_group" in e for e in grouped)
    assert {"policy_group", "role"} <= target_labels
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])
