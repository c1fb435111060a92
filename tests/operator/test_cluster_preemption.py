"""A spot node's end on the real control plane (kwok runs the pods): the trainers' node is tainted as Karpenter taints
a node it disrupts; the operator asks the trainers for a checkpoint at once (the PolicyGroup's checkpoint-request
annotation and a CheckpointRequested Event), and the gang restart that the drain then causes is named `Preempted`
in status (reason, byReason, TrainerRestarting), in the TrainerRestarting Event and in the operator's metric."""

from __future__ import annotations

import yaml

from devcluster import _nodes
from rlightning import contract

from operator_cluster import apply, condition, get_json, items, pods, running, small, wait_for

SPOT = _nodes.node_name(41)  # beyond the cluster's own nodes (its pod CIDR too)
KARPENTER = "karpenter.sh/disrupted"


def on_spot() -> dict:
    """A trainer pod shorthand: tiny requests, only on the spot node."""
    terms = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [SPOT]}]}
    return {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}},
            "affinity": {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [terms]}}}}


def events(cluster, namespace, type_, reason):
    return [e for e in items(cluster, "events", "-n", namespace, "--field-selector",
                             f"involvedObject.kind={contract.KIND},type={type_}") if e["reason"] == reason]


def test_a_node_marked_for_disruption_asks_for_a_checkpoint_and_its_drain_is_a_preemption(crd, namespace, operator):
    crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(_nodes.node_manifest(41, gpu=False)))
    try:
        wait_for("the spot node Ready", lambda: condition(get_json(crd, "node", SPOT), "Ready").get("status") == "True")
        apply(crd, namespace, small(replicas=1, **{"spec.train.nodes": 2, "spec.train.pod": on_spot()}))
        trainers = wait_for("both trainers running on the spot node", lambda: (
            found := pods(crd, namespace, "train")) and running(found) == 2 and found)
        assert {p["spec"]["nodeName"] for p in trainers} == {SPOT}
        assert contract.ANNOTATION_CHECKPOINT_REQUEST not in (
            get_json(crd, "pg", "cartpole", "-n", namespace)["metadata"].get("annotations") or {})

        crd.kubectl("taint", "node", SPOT, f"{KARPENTER}:NoSchedule")
        requested = wait_for("the checkpoint requested", lambda: (get_json(crd, "pg", "cartpole", "-n", namespace)[
            "metadata"].get("annotations") or {}).get(contract.ANNOTATION_CHECKPOINT_REQUEST))
        assert SPOT in requested and KARPENTER in requested, requested
        (asked,) = wait_for("one CheckpointRequested Event", lambda: events(crd, namespace, "Normal",
                                                                            "CheckpointRequested"))
        assert SPOT in asked["message"] and KARPENTER in asked["message"]
        assert operator.counter("rlightning_operator_checkpoint_requests_total") == 1

        victim = sorted(p["metadata"]["name"] for p in trainers)[0]
        crd.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")  # the drain's first deletion
        group = wait_for("the restart recorded", lambda: (
            found := get_json(crd, "pg", "cartpole", "-n", namespace)).get("status", {}).get("restarts", {}).get(
            "total") == 1 and found)
        restarts = group["status"]["restarts"]
        assert (restarts["reason"], restarts["byReason"], restarts["pod"]) == ("Preempted", {"Preempted": 1}, victim)
        assert KARPENTER in restarts["message"], restarts
        restarting = condition(group, "TrainerRestarting")
        assert restarting["reason"] in ("Preempted", "AttemptRunning"), restarting
        if restarting["reason"] == "AttemptRunning":  # the new gang formed already: the message keeps the count
            assert "1 Preempted" in restarting["message"], restarting
        (event,) = wait_for("one TrainerRestarting Warning", lambda: events(crd, namespace, "Warning",
                                                                           "TrainerRestarting"))
        assert event["message"].startswith("Preempted: attempt 1 replaces attempt 0"), event["message"]
        assert operator.counter("rlightning_operator_gang_restarts_total", reason="Preempted") == 1
        assert operator.counter("rlightning_operator_gang_restarts_total") == 1
    finally:
        crd.kubectl("delete", "node", SPOT, "--wait=false", check=False)
