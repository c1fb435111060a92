"""Node autoscaling: Karpenter (its kwok provider, a devcluster add-on) adds nodes for a fleet the cluster cannot hold
and removes them when the fleet shrinks, never touching the trainer.

examples/autoscaling/nodepool.yaml and policygroup-autoscaled-nodes.yaml as they are: each evaluator asks for 40
CPUs, more than any node of the dev cluster has (32), so the scheduler marks them Unschedulable; Karpenter creates
NodeClaims, its kwok provider their Nodes, kwok makes them Ready, and every evaluator runs. Scaled down through
/scale, the evaluators that left leave their nodes empty and consolidation deletes them (consolidateAfter 5 s).
The trainer (on a node of the pool, karpenter.sh/do-not-disrupt) keeps its pod and its node throughout, and the
operator counts no restart. A fleet that asks for `nvidia.com/gpu` gets the one GPU instance type.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlightning import contract
from tests import _polling
from tests.operator.operator_cluster import WAIT_SECONDS, apply, get_json, items, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
GROUP = "cartpole-wide"
POOL = "rlightning-fleet"
POOL_LABEL = "karpenter.sh/nodepool"
INSTANCE_TYPE_LABEL = "node.kubernetes.io/instance-type"
GPU = "nvidia.com/gpu"
PROVISION_SECONDS = 120.0
"""Bound for pending evaluators to run on new nodes: Karpenter's batch window (1 s idle, 10 s at most), the NodeClaim,
the Node its provider creates, kwok's Ready, Karpenter's registration (the unregistered taint removed), the
scheduler's retry of the pods; with slack for a loaded machine."""
CONSOLIDATE_SECONDS = 150.0
"""Bound for emptied nodes to go: consolidateAfter (5 s) after the last pod left, Karpenter's disruption loop
(every 10 s), its validation wait before it acts, and the termination of the NodeClaim and Node."""
CLEANUP_SECONDS = 120.0
"""Bound for the pool's nodes to go once the NodePool is deleted (after the group's pods are gone)."""


def _pool_nodes(cluster) -> list[dict]:
    return items(cluster, "nodes", "-l", f"{POOL_LABEL}={POOL}")


def _karpenter_log(karpenter) -> str:
    text = karpenter.log_path.read_text(errors="replace") if karpenter.log_path.exists() else ""
    return "--- karpenter log (tail) ---\n" + text[-8000:]


@pytest.fixture
def fleet_pool(karpenter, crd):
    """examples/autoscaling/nodepool.yaml applied and Ready (its KWOKNodeClass is Ready by the CRD's default); after
    the test, deleted and its nodes gone (the test deletes its PolicyGroup first: a trainer's do-not-disrupt pod
    would hold its node's termination)."""
    cluster = crd
    cluster.kubectl("apply", "-f", str(EXAMPLES / "nodepool.yaml"))

    def pool_ready():
        conditions = (get_json(cluster, "nodepool", POOL).get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    _polling.wait_for("the NodePool to be Ready", pool_ready, WAIT_SECONDS, explain=lambda: _karpenter_log(karpenter))
    yield cluster
    cluster.kubectl("delete", "nodepool", POOL, "--wait=false", check=False)
    cluster.kubectl("delete", "kwoknodeclass", POOL, "--wait=false", check=False)
    _polling.wait_for("the pool's nodes to go with the NodePool", lambda: not _pool_nodes(cluster), CLEANUP_SECONDS,
                      explain=lambda: _karpenter_log(karpenter))
    print(_karpenter_log(karpenter))


def _delete_group(cluster, namespace: str) -> None:
    cluster.kubectl("delete", "pg", GROUP, "-n", namespace, "--wait=true", "--timeout=60s")
    wait_for("the group's pods to be gone", lambda: not pods(cluster, namespace))


def _unschedulable(cluster, namespace: str) -> dict[str, str]:
    """Evaluator pods the scheduler reported Unschedulable, with its message (FailedScheduling Events: they outlast
    the Pending)."""
    events = items(cluster, "events", "-n", namespace, "--field-selector", "reason=FailedScheduling")
    return {e["involvedObject"]["name"]: e["message"] for e in events
            if e["involvedObject"]["name"].startswith(f"{GROUP}-eval-")}


def test_karpenter_adds_nodes_for_a_pending_fleet_and_consolidates_them_without_touching_the_trainer(
        fleet_pool, karpenter, namespace, operator):
    cluster = fleet_pool
    cluster.kubectl("apply", "-f", str(EXAMPLES / "priorityclasses.yaml"))
    apply(cluster, namespace, yaml.safe_load((EXAMPLES / "policygroup-autoscaled-nodes.yaml").read_text()))
    try:
        found = wait_for("3 evaluators reported Unschedulable", lambda: len(_unschedulable(cluster, namespace)) == 3)
        assert found
        assert all("Insufficient cpu" in message for message in _unschedulable(cluster, namespace).values())
        _polling.wait_for("1 trainer and 3 evaluators Running on new nodes",
                          lambda: running(pods(cluster, namespace, "train")) == 1 and running(
                              pods(cluster, namespace, "eval")) == 3,
                          PROVISION_SECONDS, explain=lambda: _karpenter_log(karpenter))
        nodes = {n["metadata"]["name"]: n for n in _pool_nodes(cluster)}
        (trainer,) = pods(cluster, namespace, "train")
        evaluators = pods(cluster, namespace, "eval")
        assert trainer["metadata"]["annotations"][contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT] == "true"
        for pod in [trainer, *evaluators]:
            assert pod["spec"]["nodeName"] in nodes, (pod["metadata"]["name"], pod["spec"]["nodeName"], list(nodes))
        eval_nodes = {p["spec"]["nodeName"] for p in evaluators}
        assert len(eval_nodes) == 3, "one 40-CPU evaluator per 48-CPU node"
        assert {nodes[n]["metadata"]["labels"][INSTANCE_TYPE_LABEL] for n in eval_nodes} == {"cpu-48x"}
        for node in nodes.values():  # registered by Karpenter, managed (made Ready) by the cluster's kwok
            assert not any(t["key"] == "karpenter.sh/unregistered" for t in node["spec"].get("taints") or [])
            assert node["metadata"]["annotations"]["kwok.x-k8s.io/node"] == "fake"
        claims = items(cluster, "nodeclaims")
        assert {c["status"].get("nodeName") for c in claims} >= set(nodes)
        trainer_node = trainer["spec"]["nodeName"]

        assert cluster.kubectl("scale", f"pg/{GROUP}", "-n", namespace, "--replicas=1").returncode == 0
        wait_for("1 evaluator left", lambda: len(pods(cluster, namespace, "eval")) == 1)

        def consolidated():
            """The pool's nodes are exactly those that run the group's pods, fewer than before, one NodeClaim each."""
            running_on = {p["spec"].get("nodeName") for p in pods(cluster, namespace)
                          if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")}
            left = {n["metadata"]["name"] for n in _pool_nodes(cluster)}
            claimed = {c["status"].get("nodeName") for c in items(cluster, "nodeclaims")}
            return left if left == running_on == claimed and len(left) < len(nodes) else None

        left = _polling.wait_for("consolidation to delete the emptied nodes", consolidated, CONSOLIDATE_SECONDS,
                                 explain=lambda: _karpenter_log(karpenter))
        assert trainer_node in left, "the trainer's node is never consolidated"
        # Consolidation may go on (the last evaluator may be moved beside the trainer): the trainer's node stays.
        # (Karpenter's DisruptionBlocked Event naming the annotation is not awaited: it dedupes Events per node for
        # 2 minutes, and a new node is first blocked as "nominated for a pending pod". The uid below is the proof.)

        def settled():
            status = get_json(cluster, "pg", GROUP, "-n", namespace).get("status") or {}
            return status if status.get("eval", {}).get("summary") == "1/1" else None

        status = wait_for("status to show the fleet of 1", settled)
        assert status["train"]["failed"] == 0, status
        assert (status.get("restarts") or {}).get("total", 0) == 0, status
        (still,) = pods(cluster, namespace, "train")
        assert (still["metadata"]["uid"], still["spec"]["nodeName"]) == (trainer["metadata"]["uid"], trainer_node)
    finally:
        _delete_group(cluster, namespace)


def test_a_fleet_that_asks_for_gpus_gets_the_gpu_instance_type(fleet_pool, karpenter, namespace,
                                                               operator):
    cluster = fleet_pool
    cluster.kubectl("apply", "-f", str(EXAMPLES / "priorityclasses.yaml"))
    group = yaml.safe_load((EXAMPLES / "policygroup-autoscaled-nodes.yaml").read_text())
    group["spec"]["eval"]["replicas"] = 2
    evaluator = group["spec"]["eval"]["pod"]
    evaluator["nodeSelector"] = {POOL_LABEL: POOL}  # not the dev cluster's own GPU nodes
    evaluator["resources"] = {"requests": {"cpu": "4", "memory": "8Gi", GPU: "1"},
                              "limits": {"memory": "8Gi", GPU: "1"}}
    apply(cluster, namespace, group)
    try:
        _polling.wait_for("1 trainer and 2 GPU evaluators Running on new nodes",
                          lambda: running(pods(cluster, namespace, "train")) == 1 and running(
                              pods(cluster, namespace, "eval")) == 2,
                          PROVISION_SECONDS, explain=lambda: _karpenter_log(karpenter))
        nodes = {n["metadata"]["name"]: n for n in _pool_nodes(cluster)}
        for pod in pods(cluster, namespace, "eval"):
            node = nodes[pod["spec"]["nodeName"]]
            assert node["metadata"]["labels"][INSTANCE_TYPE_LABEL] == "gpu-48x-4g", node["metadata"]["labels"]
            assert node["status"]["allocatable"][GPU] == "4"
    finally:
        _delete_group(cluster, namespace)
