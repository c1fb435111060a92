"""Gang restarts of the trainers, by table: the Job and pods of an attempt -> restart (failure or disruption),
nothing, or no restart left (`_planner.plan_restart`, `_pods.trainer_loss`); pods of a node that stopped answering:
which are force-deleted, and how the status names the node until they are replaced."""

from __future__ import annotations

import datetime

import pytest

from rlightning import contract
from rlightning_operator import Observation, compute_status
from rlightning_operator._pods import Stranded, unreachable_nodes
from rlightning_operator._planner import Restarts, plan_force_deletes, plan_restart
from rlightning_operator._status import unreachable_left

T0, T1, T2 = "2026-12-01T10:00:00Z", "2026-12-01T10:00:01Z", "2026-12-01T10:00:05Z"


def job(attempt=0, ready=2, conditions=(), reason="BackoffLimitExceeded", deleting=False, suspended=False):
    metadata = {"name": "g-train", "labels": {contract.LABEL_ATTEMPT: str(attempt)}}
    if deleting:
        metadata["deletionTimestamp"] = T2
    return {"kind": "Job", "metadata": metadata, "spec": {"suspend": suspended},
            "status": {"ready": ready, "conditions": [{"type": t, "status": "True", "reason": reason, "message": "m"}
                                                      for t in conditions]}}


def pod(name, role="train", attempt=0, phase="Running", exit_code=None, container="train", finished=T1,
        deleted_at=None, disruption=None):
    """A pod as read; `deleted_at` is when its deletion was requested (grace 75 s), `disruption` a DisruptionTarget
    reason."""
    metadata = {"name": name, "labels": {contract.LABEL_ROLE: role, contract.LABEL_ATTEMPT: str(attempt)}}
    if deleted_at:
        requested = datetime.datetime.fromisoformat(deleted_at.replace("Z", "+00:00"))
        grace_end = requested + datetime.timedelta(seconds=75)
        metadata.update(deletionTimestamp=grace_end.strftime("%Y-%m-%dT%H:%M:%SZ"), deletionGracePeriodSeconds=75)
    status = {"phase": phase, "conditions": []}
    if exit_code is not None:
        status["containerStatuses"] = [{"name": container, "state": {"terminated": {
            "exitCode": exit_code, "reason": "Error", "finishedAt": finished}}}]
    if disruption:
        status["conditions"].append({"type": "DisruptionTarget", "status": "True", "reason": disruption,
                                     "message": f"{disruption} happened", "lastTransitionTime": T0})
    return {"metadata": metadata, "status": status}


RUNNING = [pod("g-train-0-a"), pod("g-train-1-b")]
FAILED = pod("g-train-1-b", phase="Failed", exit_code=1)

# (name, job, pods, current restarts, max restarts, expected: None | (restart, cause, reason, pod, after))
CASES = [
    ("all running", job(), RUNNING, Restarts(), 3, None),
    ("a container exits 1: failure", job(ready=1), [RUNNING[0], FAILED], Restarts(), 3,
     (True, "failure", "PodFailed", "g-train-1-b", Restarts(attempt=1, failures=1))),
    ("the Job failed on it and deleted the other pod: still a failure",
     job(ready=0, conditions=["FailureTarget"]), [pod("g-train-0-a", deleted_at=T1), FAILED], Restarts(), 3,
     (True, "failure", "PodFailed", "g-train-1-b", Restarts(attempt=1, failures=1))),
    ("kubectl delete pod: disruption", job(ready=1), [pod("g-train-0-a", deleted_at=T0), RUNNING[1]], Restarts(), 3,
     (True, "disruption", "PodDeleted", "g-train-0-a", Restarts(attempt=1, disruptions=1))),
    ("deleted, then its peer failed: disruption", job(ready=0, conditions=["FailureTarget"]),
     [pod("g-train-0-a", phase="Failed", exit_code=143, deleted_at=T0),
      pod("g-train-1-b", phase="Failed", exit_code=1, finished=T2)], Restarts(), 3,
     (True, "disruption", "PodDeleted", "g-train-0-a", Restarts(attempt=1, disruptions=1))),
    ("evicted (drain): disruption", job(ready=1), [pod("g-train-0-a", disruption="EvictionByEvictionAPI"), RUNNING[1]],
     Restarts(), 3, (True, "disruption", "EvictionByEvictionAPI", "g-train-0-a", Restarts(attempt=1, disruptions=1))),
    ("preempted: disruption", job(ready=1), [pod("g-train-0-a", disruption="PreemptionByScheduler"), RUNNING[1]],
     Restarts(), 3, (True, "disruption", "PreemptionByScheduler", "g-train-0-a", Restarts(attempt=1, disruptions=1))),
    ("node lost (pod GC of a deleted node): disruption", job(ready=1),
     [RUNNING[0], pod("g-train-1-b", phase="Failed", disruption="DeletionByPodGC", deleted_at=T0)], Restarts(), 3,
     (True, "disruption", "DeletionByPodGC", "g-train-1-b", Restarts(attempt=1, disruptions=1))),
    ("node not ready (taint manager): disruption", job(ready=1),
     [pod("g-train-0-a", disruption="DeletionByTaintManager"), RUNNING[1]], Restarts(), 3,
     (True, "disruption", "DeletionByTaintManager", "g-train-0-a", Restarts(attempt=1, disruptions=1))),
    ("disruptions never use up restarts", job(attempt=5, ready=1),
     [pod("g-train-0-a", attempt=5, deleted_at=T0), pod("g-train-1-b", attempt=5)],
     Restarts(attempt=5, failures=3, disruptions=2), 3,
     (True, "disruption", "PodDeleted", "g-train-0-a", Restarts(attempt=6, failures=3, disruptions=3))),
    ("Kueue suspended the Job (preemption, requeue): its pods go, no loss", job(ready=0, suspended=True),
     [pod("g-train-0-a", deleted_at=T0), pod("g-train-1-b", deleted_at=T0)], Restarts(), 3, None),
    ("max restarts reached: no restart", job(attempt=3, ready=1),
     [pod("g-train-0-a", attempt=3), pod("g-train-1-b", attempt=3, phase="Failed", exit_code=1)],
     Restarts(attempt=3, failures=3), 3,
     (False, "failure", "PodFailed", "g-train-1-b", Restarts(attempt=3, failures=3))),
    ("maxRestarts 0: the first failure ends training", job(ready=1), [RUNNING[0], FAILED], Restarts(), 0,
     (False, "failure", "PodFailed", "g-train-1-b", Restarts())),
    ("exit 2 of validate: the spec is bad, no restart", job(ready=1),
     [RUNNING[0], pod("g-train-1-b", phase="Failed", exit_code=2, container="validate")], Restarts(), 3, None),
    ("the Job failed by its pod failure policy: no restart", job(ready=0, conditions=["Failed"],
                                                                 reason="PodFailurePolicy"), [], Restarts(), 3, None),
    ("the Job failed with no pod left: failure", job(ready=0, conditions=["Failed"]), [], Restarts(), 3,
     (True, "failure", "JobFailed", "", Restarts(attempt=1, failures=1))),
    ("training complete: pods deleted afterwards are no loss", job(ready=0, conditions=["Complete"]),
     [pod("g-train-0-a", phase="Succeeded", deleted_at=T0)], Restarts(), 3, None),
    ("deleted, it exited 0 after its checkpoint: still a disruption", job(ready=1),
     [RUNNING[0], pod("g-train-1-b", phase="Succeeded", exit_code=0, deleted_at=T0)], Restarts(), 3,
     (True, "disruption", "PodDeleted", "g-train-1-b", Restarts(attempt=1, disruptions=1))),
    ("a succeeded pod is no loss", job(ready=1), [RUNNING[0], pod("g-train-1-b", phase="Succeeded", exit_code=0)],
     Restarts(), 3, None),
    ("evaluators scaled down are never a failure", job(),
     [*RUNNING, pod("g-eval-2", role="eval", deleted_at=T0),
      pod("g-eval-3", role="eval", phase="Failed", exit_code=143, container="eval", deleted_at=T0)],
     Restarts(), 3, None),
    ("pods of the old attempt are no loss of the new one", job(attempt=1, ready=0),
     [pod("g-train-0-a", attempt=0, phase="Failed", exit_code=1), pod("g-train-0-c", attempt=1, phase="Pending")],
     Restarts(attempt=1, failures=1), 3, None),
    ("the old attempt's Job being replaced: nothing more", job(attempt=0, ready=0, conditions=["Failed"]),
     [FAILED], Restarts(attempt=1, failures=1), 3, None),
    ("a Job being deleted (spec change): nothing", job(deleting=True, ready=0), [pod("g-train-0-a", deleted_at=T0)],
     Restarts(), 3, None),
    ("no Job yet", None, [], Restarts(), 3, None),
]


@pytest.mark.parametrize(("name", "job_", "pods", "current", "max_restarts", "expected"), CASES,
                         ids=[c[0] for c in CASES])
def test_restart_table(name, job_, pods, current, max_restarts, expected):
    decision = plan_restart(job_, pods, current, max_restarts)
    if expected is None:
        assert decision is None
        return
    restart, cause, reason, pod_name, after = expected
    assert decision is not None
    assert (decision.restart, decision.loss.cause, decision.loss.reason, decision.loss.pod, decision.after) == (
        restart, cause, reason, pod_name, after)
    if pod_name:
        assert pod_name in decision.loss.message


def on_node(pod_, node="node-a", ready="False"):
    """`pod_` bound to `node`, its Ready condition `ready` (the node lifecycle controller sets False when the node
    stops answering: MarkPodsNotReady)."""
    pod_["spec"] = {"nodeName": node}
    pod_["status"]["conditions"].append({"type": "Ready", "status": ready, "lastTransitionTime": T1})
    return pod_


def unix(timestamp, plus=0.0):
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp() + plus


EVICTED = {"deleted_at": T0, "disruption": "DeletionByTaintManager"}
# deleted at T0 with a grace period of 75 s, which no kubelet of a silent node honours: not waited for
DELETED, EARLIER = unix(T0), unix(T0, -1.0)

# (name, pods, current attempt, now, expected pod names)
FORCE_CASES = [
    ("an evicted evaluator, at once", [on_node(pod("g-eval-0", role="eval", **EVICTED))], 0,
     DELETED, ["g-eval-0"]),
    ("not before the deletion (the API server's clock ahead)", [on_node(pod("g-eval-0", role="eval", **EVICTED))],
     0, EARLIER, []),
    ("a trainer of an older attempt", [on_node(pod("g-train-0-a", attempt=1, **EVICTED))], 2, DELETED,
     ["g-train-0-a"]),
    ("a trainer of the current attempt: its loss restarts the gang first",
     [on_node(pod("g-train-0-a", attempt=2, **EVICTED))], 2, DELETED, []),
    ("still ready: its node answers", [on_node(pod("g-eval-0", role="eval", **EVICTED), ready="True")], 0,
     DELETED, []),
    ("evicted by a drain, not the taint manager",
     [on_node(pod("g-eval-0", role="eval", deleted_at=T0, disruption="EvictionByEvictionAPI"))], 0, DELETED, []),
    ("deleted by a person (no DisruptionTarget)", [on_node(pod("g-eval-0", role="eval", deleted_at=T0))], 0,
     DELETED, []),
    ("never scheduled", [pod("g-eval-0", role="eval", **EVICTED)], 0, DELETED, []),
    ("a pod of no role", [on_node(pod("other", role="", **EVICTED))], 0, DELETED, []),
    ("sorted by node, then name", [on_node(pod("g-eval-1", role="eval", **EVICTED), node="node-b"),
                                   on_node(pod("g-eval-2", role="eval", **EVICTED)),
                                   on_node(pod("g-eval-0", role="eval", **EVICTED), node="node-b")], 0, DELETED,
     ["g-eval-2", "g-eval-0", "g-eval-1"]),
]


@pytest.mark.parametrize(("name", "pods", "attempt", "now", "expected"), FORCE_CASES, ids=[c[0] for c in FORCE_CASES])
def test_force_delete_table(name, pods, attempt, now, expected):
    found = plan_force_deletes(pods, attempt, now)
    assert [s.pod for s in found] == expected
    assert all(s.since == T1 for s in found), "since the node lifecycle controller marked the pod not ready"
    assert all(s.role == ("eval" if "eval" in s.pod else "train") for s in found), "whose condition names the node"


# (name, stranded pods, the text that names their nodes)
UNREACHABLE_CASES = [
    ("none", [], ""),
    ("one pod", [Stranded("g-eval-1", "kwok-node-1", T1, "eval")], f"node kwok-node-1 unreachable since {T1}"),
    ("a node's earliest time", [Stranded("g-eval-1", "n1", T2, "eval"), Stranded("g-train-0-a", "n1", T0, "train")],
     f"node n1 unreachable since {T0}"),
    ("by node name", [Stranded("g-eval-1", "n2", T0, "eval"), Stranded("g-eval-0", "n1", T2, "eval")],
     f"node n1 unreachable since {T2}; node n2 unreachable since {T0}"),
]


@pytest.mark.parametrize(("name", "left", "expected"), UNREACHABLE_CASES, ids=[c[0] for c in UNREACHABLE_CASES])
def test_unreachable_nodes_table(name, left, expected):
    assert unreachable_nodes(left) == expected


def test_the_readiness_condition_of_the_role_names_the_node_until_it_is_ready():
    left = [Stranded("g-eval-1", "n1", T0, "eval"), Stranded("g-train-0-a", "n2", T1, "train")]
    sts = {"status": {"replicas": 2, "readyReplicas": 1}}
    computed = compute_status(Observation("g", 1, nodes=1, replicas=2, job=job(ready=1), stateful_set=sts, now=T2,
                                          unreachable=left))
    messages = {c["type"]: c["message"] for c in computed["conditions"]}
    assert messages["EvaluatorsReady"] == f"1/2 evaluator pods ready; node n1 unreachable since {T0}"
    assert messages["Ready"] == messages["EvaluatorsReady"], "Ready shows the first condition not True"
    assert messages["TrainersReady"] == "1/1 trainer pods ready", "a role ready again names no node"
    assert unreachable_left(left, computed) == left[:1], "the trainers are replaced: their node is forgotten"

