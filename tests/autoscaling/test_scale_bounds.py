"""spec.eval.minReplicas and maxReplicas bound every scale, through the scale subresource as through the spec.

Decision: a scale outside the bounds is refused by the API server (the CRD's CEL rule on spec.eval, which the
scale subresource's writes go through too), not clamped by the operator. `kubectl scale` then fails with the
rule's message, and an HPA records FailedRescale on itself; clamping would make the operator rewrite
spec.eval.replicas against its writer (an HPA writes 12, the operator 8, the HPA 12 again) and leave the user's
command quietly not done. The HPA's own minReplicas/maxReplicas should sit within the group's
(docs/autoscaling.md).
"""

from __future__ import annotations

import pytest

from tests.operator.operator_cluster import apply, get_json, pods, running, small, wait_for

pytestmark = pytest.mark.autoscaling


def _scale(cluster, namespace: str, replicas: int):
    return cluster.kubectl("scale", "pg/cartpole", "-n", namespace, f"--replicas={replicas}", check=False)


def test_scales_within_the_bounds_go_through_and_the_others_are_refused(crd, namespace,
                                                                         operator):
    cluster = crd
    apply(cluster, namespace, small(replicas=2, **{"spec.eval.minReplicas": 1, "spec.eval.maxReplicas": 3}))
    wait_for("1 trainer and 2 evaluators Running",
             lambda: running(pods(cluster, namespace, "train")) == 1 and running(pods(cluster, namespace, "eval")) == 2)
    (trainer,) = pods(cluster, namespace, "train")

    for replicas in (4, 0):
        refused = _scale(cluster, namespace, replicas)
        assert refused.returncode != 0, f"a scale to {replicas} went through"
        assert "minReplicas <= replicas <= maxReplicas" in refused.stderr, refused.stderr
    assert get_json(cluster, "pg", "cartpole", "-n", namespace)["spec"]["eval"]["replicas"] == 2

    assert _scale(cluster, namespace, 3).returncode == 0
    wait_for("3 evaluators Running", lambda: running(pods(cluster, namespace, "eval")) == 3)
    assert _scale(cluster, namespace, 1).returncode == 0  # a scale-down to the lower bound
    wait_for("1 evaluator left", lambda: len(pods(cluster, namespace, "eval")) == 1)

    def settled():
        group = get_json(cluster, "pg", "cartpole", "-n", namespace)
        status = group.get("status") or {}
        return status if status.get("eval", {}).get("summary") == "1/1" and status.get("replicas") == 1 else None

    status = wait_for("status to show the fleet of 1", settled)
    # The evaluators that left are no failure, and the trainer never restarted.
    assert status["phase"] == "Running" and status["train"]["failed"] == 0, status
    assert [p["metadata"]["uid"] for p in pods(cluster, namespace, "train")] == [trainer["metadata"]["uid"]]
