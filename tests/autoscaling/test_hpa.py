"""An autoscaling/v2 HorizontalPodAutoscaler on resource metrics scales a PolicyGroup through its /scale.

metrics-server (built from its module by devcluster) scrapes kwok's simulated kubelet metrics; an evaluator's CPU
usage is what its `kwok.x-k8s.io/usage-cpu` annotation says. examples/autoscaling/hpa.yaml as it is: load rises
(the evaluators use their whole request) -> the HPA raises spec.eval.replicas to its maximum -> new evaluators
run; load falls -> it lowers replicas to its minimum. The trainer is never restarted and no evaluator that left
is counted as a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.operator.operator_cluster import apply, get_json, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
GROUP = "cartpole-elastic"
USAGE_ANNOTATION = "kwok.x-k8s.io/usage-cpu"
"""kwok's per-pod CPU usage (its ClusterResourceUsage usage-from-annotation); 1m without it."""
SCALE_SECONDS = 180.0
"""Bound for one HPA decision: two metrics-server scrapes (10 s apart) and an HPA sync (every 15 s), with slack
for a loaded machine."""


def _replicas(cluster, namespace) -> int:
    return get_json(cluster, "pg", GROUP, "-n", namespace)["spec"]["eval"]["replicas"]


def _use_cpu(cluster, namespace, usage: str | None) -> None:
    """Annotate every evaluator pod with its CPU usage (None: back to kwok's 1m)."""
    value = f"{USAGE_ANNOTATION}={usage}" if usage else f"{USAGE_ANNOTATION}-"
    cluster.kubectl("annotate", "pods", "-n", namespace, "-l", "rlightning.io/role=eval", "--overwrite", value)


def test_hpa_scales_the_fleet_up_on_load_and_down_when_it_falls(crd, namespace, metrics_server,
                                                                operator):
    cluster = crd
    cluster.kubectl("apply", "-f", str(EXAMPLES / "priorityclasses.yaml"))
    apply(cluster, namespace, yaml.safe_load((EXAMPLES / "policygroup.yaml").read_text()))
    wait_for("1 trainer and 2 evaluators Running",
             lambda: running(pods(cluster, namespace, "train")) == 1 and running(pods(cluster, namespace, "eval")) == 2)
    (trainer,) = pods(cluster, namespace, "train")
    apply(cluster, namespace, yaml.safe_load((EXAMPLES / "hpa.yaml").read_text()))

    _use_cpu(cluster, namespace, "250m")  # each evaluator at 100% of its 250m request; the target is 50%
    wait_for("the HPA to scale the group to 4", lambda: _replicas(cluster, namespace) == 4, timeout=SCALE_SECONDS)
    wait_for("4 evaluators Running", lambda: running(pods(cluster, namespace, "eval")) == 4)
    hpa = get_json(cluster, "hpa", GROUP, "-n", namespace)
    assert hpa["status"]["currentMetrics"][0]["resource"]["current"]["averageUtilization"] > 0

    _use_cpu(cluster, namespace, None)  # idle: 1m of 250m
    wait_for("the HPA to scale the group to 1", lambda: _replicas(cluster, namespace) == 1, timeout=SCALE_SECONDS)
    wait_for("1 evaluator left", lambda: len(pods(cluster, namespace, "eval")) == 1)

    def settled():
        status = get_json(cluster, "pg", GROUP, "-n", namespace).get("status") or {}
        return status if status.get("eval", {}).get("summary") == "1/1" else None

    status = wait_for("status to show the fleet of 1", settled)
    assert status["phase"] == "Running" and status["train"]["failed"] == 0, status
    assert [p["metadata"]["uid"] for p in pods(cluster, namespace, "train")] == [trainer["metadata"]["uid"]]
