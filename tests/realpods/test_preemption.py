"""A spot node's end on the real node: the node is tainted as Karpenter taints a node it disrupts; the operator asks
the trainers for a checkpoint and rank 0 writes one at once, between periodic ones. The drain that follows leaves the
trainer no time for its final checkpoint (its processes are stopped, then the pod deleted with a 1 s grace period):
the next attempt resumes at the iteration checkpointed on notice, and status, an Event and the operator's metric name
the restart `Preempted`."""

from __future__ import annotations

import devcluster
from realpods_helpers import CLAIM, TRAIN_SECONDS, real_cartpole, signal_trainer, wait_for
from rlightning import contract
from rlightning.runtime.rundir import RunDir
from tests.operator.operator_cluster import apply, condition, get_json, items

NAME = "spot"
KARPENTER = "karpenter.sh/disrupted"


def training(cluster, namespace: str) -> dict:
    return (get_json(cluster, "pg", NAME, "-n", namespace).get("status") or {}).get("training") or {}


def trainer_pods(cluster, namespace: str, attempt: int) -> list[dict]:
    return items(cluster, "pods", "-n", namespace, "-l",
                 f"{contract.LABEL_GROUP}={NAME},{contract.LABEL_ROLE}=train,{contract.LABEL_ATTEMPT}={attempt}")


def test_a_checkpoint_written_on_notice_is_where_the_gang_resumes_after_the_drain(
    cluster, real_namespace, real_operator, checkpoint_claim
):
    run_dir = RunDir(checkpoint_claim)
    apply(cluster, real_namespace, real_cartpole(NAME, **{
        "spec.train.checkpoint": {"persistentVolumeClaim": CLAIM, "intervalIterations": 1000},
        "spec.train.targetEvalReturn": None,
        "spec.train.totalEnvSteps": 10_000_000,  # never reached: the test ends once the next attempt resumed
        "spec.eval.replicas": 1,
    }))
    try:
        wait_for("rank 0 reporting its third iteration", lambda: training(cluster, real_namespace).get(
            "iteration", 0) >= 3, timeout=TRAIN_SECONDS, interval=1.0)
        assert run_dir.newest_checkpoint() is None, "no periodic checkpoint within the test"
        cluster.kubectl("taint", "node", devcluster.NODE_NAME, f"{KARPENTER}:NoSchedule")
        noticed = wait_for("the checkpoint on notice", lambda: (
            last := training(cluster, real_namespace).get("lastCheckpoint") or {}).get("request") and last,
            timeout=60.0, interval=0.5)
        assert devcluster.NODE_NAME in noticed["request"] and KARPENTER in noticed["request"], noticed
        iteration = noticed["iteration"]
        assert 3 <= iteration < 1000 and noticed["seconds"] > 0, noticed
        newest = run_dir.newest_checkpoint()
        assert newest is not None and newest.name.startswith(f"iter-{iteration:08d}-"), newest

        (pod,) = trainer_pods(cluster, real_namespace, 0)
        # torchrun and its worker stopped: no iteration and no checkpoint follows
        signal_trainer(cluster, real_namespace, pod["metadata"]["name"], "SIGSTOP", workers_only=False)
        cluster.kubectl("delete", "pod", pod["metadata"]["name"], "-n", real_namespace, "--grace-period=1",
                        "--wait=false")
        restarted = wait_for("the restart recorded", lambda: (
            restarts := (get_json(cluster, "pg", NAME, "-n", real_namespace).get("status") or {}).get(
                "restarts") or {}).get("total") == 1 and restarts, timeout=60.0)
        assert (restarted["reason"], restarted["byReason"]) == ("Preempted", {"Preempted": 1}), restarted
        fits = condition(get_json(cluster, "pg", NAME, "-n", real_namespace), "CheckpointWithinGracePeriod")
        assert (fits["status"], fits["reason"]) == ("True", "WithinGracePeriod"), fits
    finally:
        cluster.kubectl("taint", "node", devcluster.NODE_NAME, f"{KARPENTER}:NoSchedule-", check=False)

    def resumed_line() -> str | None:
        pods = [p for p in trainer_pods(cluster, real_namespace, 1) if p["status"].get("phase") == "Running"]
        if not pods:
            return None
        log = cluster.kubectl("logs", pods[0]["metadata"]["name"], "-n", real_namespace, "-c", "train",
                              check=False).stdout
        return next((line for line in log.splitlines() if "attempt 1 of the trainer gang" in line), None)

    line = wait_for("attempt 1 resumed", resumed_line, timeout=TRAIN_SECONDS, interval=2.0)
    assert newest.name in line, (line, newest.name)  # the path is the pod's mount of the claim: its name is checked
    warnings = items(cluster, "events", "-n", real_namespace, "--field-selector",
                     f"involvedObject.kind={contract.KIND},type=Warning")
    events = [e for e in warnings if e["reason"] == "TrainerRestarting"]
    assert events and events[0]["message"].startswith("Preempted: "), events
    assert real_operator.counter("rlightning_operator_gang_restarts_total", reason="Preempted") == 1
