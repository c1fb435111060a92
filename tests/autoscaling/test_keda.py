"""KEDA scales a PolicyGroup on the fleet's own load: the trainers' idle fraction, read from their /metrics.

examples/autoscaling/keda-scaledobject.yaml as it is, except its metrics URL: the trainer pod runs on a kwok node
(no process), so the trainer's endpoint is served by this test with the runtime's own `TrainerMetrics` on a port of
tests/_ports.py, and the URL points there. KEDA's metrics-api scaler reads `rlightning_train_idle_fraction`
(Prometheus text); KEDA's HPA writes spec.eval.replicas through /scale. Load rises (the trainers wait 80% of an
iteration for data) -> the group grows to its maximum and the evaluators run; load falls (no wait) -> it shrinks to
its minimum. The trainer is never restarted and no evaluator that left is counted as a failure.
"""

from __future__ import annotations

import time
from pathlib import Path

import prometheus_client
import pytest
import yaml

from rlightning.runtime import _prometheus
from tests import _ports
from tests.operator.operator_cluster import apply, get_json, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
GROUP = "cartpole-elastic"
HPA = f"keda-hpa-{GROUP}"
"""The HPA KEDA creates for the ScaledObject (``keda-hpa-<ScaledObject name>``)."""
METRICS_PORT = _ports.AUTOSCALING_METRICS.port(0)
SCALE_SECONDS = 120.0
"""Bound for one scaling step: the HPA controller's sync (every 15 s) reading the external metric through the
adapter, the operator's scaler and its HTTP GET, and a /scale write; up to two syncs, with slack for a loaded
machine."""
READY_SECONDS = 60.0
"""Bound for KEDA to make the ScaledObject Ready and create its HPA."""


def _replicas(cluster, namespace) -> int:
    return get_json(cluster, "pg", GROUP, "-n", namespace)["spec"]["eval"]["replicas"]


def _ready(cluster, namespace) -> bool:
    scaled = get_json(cluster, "scaledobject", GROUP, "-n", namespace)
    conditions = (scaled.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _keda_logs(keda) -> str:
    text = keda.log_path.read_text(errors="replace")[-6000:] if keda.log_path.exists() else ""
    adapter = keda.adapter_log_path
    return f"--- keda-operator.log ---\n{text}\n--- keda-adapter.log ---\n" + (
        adapter.read_text(errors="replace")[-3000:] if adapter.exists() else ""
    )


def test_keda_scales_the_fleet_on_the_trainers_idle_fraction(crd, namespace, keda, operator):
    cluster = crd
    metrics = _prometheus.TrainerMetrics(0)  # the trainer's gauges, served below on loopback
    server, _thread = prometheus_client.start_http_server(METRICS_PORT, addr="127.0.0.1", registry=metrics.registry)
    try:
        cluster.kubectl("apply", "-f", str(EXAMPLES / "priorityclasses.yaml"))
        group = yaml.safe_load((EXAMPLES / "policygroup.yaml").read_text())
        apply(cluster, namespace, group)
        wait_for("1 trainer and 2 evaluators Running",
                 lambda: running(pods(cluster, namespace, "train")) == 1
                 and running(pods(cluster, namespace, "eval")) == 2)
        (trainer,) = pods(cluster, namespace, "train")

        scaled = yaml.safe_load((EXAMPLES / "keda-scaledobject.yaml").read_text())
        assert (scaled["spec"]["minReplicaCount"], scaled["spec"]["maxReplicaCount"]) == (
            group["spec"]["eval"]["minReplicas"], group["spec"]["eval"]["maxReplicas"]
        ), "the ScaledObject's bounds are the group's"
        trigger = scaled["spec"]["triggers"][0]["metadata"]
        assert trigger["url"] == f"http://{GROUP}-train-0.{GROUP}-train.default.svc:9400/metrics"
        trigger["url"] = f"http://127.0.0.1:{METRICS_PORT}/metrics"

        metrics.idle_fraction.set(0.8)  # the trainers wait 80% of an iteration for the fleet's data
        apply(cluster, namespace, scaled)
        began = time.monotonic()
        wait_for("the ScaledObject Ready", lambda: _ready(cluster, namespace), timeout=READY_SECONDS)
        wait_for("KEDA to scale the group to 8", lambda: _replicas(cluster, namespace) == 8, timeout=SCALE_SECONDS)
        wait_for("8 evaluators Running", lambda: running(pods(cluster, namespace, "eval")) == 8)
        print(f"keda: 2 -> 8 evaluators Running {time.monotonic() - began:.1f}s after the ScaledObject")
        hpa = get_json(cluster, "hpa", HPA, "-n", namespace)
        assert hpa["spec"]["scaleTargetRef"]["kind"] == "PolicyGroup"
        assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 8)
        assert [o["kind"] for o in hpa["metadata"]["ownerReferences"]] == ["ScaledObject"]
        assert hpa["status"]["currentMetrics"][0]["external"]["current"]["value"] == "800m"

        metrics.idle_fraction.set(0.0)  # the fleet now outpaces the trainers
        began = time.monotonic()
        wait_for("KEDA to scale the group to 1", lambda: _replicas(cluster, namespace) == 1, timeout=SCALE_SECONDS)
        wait_for("1 evaluator left", lambda: len(pods(cluster, namespace, "eval")) == 1)
        print(f"keda: 8 -> 1 evaluator {time.monotonic() - began:.1f}s after the idle fraction fell")

        def settled():
            status = get_json(cluster, "pg", GROUP, "-n", namespace).get("status") or {}
            return status if status.get("eval", {}).get("summary") == "1/1" else None

        status = wait_for("status to show the fleet of 1", settled)
        assert status["phase"] == "Running" and status["train"]["failed"] == 0, status
        assert (status.get("restarts") or {}).get("total", 0) == 0, status
        assert [p["metadata"]["uid"] for p in pods(cluster, namespace, "train")] == [trainer["metadata"]["uid"]]
    except AssertionError:
        print(_keda_logs(keda))
        raise
    finally:
        cluster.kubectl("delete", "scaledobject", GROUP, "-n", namespace, "--ignore-not-found", check=False)
        server.shutdown()
        server.server_close()
