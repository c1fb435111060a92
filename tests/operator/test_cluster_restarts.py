"""Gang restarts of the trainers on the real control plane (kwok runs the pods): a trainer pod deleted or failed
ends its attempt; the operator replaces the whole Job under the next attempt, never with pods of two attempts."""

from __future__ import annotations

import json

from rlightning import contract

from operator_cluster import apply, condition, get_json, items, pods, running, small, wait_for

NODES = 2


def attempts(cluster, namespace) -> dict[str, set[str]]:
    """Trainer pods (not yet gone) by their attempt label."""
    result: dict[str, set[str]] = {}
    for pod in pods(cluster, namespace, "train"):
        attempt = pod["metadata"]["labels"].get(contract.LABEL_ATTEMPT, "?")
        result.setdefault(attempt, set()).add(pod["metadata"]["name"])
    return result


def gang_running(cluster, namespace, attempt, mixed):
    """The PolicyGroup once `attempt`'s NODES trainer pods run; records any moment two attempts' pods coexist."""
    by_attempt = attempts(cluster, namespace)
    if len(by_attempt) > 1:
        mixed.append(by_attempt)
    trainers = [p for p in pods(cluster, namespace, "train")
                if p["metadata"]["labels"].get(contract.LABEL_ATTEMPT) == str(attempt)]
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    if running(trainers) == NODES and (group.get("status") or {}).get("phase") == "Running":
        return group
    return None


def phase_is(cluster, namespace, phase):
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    return group if (group.get("status") or {}).get("phase") == phase else None


def warnings(cluster, namespace, reason):
    return [e for e in items(cluster, "events", "-n", namespace, "--field-selector",
                             f"involvedObject.kind={contract.KIND},type=Warning") if e["reason"] == reason]


def test_a_deleted_trainer_pod_restarts_the_gang_as_a_disruption(crd, namespace, operator):
    apply(crd, namespace, small(replicas=1, **{"spec.train.nodes": NODES}))
    mixed: list[dict[str, set[str]]] = []
    wait_for("attempt 0 running", lambda: gang_running(crd, namespace, 0, mixed))
    (victim, *_) = sorted(attempts(crd, namespace)["0"])
    crd.kubectl("delete", "pod", victim, "-n", namespace, "--wait=false")
    group = wait_for("attempt 1 running", lambda: gang_running(crd, namespace, 1, mixed))
    assert not mixed, f"pods of two attempts at once: {mixed}"
    assert group["status"]["train"]["attempt"] == 1
    restarts = group["status"]["restarts"]
    assert (restarts["total"], restarts["failures"], restarts["disruptions"]) == (1, 0, 1), restarts
    assert restarts["pod"] == victim and restarts["reason"] == "PodDeleted", restarts
    assert condition(group, "TrainerRestarting")["reason"] == "AttemptRunning"
    assert condition(group, "CheckpointsPersistent")["reason"] == "CheckpointsNotPersistent"
    job = get_json(crd, "job", contract.train_name("cartpole"), "-n", namespace)
    assert job["metadata"]["labels"][contract.LABEL_ATTEMPT] == "1"
    (event,) = wait_for("one TrainerRestarting Warning", lambda: warnings(crd, namespace, "TrainerRestarting"))
    assert victim in event["message"] and "attempt 1 replaces attempt 0" in event["message"]
    table = crd.kubectl("get", "pg", "cartpole", "-n", namespace).stdout.splitlines()
    column = table[0].split().index("RESTARTS")
    assert table[1].split()[column] == "1", table


def exited(code: int) -> dict:
    """A trainer pod's status once its container exited with `code` (as a kubelet writes it)."""
    return {"status": {"phase": "Succeeded" if code == 0 else "Failed", "containerStatuses": [{
        "name": "train", "image": contract.DEFAULT_IMAGE, "imageID": "", "ready": False, "restartCount": 0,
        "state": {"terminated": {"exitCode": code, "reason": "Completed" if code == 0 else "Error",
                                 "startedAt": "2026-12-01T07:00:00Z", "finishedAt": "2026-12-01T07:00:01Z"}}}]}}


def finishing(cluster, namespace, phases):
    """The PolicyGroup once TrainersReady says Finishing; records every phase seen on the way."""
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    phases.append((group.get("status") or {}).get("phase"))
    return group if condition(group, "TrainersReady").get("reason") == "Finishing" else None


def test_a_restarted_gang_that_finishes_never_reads_restarting(crd, namespace, operator):
    apply(crd, namespace, small(replicas=1, **{"spec.train.nodes": NODES}))
    mixed: list[dict[str, set[str]]] = []
    wait_for("attempt 0 running", lambda: gang_running(crd, namespace, 0, mixed))
    crd.kubectl("delete", "pod", sorted(attempts(crd, namespace)["0"])[0], "-n", namespace, "--wait=false")
    group = wait_for("attempt 1 running", lambda: gang_running(crd, namespace, 1, mixed))
    settled = condition(group, "TrainerRestarting")
    assert (settled["status"], settled["reason"]) == ("False", "AttemptRunning")
    first, second = sorted(attempts(crd, namespace)["1"])
    # The ranks stop together, but their pods finish one after the other and the Job completes after the last.
    crd.kubectl("patch", "pod", first, "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps(exited(0)))
    phases: list[str | None] = []
    group = wait_for("one pod finished: Finishing", lambda: finishing(crd, namespace, phases))
    assert group["status"]["phase"] == "Running"
    restarting = condition(group, "TrainerRestarting")
    assert (restarting["status"], restarting["reason"]) == ("False", "TrainingEnded")
    crd.kubectl("patch", "pod", second, "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps(exited(0)))
    group = wait_for("Succeeded", lambda: phase_is(crd, namespace, "Succeeded"))
    assert "Restarting" not in phases, phases
    # never True in between: it has been False since the new gang was ready
    assert condition(group, "TrainerRestarting")["lastTransitionTime"] == settled["lastTransitionTime"]
    assert (group["status"]["train"]["attempt"], group["status"]["restarts"]["total"]) == (1, 1)


def test_a_failed_trainer_pod_counts_against_max_restarts(crd, namespace, operator):
    apply(crd, namespace, small(replicas=1, **{"spec.train.nodes": NODES, "spec.train.maxRestarts": 1}))
    mixed: list[dict[str, set[str]]] = []
    for attempt in (0, 1):
        wait_for(f"attempt {attempt} running", lambda a=attempt: gang_running(crd, namespace, a, mixed))
        (victim, *_) = sorted(attempts(crd, namespace)[str(attempt)])
        crd.kubectl("patch", "pod", victim, "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps(exited(1)))
    group = wait_for("Failed: no restart left", lambda: phase_is(crd, namespace, "Failed"))
    assert not mixed, f"pods of two attempts at once: {mixed}"
    assert (group["status"]["train"]["attempt"], group["status"]["restarts"]["failures"]) == (1, 1)
    assert condition(group, "TrainersReady")["reason"] == "MaxRestartsReached"
    assert wait_for("one MaxRestartsReached Warning", lambda: warnings(crd, namespace, "MaxRestartsReached"))
    assert wait_for("evaluators stopped", lambda: get_json(crd, "statefulset", contract.eval_name("cartpole"), "-n",
                                                           namespace)["spec"]["replicas"] == 0)
