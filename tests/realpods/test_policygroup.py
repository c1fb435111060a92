"""Behaviours 1 and 7 of issue 8 on the real node: a PolicyGroup trains to Succeeded in real pods, and deleting it
removes every pod and leaves nothing of them on the host."""

from __future__ import annotations

import time

import devcluster
from realpods_helpers import TRAIN_SECONDS, get_json, pods_on_host, real_cartpole, wait_for

from tests.operator.operator_cluster import apply


def test_cartpole_trains_to_succeeded_in_real_pods(cluster, real_namespace, real_operator, record_property):
    started = time.monotonic()
    apply(cluster, real_namespace, real_cartpole("cartpole"))

    def phase() -> str:
        group = get_json(cluster, "pg", "cartpole", "-n", real_namespace)
        found = (group.get("status") or {}).get("phase", "")
        assert found not in {"Failed", "Invalid"}, f"PolicyGroup went {found}: {group.get('status')}"
        return found == "Succeeded"

    wait_for("the PolicyGroup to succeed", phase, timeout=TRAIN_SECONDS, interval=2.0)
    record_property("apply_to_succeeded_seconds", round(time.monotonic() - started, 1))
    print(f"apply to Succeeded: {time.monotonic() - started:.1f}s")

    status = get_json(cluster, "pg", "cartpole", "-n", real_namespace)["status"]
    training = status["training"]
    assert training["weightVersion"] > 0
    assert training["consistent"] is True
    assert training["envSteps"] > 0 and training["iteration"] > 0
    assert training["evalReturn"] >= 475  # the example's targetEvalReturn ends training
    pods = get_json(cluster, "pods", "-n", real_namespace)["items"]
    assert pods and all(p["spec"]["nodeName"] == devcluster.NODE_NAME for p in pods)
    table = cluster.kubectl("get", "pg", "cartpole", "-n", real_namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:6] == ["NAME", "PHASE", "TRAINERS", "EVALUATORS", "WEIGHTS", "CONSISTENT"]
    assert row.split()[1] == "Succeeded" and row.split()[4] == str(training["weightVersion"])
    assert row.split()[5] == "true"


def test_deleting_the_policygroup_removes_its_pods_and_their_host_state(
    cluster, real_node, real_namespace, real_operator
):
    apply(cluster, real_namespace, real_cartpole("doomed"))

    def running_pods() -> list[dict]:
        pods = get_json(cluster, "pods", "-n", real_namespace)["items"]
        running = [p for p in pods if p["status"].get("phase") == "Running"]
        return running if len(running) == 3 else []  # 1 trainer pod + 2 evaluators

    pods = wait_for("the trainer and both evaluators to run", running_pods)
    uids = {p["metadata"]["uid"] for p in pods}
    assert real_node.tasks_of(uids), "running pods have no running containers on the node"

    cluster.kubectl("delete", "pg", "doomed", "-n", real_namespace, "--wait=false")
    wait_for(
        "every pod of the PolicyGroup to be gone",
        lambda: not get_json(cluster, "pods", "-n", real_namespace)["items"],
        timeout=180.0,
    )
    wait_for("the node to drop the pods' containers, folders and cgroups", lambda: not pods_on_host(real_node, uids),
             timeout=60.0, explain=lambda: "\n".join(pods_on_host(real_node, uids)))
