"""A node that stops answering does not stall a run (on the real control plane, kwok running the pods of the other
nodes): the test plays the kubelet of a node of its own, then silences it and marks it and its pods as the node
lifecycle controller and the taint manager do past their timeouts (50 s and 300 s by default, too long for a
test); the operator force-deletes the stranded pods: the next attempt forms elsewhere and the evaluators are
replaced while the node stays silent, and the status names the node until they are."""

from __future__ import annotations

import contextlib
import datetime
import json
import re
import subprocess

import pytest
import yaml

from devcluster import _nodes
from rlightning import contract
from tests import _json_stream

from operator_cluster import apply, condition, get_json, items, pods, running, small, wait_for

SILENT = _nodes.node_name(40)  # beyond the cluster's own nodes (its pod CIDR too)
OTHER = _nodes.node_name(0)
EVALUATORS = 4
GRACE_SECONDS = "3"  # the pods' deletion grace period: what a kubelet would have to end them


@pytest.fixture
def silent_node(crd):
    """A node of its own that no kwok runs: the test writes its status and its pods' as a kubelet would, until it
    falls silent. Deleted after."""
    node = _nodes.node_manifest(40, gpu=False)
    del node["metadata"]["annotations"][_nodes.KWOK_ANNOTATION]
    crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(node))
    ready = {"type": "Ready", "status": "True", "reason": "KubeletReady", "lastHeartbeatTime": now()}
    crd.kubectl("patch", "node", SILENT, "--subresource=status", "-p",
                json.dumps({"status": {**node["status"], "conditions": [ready]}}))
    yield SILENT
    crd.kubectl("delete", "node", SILENT, "--wait=false", check=False)


def now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def run_as_kubelet(cluster, namespace, pod):
    """Write `pod`'s status as a kubelet that started it would: Running, its containers ready."""
    started = {"running": {"startedAt": now()}}
    containers = [{"name": c["name"], "image": c["image"], "imageID": "", "ready": True, "restartCount": 0,
                   "started": True, "state": started} for c in pod["spec"]["containers"]]
    conditions = [{"type": t, "status": "True"} for t in ("Initialized", "ContainersReady", "Ready")]
    running_status = {"phase": "Running", "conditions": conditions, "containerStatuses": containers, "startTime": now()}
    cluster.kubectl("patch", "pod", pod["metadata"]["name"], "-n", namespace, "--subresource=status", "-p",
                    json.dumps({"status": running_status}))


def placed(node_names, preferred=None) -> dict:
    """A pod shorthand: tiny requests, only on `node_names`, `preferred` first."""
    terms = {"matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": node_names}]}
    affinity: dict = {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [terms]}}
    if preferred:
        affinity["preferredDuringSchedulingIgnoredDuringExecution"] = [{"weight": 100, "preference": {
            "matchExpressions": [{"key": "kubernetes.io/hostname", "operator": "In", "values": [preferred]}]}}]
    return {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}, "affinity": {"nodeAffinity": affinity}}


def on(node, pod_list):
    return sorted(p["metadata"]["name"] for p in pod_list if p["spec"].get("nodeName") == node)


def silence(cluster, node, victims, namespace):
    """What a node whose kubelet stops answering goes through: the node lifecycle controller marks it Ready Unknown,
    taints it NoSchedule and marks its pods not ready; the taint manager deletes them (DisruptionTarget
    DeletionByTaintManager) once their toleration expires. No kubelet ends them."""
    cluster.kubectl("taint", "node", node, "node.kubernetes.io/unreachable:NoSchedule")
    unknown = {"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
               "message": "Kubelet stopped posting node status."}
    cluster.kubectl("patch", "node", node, "--subresource=status", "-p",
                    json.dumps({"status": {"conditions": [unknown]}}))
    for name in victims:
        # with their times: the disruption controller turns a DisruptionTarget with no time False as stale
        conditions = [{"type": "Ready", "status": "False", "lastTransitionTime": now()},
                      {"type": "DisruptionTarget", "status": "True", "reason": "DeletionByTaintManager",
                       "message": "Taint manager: deleting due to NoExecute taint", "lastTransitionTime": now()}]
        cluster.kubectl("patch", "pod", name, "-n", namespace, "--subresource=status",
                        "-p", json.dumps({"status": {"conditions": conditions}}))
        cluster.kubectl("delete", "pod", name, "-n", namespace, f"--grace-period={GRACE_SECONDS}", "--wait=false")


@contextlib.contextmanager
def statuses(cluster, namespace, path):
    """Every version of the PolicyGroup `cartpole` while the block runs (`kubectl get -w`, written to `path`), so
    that a status held for a moment only is seen; yields a function that returns them parsed."""
    with path.open("w") as out:
        watch = subprocess.Popen([str(cluster.bin("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get", "pg",
                                  "cartpole", "-n", namespace, "-w", "-o", "json"], stdout=out,
                                 stderr=subprocess.DEVNULL)

    def seen() -> list[dict]:
        return _json_stream.decode_all(path.read_text())

    try:
        yield seen
    finally:
        watch.terminate()
        watch.wait(timeout=10)


def test_pods_of_a_silent_node_are_force_deleted_and_the_run_goes_on(crd, namespace, operator, silent_node, tmp_path):
    apply(crd, namespace, small(replicas=EVALUATORS, **{
        "spec.train.pod": placed([SILENT, OTHER], preferred=SILENT), "spec.eval.pod": placed([SILENT, OTHER])}))

    def started():
        trainers, evaluators = pods(crd, namespace, "train"), pods(crd, namespace, "eval")
        for pod in trainers + evaluators:
            if pod["spec"].get("nodeName") == SILENT and pod["status"].get("phase") != "Running":
                run_as_kubelet(crd, namespace, pod)
        return (trainers, evaluators) if running(trainers) == 1 and running(evaluators) == EVALUATORS else None

    trainers, evaluators = wait_for("attempt 0 and the evaluators running", started)
    lost_trainers, lost_evaluators = on(SILENT, trainers), on(SILENT, evaluators)
    assert lost_trainers, f"the trainer prefers {SILENT}: {[p['spec'].get('nodeName') for p in trainers]}"
    assert lost_evaluators, f"evaluators spread over {SILENT} and {OTHER}: {on(OTHER, evaluators)} on {OTHER}"
    with statuses(crd, namespace, tmp_path / "statuses.json") as seen:
        silence(crd, SILENT, lost_trainers + lost_evaluators, namespace)

        def next_attempt():
            trainers = [p for p in pods(crd, namespace, "train")
                        if p["metadata"]["labels"].get(contract.LABEL_ATTEMPT) == "1"]
            return trainers if running(trainers) == 1 else None

        (trainer,) = wait_for("attempt 1 running", next_attempt)
        assert trainer["spec"]["nodeName"] == OTHER
        replaced = wait_for("the evaluators replaced", lambda: (lambda e: e if running(e) == EVALUATORS and not on(
            SILENT, e) else None)(pods(crd, namespace, "eval")))

        def ready_again():
            group = get_json(crd, "pg", "cartpole", "-n", namespace)
            ok = all(condition(group, t).get("status") == "True" for t in ("TrainersReady", "EvaluatorsReady"))
            return group if ok and group["status"]["train"]["attempt"] == 1 else None

        ready = wait_for("trainers and evaluators ready again", ready_again)
        versions = wait_for("the watch to deliver that status", lambda: (lambda v: v if any(
            x["metadata"]["resourceVersion"] == ready["metadata"]["resourceVersion"] for x in v) else None)(seen()))
    naming = re.compile(rf"; node {SILENT} unreachable since \d{{4}}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")
    named = {c["type"] for v in versions for c in (v.get("status") or {}).get("conditions") or []
             if naming.search(c["message"])}
    assert {"TrainersReady", "EvaluatorsReady"} <= named, [condition(v, "TrainersReady") for v in versions]
    assert not [c for c in ready["status"]["conditions"] if SILENT in c["message"]], "replaced: no longer named"
    assert sorted(p["metadata"]["name"] for p in replaced) == sorted(p["metadata"]["name"] for p in evaluators)
    node = get_json(crd, "node", SILENT)
    assert [c["status"] for c in node["status"]["conditions"] if c["type"] == "Ready"] == ["Unknown"], \
        "the node stayed silent: the pods went by force, not by a kubelet"

    def unreachable():
        return [e["message"] for e in items(crd, "events", "-n", namespace, "--field-selector",
                                            f"involvedObject.kind={contract.KIND},type=Warning")
                if e["reason"] == "NodeUnreachable"]

    messages = wait_for("a NodeUnreachable Warning", unreachable)
    named = {name for message in messages for name in lost_trainers + lost_evaluators if name in message}
    assert all(f"node {SILENT} unreachable since " in m for m in messages), messages
    assert named == set(lost_trainers + lost_evaluators), messages
    group = get_json(crd, "pg", "cartpole", "-n", namespace)
    assert group["status"]["train"]["attempt"] == 1 and group["status"]["restarts"]["disruptions"] == 1
    assert group["status"]["restarts"]["reason"] == "NodeLost", group["status"]["restarts"]
