"""Behaviours 1 and 2 of issue 8 on the real node: a PolicyGroup trains to Succeeded in real pods, its two
trainer pods of one rank each training together (with pod templates and a sized /dev/shm, issue 24; one run proves
both). Behaviour 7, deleting it, is in test_fleet_changes.py (its run ends with the deletion)."""

from __future__ import annotations

import json
import time

import devcluster
from rlightning import contract
from realpods_helpers import real_cartpole, real_pod, wait_for, wait_until_succeeded

from tests.operator.operator_cluster import apply, get_json


def _train_to_succeeded(cluster, namespace: str, group: dict, record_property, while_running=None) -> dict:
    """Apply `group`, call `while_running()` if given, wait until it is Succeeded, record the time and seconds per
    iteration; its status."""
    name = group["metadata"]["name"]
    started = time.monotonic()
    apply(cluster, namespace, group)
    if while_running is not None:
        while_running()
    status = wait_until_succeeded(cluster, namespace, name)
    seconds = time.monotonic() - started
    per_iteration = seconds / max(1, status["training"]["iteration"])
    record_property("apply_to_succeeded_seconds", round(seconds, 1))
    record_property("seconds_per_iteration_with_start", round(per_iteration, 2))
    print(f"{name}: apply to Succeeded {seconds:.1f}s, {per_iteration:.2f}s per iteration including pod start")
    return status


SHM_SIZE = "256Mi"
INSIDE = """
import json, os
shm = os.statvfs("/dev/shm")
print(json.dumps({"asset": open("/etc/assets/greeting").read(), "secret": os.environ.get("RL_SECRET_TOKEN"),
                  "shm_bytes": shm.f_blocks * shm.f_frsize}))
"""
"""Run in each runtime container: what the pod template and spec.*.pod.shmSize put there."""


def _templated(role: str) -> dict:
    """A pod template giving the runtime container a ConfigMap volume at /etc/assets and a Secret as env."""
    return {"spec": {
        "volumes": [{"name": "assets", "configMap": {"name": "assets"}}],
        "containers": [{"name": role, "envFrom": [{"secretRef": {"name": "s3"}}],
                        "volumeMounts": [{"name": "assets", "mountPath": "/etc/assets", "readOnly": True}]}],
    }}


def _seen_inside(cluster, namespace: str) -> dict[str, dict]:
    """What `INSIDE` prints in a running trainer and evaluator of `cartpole`, by role; {} until both answer."""
    seen = {}
    for role in ("train", "eval"):
        selector = f"{contract.LABEL_GROUP}=cartpole,{contract.LABEL_ROLE}={role}"
        running = [p["metadata"]["name"] for p in get_json(cluster, "pods", "-n", namespace, "-l", selector)["items"]
                   if p["status"].get("phase") == "Running"]
        if not running:
            return {}
        result = cluster.kubectl("exec", running[0], "-n", namespace, "-c", role, "--", "python", "-c", INSIDE,
                                 check=False)
        if result.returncode != 0:
            return {}
        seen[role] = json.loads(result.stdout)
    return seen


def test_cartpole_trains_to_succeeded_in_real_pods_across_two_trainer_pods(
    cluster, real_namespace, real_operator, record_property
):
    # DDP across pods: node rank from the Job's completion index, rank 0 at pod 0's headless DNS name. Each
    # single-rank pod runs torch with its own CPU's threads (launch.threads_per_process), not the node's cores.
    # With a pod template per role (a ConfigMap volume, a Secret as env) and a sized /dev/shm: both reach the
    # running containers, and training still succeeds.
    cluster.kubectl("create", "configmap", "assets", "-n", real_namespace, "--from-literal=greeting=hello")
    cluster.kubectl("create", "secret", "generic", "s3", "-n", real_namespace, "--from-literal=RL_SECRET_TOKEN=t0k")
    pod = real_pod(shmSize=SHM_SIZE)
    group = real_cartpole("cartpole", **{"spec.train.nodes": 2, "spec.train.procsPerNode": 1,
                                         "spec.train.batchesPerUpdate": 1,  # one evaluator's batch a rank
                                         "spec.train.pod": pod, "spec.eval.pod": pod,
                                         "spec.train.template": _templated("train"),
                                         "spec.eval.template": _templated("eval")})
    seen: dict[str, dict] = {}

    def look_inside() -> None:  # while training runs: exec needs running containers
        answers = wait_for("a running trainer and evaluator to answer", lambda: _seen_inside(cluster, real_namespace))
        seen.update(answers)

    status = _train_to_succeeded(cluster, real_namespace, group, record_property, while_running=look_inside)
    expected = {"asset": "hello", "secret": "t0k", "shm_bytes": 256 * 2**20}
    assert seen == {"train": expected, "eval": expected}
    training = status["training"]
    assert training["weightVersion"] > 0
    assert training["consistent"] is True
    assert training["envSteps"] > 0 and training["iteration"] > 0
    assert training["evalReturn"] >= 475  # the example's targetEvalReturn ends training
    pods = get_json(cluster, "pods", "-n", real_namespace)["items"]
    assert pods and all(p["spec"]["nodeName"] == devcluster.NODE_NAME for p in pods)
    trainers = [p for p in pods if p["metadata"]["labels"].get(contract.LABEL_ROLE) == contract.PolicyRole.TRAIN]
    assert len(trainers) == 2
    for trainer in trainers:
        runtime = next(c for c in trainer["spec"]["containers"] if c["name"] == contract.PolicyRole.TRAIN)
        env = {item["name"]: item.get("value") for item in runtime["env"]}
        assert env["OMP_NUM_THREADS"] == "1"
    table = cluster.kubectl("get", "pg", "cartpole", "-n", real_namespace).stdout
    header, row = table.splitlines()[:2]
    assert header.split()[:7] == ["NAME", "PHASE", "TRAINERS", "EVALUATORS", "RESTARTS", "WEIGHTS", "CONSISTENT"]
    assert row.split()[1] == "Succeeded" and row.split()[5] == str(training["weightVersion"])
    assert row.split()[4] == "0" and row.split()[6] == "true"
