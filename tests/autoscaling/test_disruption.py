"""Disruption safety on the control plane: what keeps node drains and node autoscalers away from trainers.

examples/autoscaling/ applied as it is: the operator creates both PodDisruptionBudgets owned by the PolicyGroup,
trainer pods carry the node autoscalers' annotations and each role its PriorityClass, and the eviction API (what
`kubectl drain`, Karpenter and the Cluster Autoscaler call) refuses to evict a trainer while it lets an evaluator
go within the evaluators' budget (which then allows no second one until the StatefulSet has replaced it: not
checked here, since kwok replaces a pod within a fraction of a second).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlightning import contract
from tests.operator.operator_cluster import apply, get_json, items, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
GROUP = "cartpole-elastic"


def _evict(cluster, namespace: str, pod: str):
    """POST an Eviction for `pod` (policy/v1), as a drain does; the completed kubectl call."""
    body = {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": pod, "namespace": namespace}}
    return cluster.kubectl("create", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}/eviction", "-f", "-",
                           input=json.dumps(body), check=False)


def test_trainers_cannot_be_evicted_and_evaluators_go_within_their_budget(crd, namespace,
                                                                             operator):
    cluster = crd
    cluster.kubectl("apply", "-f", str(EXAMPLES / "priorityclasses.yaml"))
    apply(cluster, namespace, yaml.safe_load((EXAMPLES / "policygroup.yaml").read_text()))
    uid = get_json(cluster, "pg", GROUP, "-n", namespace)["metadata"]["uid"]

    def budgets():
        found = {b["metadata"]["name"]: b for b in items(cluster, "poddisruptionbudgets", "-n", namespace)}
        return found if len(found) == 2 else None

    found = wait_for("both PodDisruptionBudgets", budgets)
    for name, budget in found.items():
        (owner,) = budget["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["uid"], owner["controller"]) == (contract.KIND, uid, True), name
    assert found[f"{GROUP}-train"]["spec"]["minAvailable"] == 1
    assert found[f"{GROUP}-eval"]["spec"]["maxUnavailable"] == 1

    wait_for("1 trainer and 2 evaluators Running",
             lambda: running(pods(cluster, namespace, "train")) == 1 and running(pods(cluster, namespace, "eval")) == 2)
    (trainer,) = pods(cluster, namespace, "train")
    annotations = trainer["metadata"]["annotations"]
    assert annotations[contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT] == "true"
    assert annotations[contract.ANNOTATION_CLUSTER_AUTOSCALER_SAFE_TO_EVICT] == "false"
    assert (trainer["spec"]["priorityClassName"], trainer["spec"]["priority"]) == ("rlightning-trainer", 100000)
    evaluators = pods(cluster, namespace, "eval")
    assert {(p["spec"]["priorityClassName"], p["spec"]["priority"]) for p in evaluators} == {
        ("rlightning-evaluator", 10000)}
    assert contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT not in evaluators[0]["metadata"].get("annotations", {})

    def counted(name: str, healthy: int):
        budget = get_json(cluster, "pdb", name, "-n", namespace)
        status = budget.get("status") or {}
        ok = status.get("observedGeneration") == budget["metadata"]["generation"] and status.get(
            "currentHealthy") == healthy
        return status if ok else None

    assert wait_for("the trainers' budget to count 1 healthy pod", lambda: counted(f"{GROUP}-train", 1))[
        "disruptionsAllowed"] == 0
    assert wait_for("the evaluators' budget to count 2 healthy pods", lambda: counted(f"{GROUP}-eval", 2))[
        "disruptionsAllowed"] == 1

    refused = _evict(cluster, namespace, trainer["metadata"]["name"])
    assert refused.returncode != 0 and "disruption budget" in refused.stderr, refused.stderr
    victim = evaluators[0]["metadata"]
    evicted = _evict(cluster, namespace, victim["name"])  # the one disruption the evaluators' budget allows now
    assert evicted.returncode == 0, evicted.stderr

    def replaced():
        current = pods(cluster, namespace, "eval")
        return running(current) == 2 and victim["uid"] not in {p["metadata"]["uid"] for p in current}

    wait_for("the StatefulSet to replace the evicted evaluator", replaced)
    assert [p["metadata"]["uid"] for p in pods(cluster, namespace, "train")] == [trainer["metadata"]["uid"]]
