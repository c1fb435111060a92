"""What the pods are doing, in status: crash loops, unschedulable pods, stuck rollouts (pure), and the Event."""

from __future__ import annotations

import pytest

from rlightning import contract
from rlightning_operator import Observation, compute_status
from rlightning_operator import _pods as pods
from rlightning_operator._status import pod_fingerprint, pods_matter

NOW = "2026-12-01T08:00:00Z"

WHERE = 'File "policy.py", line 6, in __init__ (rank 1)'
RANK_ERROR = f"ValueError: action space Discrete(2) is not supported\n  at {WHERE}"
RANK_ERROR_LINE = f"ValueError: action space Discrete(2) is not supported at {WHERE}"
EVAL_ERROR = 'RuntimeError: act() got NaN logits\n  at File "policy.py", line 40, in act (evaluator 2)'


def pod(name, role="eval", phase="Running", ready=False, waiting=None, restarts=0, last_exit=None, exit_code=None,
        unschedulable=None, revision="r1", created="2026-12-01T07:59:00Z", ready_since=None, said=None):
    container = {"name": "train" if role == "train" else "eval", "ready": ready, "restartCount": restarts, "state": {}}
    if waiting:
        container["state"] = {"waiting": {"reason": waiting}}
    if exit_code is not None:
        container["state"] = {"terminated": {"exitCode": exit_code, "reason": "Error", "message": said}}
    if last_exit is not None:
        container["lastState"] = {"terminated": {"exitCode": last_exit, "reason": "Error", "message": said}}
    conditions = [{"type": "Ready", "status": "True" if ready else "False",
                   "lastTransitionTime": ready_since or created}]
    if unschedulable:
        phase, conditions = "Pending", [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable",
                                         "message": unschedulable}]
    return {"metadata": {"name": name, "creationTimestamp": created,
                         "labels": {contract.LABEL_ROLE: role, pods.REVISION_LABEL: revision}},
            "status": {"phase": phase, "conditions": conditions,
                       "containerStatuses": [] if unschedulable else [container]}}


def job(ready=0, failed=0):
    return {"status": {"ready": ready, "failed": failed}}


def sts(ready, replicas=3, current="r1", update="r1"):
    return {"status": {"replicas": replicas, "readyReplicas": ready, "currentRevision": current,
                       "updateRevision": update}}


def condition(status, type_):
    return next(c for c in status["conditions"] if c["type"] == type_)


# (name, observation kwargs, condition type, reason, words the message must hold)
CASES = [
    ("evaluator crash loop", dict(job=job(ready=1), stateful_set=sts(2), pods=[
        pod("g-eval-0", ready=True), pod("g-eval-1", ready=True),
        pod("g-eval-2", waiting="CrashLoopBackOff", restarts=4, last_exit=2)]),
     "EvaluatorsReady", "CrashLoopBackOff", ["2/3", "g-eval-2", "exit code 2", "4 restarts"]),
    ("evaluator restarted after a crash, running but unready", dict(job=job(ready=1), stateful_set=sts(2), pods=[
        pod("g-eval-2", restarts=1, last_exit=137)]),
     "EvaluatorsReady", "CrashLoopBackOff", ["g-eval-2", "exit code 137", "1 restarts"]),
    ("evaluator unschedulable", dict(job=job(ready=1), stateful_set=sts(2), pods=[
        pod("g-eval-2", unschedulable="0/4 nodes are available: 4 Insufficient nvidia.com/gpu.")]),
     "EvaluatorsReady", "Unschedulable", ["g-eval-2", "Insufficient nvidia.com/gpu"]),
    ("trainer pod failed, the Job retries", dict(job=job(ready=0, failed=2), stateful_set=sts(3), pods=[
        pod("g-train-0-a", role="train", phase="Failed", exit_code=1, created="2026-12-01T07:58:00Z"),
        pod("g-train-0-b", role="train", phase="Failed", exit_code=3),
        pod("g-train-0-c", role="train", phase="Pending", created="2026-12-01T07:59:30Z")]),
     "TrainersReady", "CrashLoopBackOff", ["g-train-0-b", "exit code 3", "2 failed pods"]),
    ("trainer pod failed: its failing rank's exception", dict(job=job(ready=0, failed=1), stateful_set=sts(3), pods=[
        pod("g-train-0-a", role="train", phase="Failed", exit_code=1, said=RANK_ERROR)]),
     "TrainersReady", "CrashLoopBackOff", ["g-train-0-a", "exit code 1", f"so far: {RANK_ERROR_LINE}"]),
    ("evaluator crash loop: its own exception", dict(job=job(ready=1), stateful_set=sts(2), pods=[
        pod("g-eval-2", waiting="CrashLoopBackOff", restarts=3, last_exit=1, said=EVAL_ERROR)]),
     "EvaluatorsReady", "CrashLoopBackOff", ["g-eval-2: container eval is crash-looping: last exit code 1 (Error), "
                                             "3 restarts: RuntimeError: act() got NaN logits at File \"policy.py\", "
                                             "line 40, in act (evaluator 2)"]),
    ("evaluator crash loop: what it said", dict(job=job(ready=1), stateful_set=sts(2), pods=[
        pod("g-eval-2", waiting="CrashLoopBackOff", restarts=2, last_exit=1, said="x" * 5000)]),
     "EvaluatorsReady", "CrashLoopBackOff", [f"2 restarts: {'x' * (pods.MESSAGE_CHARS - 3)}..."]),
    ("trainer unschedulable", dict(job=job(), stateful_set=sts(3), pods=[
        pod("g-train-0-a", role="train", unschedulable="0/4 nodes are available: 4 Insufficient cpu.")]),
     "TrainersReady", "Unschedulable", ["Insufficient cpu"]),
    ("rollout held by a crash-looping pod of the new revision", dict(
        job=job(ready=1), stateful_set=sts(2, current="r1", update="r2"), pods=[
            pod("g-eval-0", ready=True), pod("g-eval-1", ready=True),
            pod("g-eval-2", revision="r2", waiting="CrashLoopBackOff", restarts=3, last_exit=1)]),
     "EvaluatorsReady", "RolloutStuck", ["revision r2", "g-eval-2", "exit code 1"]),
    ("rollout held by a pod unready past the deadline", dict(
        job=job(ready=1), stateful_set=sts(2, current="r1", update="r2"), pods=[
            pod("g-eval-2", revision="r2", ready_since="2026-12-01T07:40:00Z")]),
     "EvaluatorsReady", "RolloutStuck", ["revision r2", "g-eval-2", "since 2026-12-01T07:40:00Z"]),
    ("rollout young: only waiting", dict(job=job(ready=1), stateful_set=sts(2, current="r1", update="r2"), pods=[
        pod("g-eval-2", revision="r2", ready_since="2026-12-01T07:59:00Z")]),
     "EvaluatorsReady", "Waiting", ["2/3"]),
    ("pods starting: only waiting", dict(job=job(), stateful_set=sts(0), pods=[pod("g-eval-0")]),
     "EvaluatorsReady", "Waiting", ["0/3"]),
]


@pytest.mark.parametrize(("name", "kwargs", "type_", "reason", "words"), CASES, ids=[c[0] for c in CASES])
def test_pod_problems_in_conditions(name, kwargs, type_, reason, words):
    status = compute_status(Observation("g", 1, nodes=1, replicas=3, now=NOW, **kwargs))
    found = condition(status, type_)
    assert (found["status"], found["reason"]) == ("False", reason), found
    for word in words:
        assert word in found["message"], (word, found["message"])
    assert condition(status, "Ready")["reason"] in (reason, "Waiting")


def test_ready_takes_the_first_problem_for_the_printer_column():
    status = compute_status(Observation("g", 1, nodes=1, replicas=3, now=NOW, job=job(ready=1), stateful_set=sts(2),
                                        pods=[pod("g-eval-2", waiting="CrashLoopBackOff", restarts=2, last_exit=2)]))
    assert condition(status, "Ready")["reason"] == "CrashLoopBackOff"


def test_pods_are_read_only_while_some_are_not_ready_or_a_rollout_runs():
    assert not pods_matter(1, 3, job(ready=1), sts(3))
    assert pods_matter(1, 3, job(ready=0), sts(3))
    assert pods_matter(1, 3, job(ready=1), sts(2))
    assert pods_matter(1, 3, job(ready=1), sts(3, current="r1", update="r2"))
    done = {"status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    assert not pods_matter(1, 3, done, sts(3))


def test_pod_fingerprint_moves_with_what_the_diagnosis_reads_only():
    base = pod("g-eval-0")
    assert pod_fingerprint(base) == pod_fingerprint({**base, "metadata": {**base["metadata"], "resourceVersion": "9"}})
    crashed = pod("g-eval-0", waiting="CrashLoopBackOff", restarts=1, last_exit=2)
    assert pod_fingerprint(crashed)[1] != pod_fingerprint(base)[1]
    assert pod_fingerprint(crashed)[0] == pod_fingerprint(base)[0] == ("Pod",)


def test_a_pod_that_only_starts_or_is_relabelled_keeps_its_fingerprint():
    pending = {**pod("g-eval-0", phase="Pending"), "status": {"phase": "Pending"}}
    started, ready = pod("g-eval-0"), pod("g-eval-0", ready=True)
    labelled = {**ready, "metadata": {**ready["metadata"], "labels": {**ready["metadata"]["labels"], "team": "a"},
                                      "annotations": {"note": "x"}}}
    assert len({pod_fingerprint(p) for p in (pending, started, ready, labelled)}) == 1, "the StatefulSet counts these"
    trainer = pod("g-train-0", role="train")
    assert pod_fingerprint({**trainer, "status": {**trainer["status"], "phase": "Succeeded"}}) != \
        pod_fingerprint(trainer), "a trainer that finished"


def test_trim_keeps_what_the_status_reads_and_settled_says_what_may_be_dropped():
    crashed = pod("g-eval-0", waiting="CrashLoopBackOff", restarts=1, last_exit=2)
    crashed["spec"] = {"containers": [{"name": "eval", "image": "x"}], "nodeName": "node-a"}
    crashed["metadata"]["managedFields"] = [{"manager": "kubelet"}]
    trimmed = pods.trim(crashed)
    assert trimmed["spec"] == {"nodeName": "node-a"} and "managedFields" not in trimmed["metadata"]
    assert pods.diagnose([trimmed]) == pods.diagnose([crashed]) and pods.diagnose([trimmed]) is not None
    assert pods.settled(pod("g-eval-1", ready=True)) and not pods.settled(crashed)
    assert not pods.settled(pod("g-eval-2")), "running, not ready"


def test_a_pod_being_deleted_moves_its_fingerprint():
    base = pod("g-train-0")
    deleting = {**base, "metadata": {**base["metadata"], "deletionTimestamp": "2026-12-01T10:00:00Z"}}
    assert pod_fingerprint(deleting)[1] != pod_fingerprint(base)[1], "a deleted trainer pod ends its attempt"


def test_a_trainer_loss_carries_what_its_container_said_within_the_bound():
    loss = pods.trainer_loss([pod("g-train-0-a", role="train", phase="Failed", exit_code=1, said=RANK_ERROR)])
    assert loss is not None and loss.message.endswith(f"exit code 1 (Error): {RANK_ERROR_LINE}"), loss
    assert len(pods.said({"message": "y" * 5000})) == len(": ") + pods.MESSAGE_CHARS
    assert pods.said({"message": "  \n"}) == pods.said({}) == ""
