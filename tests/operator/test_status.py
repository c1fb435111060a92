"""The status function: observed Job and StatefulSet -> phase, conditions, counts, selector."""

from __future__ import annotations

import dataclasses

import pytest

from rlightning import contract
from rlightning_operator import Observation, compute_status
from rlightning_operator._status import (
    ROLLOUT_RECHECK_SECONDS,
    data_condition_stale,
    differs,
    progress_condition_stale,
    recheck_seconds,
)

SELECTOR = "rlightning.io/policy-group=g,rlightning.io/role=eval"


def job(ready=0, succeeded=0, failed=0, conditions=(), reason="BackoffLimitExceeded", attempt=0):
    return {"metadata": {"labels": {contract.LABEL_ATTEMPT: str(attempt)}},
            "status": {"ready": ready, "succeeded": succeeded, "failed": failed,
                       "conditions": [{"type": t, "status": "True", "reason": reason} for t in conditions]}}


RESTARTED = {"total": 1, "failures": 0, "disruptions": 1, "reason": "PodDeleted", "pod": "g-train-1-abcde",
             "message": "pod g-train-1-abcde was deleted"}


REJECTED = job(failed=1, conditions=["FailureTarget", "Failed"], reason="PodFailurePolicy")


def queued(suspend, queue="rl-trainers", **kwargs):
    """A trainer Job in a Kueue queue; suspended until Kueue admits it."""
    built = {**job(**kwargs), "spec": {"suspend": suspend}}
    if queue:
        built["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] = queue
    return built


def sts(replicas=0, ready=0):
    return {"status": {"replicas": replicas, "readyReplicas": ready}}


def conditions(status):
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


# (name, observation kwargs, phase, {condition: (status, reason)}, train summary, eval summary, replicas)
CASES = [
    ("nothing yet", dict(), "Pending",
     {"Valid": ("True", "Validated"), "TrainersReady": ("False", "JobMissing"),
      "EvaluatorsReady": ("False", "StatefulSetMissing"), "Ready": ("False", "JobMissing")}, "0/2", "0/3", 0),
    ("pods starting", dict(job=job(ready=1), stateful_set=sts(replicas=3, ready=1)), "Pending",
     {"TrainersReady": ("False", "Waiting"), "EvaluatorsReady": ("False", "Waiting"), "Ready": ("False", "Waiting")},
     "1/2", "1/3", 3),
    ("trainers up, evaluators starting", dict(job=job(ready=2), stateful_set=sts(replicas=3, ready=2)), "Running",
     {"TrainersReady": ("True", "AllReady"), "Ready": ("False", "Waiting")}, "2/2", "2/3", 3),
    ("all ready", dict(job=job(ready=2), stateful_set=sts(replicas=3, ready=3)), "Running",
     {"TrainersReady": ("True", "AllReady"), "EvaluatorsReady": ("True", "AllReady"), "Ready": ("True", "AllReady")},
     "2/2", "3/3", 3),
    ("training done: evaluators stop", dict(job=job(succeeded=2, conditions=["Complete"]), stateful_set=sts(3, 3)),
     "Succeeded", {"TrainersReady": ("True", "Completed"), "EvaluatorsReady": ("True", "Stopped"),
                   "Ready": ("True", "AllReady")}, "0/2", "3/0:stopped", 3),
    ("training done: evaluators serve", dict(job=job(succeeded=2, conditions=["Complete"]), stateful_set=sts(3, 3),
                                             after_training="Serve"),
     "Succeeded", {"EvaluatorsReady": ("True", "AllReady"), "Ready": ("True", "AllReady")}, "0/2", "3/3:serving", 3),
    ("job failed with no restart left", dict(job=job(failed=1, conditions=["Failed"]), stateful_set=sts(3, 3),
                                             max_restarts=3, restarts={"total": 3, "failures": 3}),
     "Failed", {"TrainersReady": ("False", "MaxRestartsReached"), "Ready": ("False", "MaxRestartsReached"),
                "TrainerRestarting": ("False", "TrainingEnded")}, "0/2", "3/0:stopped", 3),
    ("spec rejected in a trainer pod", dict(job=REJECTED, stateful_set=sts(3, 0)), "Invalid",
     {"Valid": ("False", "InvalidSpecInPod"), "TrainersReady": ("False", "InvalidSpecInPod"),
      "EvaluatorsReady": ("True", "Stopped"), "Ready": ("False", "InvalidSpecInPod")}, "0/2", "0/0:stopped", 3),
    ("job failed is no invalid spec", dict(job=job(failed=1, conditions=["Failed"]), stateful_set=sts(3, 0)),
     "Failed", {"Valid": ("True", "Validated"), "TrainersReady": ("False", "MaxRestartsReached")}, "0/2",
     "0/0:stopped", 3),
    ("restarting: the old attempt's Job goes", dict(job=job(ready=1, attempt=0), stateful_set=sts(3, 3), attempt=1,
                                                    restarts=RESTARTED),
     "Restarting", {"TrainersReady": ("False", "Restarting"), "TrainerRestarting": ("True", "PodDeleted"),
                    "EvaluatorsReady": ("True", "AllReady"), "Ready": ("False", "Restarting")}, "0/2", "3/3", 3),
    ("restarting: the new attempt forms", dict(job=job(ready=1, attempt=1), stateful_set=sts(3, 3), attempt=1,
                                               restarts=RESTARTED),
     "Restarting", {"TrainersReady": ("False", "Restarting"), "TrainerRestarting": ("True", "PodDeleted")},
     "1/2", "3/3", 3),
    ("the new attempt runs", dict(job=job(ready=2, attempt=1), stateful_set=sts(3, 3), attempt=1, restarts=RESTARTED),
     "Running", {"TrainersReady": ("True", "AllReady"), "TrainerRestarting": ("False", "AttemptRunning"),
                 "Ready": ("True", "AllReady")}, "2/2", "3/3", 3),
    ("no checkpoint claim", dict(job=job(ready=2), stateful_set=sts(3, 3), checkpoints_persistent=False), "Running",
     {"CheckpointsPersistent": ("False", "CheckpointsNotPersistent"), "Ready": ("True", "AllReady")}, "2/2", "3/3", 3),
    ("foreign child", dict(job=job(ready=2), stateful_set=sts(3, 3), conflicts=["ConfigMap/g-spec"]), "Running",
     {"Ready": ("False", "Conflict")}, "2/2", "3/3", 3),
    ("queued in Kueue", dict(job=queued(True), stateful_set=sts(3, 3)), "Pending",
     {"TrainersReady": ("False", "Queued"), "Admitted": ("False", "Queued"), "Ready": ("False", "Queued")},
     "0/2", "3/3", 3),
    ("admitted by Kueue, pods starting", dict(job=queued(False, ready=1), stateful_set=sts(3, 3)), "Pending",
     {"TrainersReady": ("False", "Waiting"), "Admitted": ("True", "Admitted"), "Ready": ("False", "Waiting")},
     "1/2", "3/3", 3),
    ("admitted by Kueue and running", dict(job=queued(False, ready=2), stateful_set=sts(3, 3)), "Running",
     {"Admitted": ("True", "Admitted"), "Ready": ("True", "AllReady")}, "2/2", "3/3", 3),
    ("suspended outside any queue", dict(job=queued(True, queue=None), stateful_set=sts(3, 3)), "Pending",
     {"TrainersReady": ("False", "Suspended"), "Ready": ("False", "Suspended")}, "0/2", "3/3", 3),
]


@pytest.mark.parametrize(("name", "kwargs", "phase", "expected", "train", "evals", "replicas"), CASES,
                         ids=[c[0] for c in CASES])
def test_status_table(name, kwargs, phase, expected, train, evals, replicas):
    status = compute_status(Observation("g", 4, nodes=2, replicas=3, now="T1", **kwargs))
    assert status["phase"] == phase
    got = conditions(status)
    for type_, value in expected.items():
        assert got[type_] == value, type_
    assert (status["train"]["summary"], status["eval"]["summary"], status["replicas"]) == (train, evals, replicas)
    assert status["selector"] == SELECTOR and status["observedGeneration"] == 4
    assert "training" not in status, "status.training belongs to trainer rank 0"


def test_invalid_names_the_field():
    status = compute_status(Observation("g", 2, problems=["spec.eval.replicas: must be >= 0"], now="T"))
    assert status["phase"] == "Invalid"
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert (valid["status"], valid["reason"]) == ("False", "InvalidSpec")
    assert "spec.eval.replicas" in valid["message"]


def test_transition_time_kept_while_status_unchanged():
    first = compute_status(Observation("g", 1, nodes=1, replicas=1, now="T1"))
    same = compute_status(Observation("g", 1, nodes=1, replicas=1, previous=first["conditions"], now="T2"))
    assert {c["lastTransitionTime"] for c in same["conditions"]} == {"T1"}
    assert not differs({**first, "training": {"iteration": 3}}, same)
    ready = compute_status(Observation("g", 1, nodes=1, replicas=1, job=job(ready=1), stateful_set=sts(1, 1),
                                       previous=first["conditions"], now="T3"))
    times = {c["type"]: c["lastTransitionTime"] for c in ready["conditions"]}
    assert times == {"Valid": "T1", "TrainersReady": "T3", "EvaluatorsReady": "T3", "CheckpointsPersistent": "T1",
                     "Ready": "T3"}
    assert differs(first, ready)


def test_spec_rejected_in_pod_points_to_the_validate_logs():
    status = compute_status(Observation("g", 3, nodes=1, replicas=1, job=REJECTED, now="T"))
    valid = next(c for c in status["conditions"] if c["type"] == "Valid")
    assert "kubectl logs job/g-train -c validate" in valid["message"]
    assert valid["observedGeneration"] == 3


def test_admitted_condition_only_for_a_job_in_a_queue():
    plain = compute_status(Observation("g", 1, nodes=2, replicas=3, job=job(ready=2), stateful_set=sts(3, 3)))
    assert "Admitted" not in conditions(plain)
    waiting = compute_status(Observation("g", 1, nodes=2, replicas=3, job=queued(True), stateful_set=sts(3, 3)))
    assert "rl-trainers" in next(c["message"] for c in waiting["conditions"] if c["type"] == "Admitted")


@pytest.mark.parametrize(("fleet_data", "training", "expected"), [
    (True, {}, None),  # rank 0 has not reported yet
    (True, {"iteration": 3, "envStepsPerSecond": 812.4}, ("True", "Flowing")),
    (True, {"iteration": 3, "waitingForDataSeconds": 12.0}, ("True", "Flowing")),  # an evaluator reconnecting
    (True, {"iteration": 3, "waitingForDataSeconds": 45.0}, ("False", "WaitingForData")),
    (False, {"iteration": 3}, ("True", "TrainersCollect")),
], ids=["not-reported", "flowing", "short-wait", "waiting", "trainers-data"])
def test_data_flowing_follows_what_the_trainer_reports(fleet_data, training, expected):
    observed = Observation("g", 1, nodes=2, replicas=3, job=job(ready=2), stateful_set=sts(3, 2), now="T",
                           fleet_data=fleet_data, training=training)
    status = compute_status(observed)
    got = conditions(status)
    assert got.get("DataFlowing") == expected
    assert got["Ready"] == ("False", "Waiting"), "DataFlowing is not part of Ready"
    if expected == ("False", "WaitingForData"):
        message = next(c["message"] for c in status["conditions"] if c["type"] == "DataFlowing")
        assert "waited 45 s" in message and "2/3 evaluator pods ready" in message
    group = {"status": {**status, "training": training}}
    assert not data_condition_stale(group), "the condition just computed agrees with the report"
    if expected is not None:  # the report changes the other way: a refresh is due
        flipped = {"waitingForDataSeconds": None if expected[0] == "False" else 60.0}
        assert data_condition_stale({"status": {**status, "training": {**training, **flipped}}})
    ended = compute_status(Observation("g", 1, nodes=2, replicas=3, job=job(succeeded=2, conditions=["Complete"]),
                                       stateful_set=sts(3, 3), now="T", fleet_data=fleet_data, training=training))
    assert "DataFlowing" not in conditions(ended)


def test_a_running_group_gets_the_condition_on_the_refresh_after_the_trainers_first_report():
    running = {"phase": "Running", "conditions": [], "training": {"waitingForDataSeconds": 31.0}}
    assert data_condition_stale({"status": running})
    assert data_condition_stale({"status": {**running, "training": {"waitingForDataSeconds": None}}})
    assert not data_condition_stale({"status": {**running, "phase": "Pending"}})
    assert not data_condition_stale({"metadata": {"name": "g"}})  # a strange object: no status at all


def trainer_pod(attempt, phase="Running", deleting=False):
    metadata = {"labels": {contract.LABEL_ROLE: "train", contract.LABEL_ATTEMPT: str(attempt)}}
    if deleting:
        metadata["deletionTimestamp"] = "2026-12-01T10:00:05Z"
    return {"metadata": metadata, "status": {"phase": phase}}


# The seconds around the end of a run and around a restart: (name, observation kwargs, phase, conditions).
ENDING = [
    ("one pod finished, the Job not yet Complete", dict(job=job(ready=1, succeeded=1, attempt=1), attempt=1,
                                                        restarts=RESTARTED),
     "Running", {"TrainersReady": ("True", "Finishing"), "TrainerRestarting": ("False", "TrainingEnded"),
                 "Ready": ("True", "AllReady")}),
    ("pods Succeeded before the Job counts them", dict(job=job(ready=0, attempt=1), attempt=1, restarts=RESTARTED,
                                                       pods=[trainer_pod(1, "Succeeded"), trainer_pod(1)]),
     "Running", {"TrainersReady": ("True", "Finishing"), "TrainerRestarting": ("False", "TrainingEnded")}),
    ("every pod finished, the Job not yet Complete", dict(job=job(succeeded=2, attempt=1), attempt=1,
                                                          restarts=RESTARTED),
     "Running", {"TrainersReady": ("True", "Finishing"), "TrainerRestarting": ("False", "TrainingEnded")}),
    ("the Job Complete", dict(job=job(succeeded=2, conditions=["Complete"], attempt=1), attempt=1,
                              restarts=RESTARTED),
     "Succeeded", {"TrainersReady": ("True", "Completed"), "TrainerRestarting": ("False", "TrainingEnded")}),
    ("a first attempt finishing", dict(job=job(ready=1, succeeded=1)), "Running",
     {"TrainersReady": ("True", "Finishing"), "Ready": ("True", "AllReady")}),
    ("a real restart: the new attempt's pods start", dict(job=job(ready=1, attempt=1), attempt=1, restarts=RESTARTED,
                                                          pods=[trainer_pod(1), trainer_pod(1, "Pending")]),
     "Restarting", {"TrainersReady": ("False", "Restarting"), "TrainerRestarting": ("True", "PodDeleted")}),
    ("the old attempt's pods terminating",
     dict(job=job(ready=0, succeeded=1, attempt=0), attempt=1, restarts=RESTARTED,
          pods=[trainer_pod(0, "Succeeded", deleting=True), trainer_pod(0, deleting=True)]),
     "Restarting", {"TrainersReady": ("False", "Restarting"), "TrainerRestarting": ("True", "PodDeleted")}),
]


@pytest.mark.parametrize(("name", "kwargs", "phase", "expected"), ENDING, ids=[c[0] for c in ENDING])
def test_no_restarting_at_the_end_of_a_good_run(name, kwargs, phase, expected):
    status = compute_status(Observation("g", 1, nodes=2, replicas=3, stateful_set=sts(3, 3), now="T", **kwargs))
    assert status["phase"] == phase
    got = conditions(status)
    assert {type_: got.get(type_) for type_ in expected} == expected
    if "TrainerRestarting" not in expected:
        assert "TrainerRestarting" not in got, "no restart, no condition"


def at(seconds):
    """RFC 3339 time `seconds` after 10:00:00 (as the operator writes it, or the trainer's isoformat)."""
    return f"2026-12-02T10:{seconds // 60:02d}:{seconds % 60:02d}Z"


READY_SINCE_0 = [{"type": "TrainersReady", "status": "True", "reason": "AllReady", "lastTransitionTime": at(0)}]
STALLED_AT_250 = [*READY_SINCE_0, {"type": "TrainingProgressing", "status": "False", "reason": "Stalled",
                                   "lastTransitionTime": at(250)}]


def report(attempt, seconds, iteration=12):
    return {"attempt": attempt, "iteration": iteration, "updatedAt": at(seconds).replace("Z", "+00:00")}


# (name, previous conditions, training, now (s), expected (status, reason), recheck in s, message holds)
PROGRESS = [
    ("pods ready now, rank 0 not reported yet", [], {}, 0, ("True", "Starting"), 246.0, "245 s"),
    ("ready 100 s, not reported yet", READY_SINCE_0, {}, 100, ("True", "Starting"), 146.0, "attempt 1"),
    ("ready 300 s, never reported: no rendezvous", READY_SINCE_0, {}, 300, ("False", "NotStarted"), None,
     "ready since 2026-12-02T10:00:00Z"),
    ("only the previous attempt reported", READY_SINCE_0, report(0, 10), 300, ("False", "NotStarted"), None,
     "g-train-0.g-train resolve"),
    ("rank 0 started, its first report", READY_SINCE_0, report(1, 280, iteration=0), 300, ("True", "Iterating"),
     226.0, "attempt 1"),
    ("iterating", READY_SINCE_0, report(1, 290), 300, ("True", "Iterating"), 236.0, "reports its iterations"),
    ("no report for 250 s: stalled", READY_SINCE_0, report(1, 50), 300, ("False", "Stalled"), None,
     "longer than the bound 245 s"),
    ("a report after the stall: cleared", STALLED_AT_250, report(1, 298), 300, ("True", "Iterating"), 244.0,
     "reports its iterations"),
]


@pytest.mark.parametrize(("name", "previous", "training", "now", "expected", "recheck", "holds"), PROGRESS,
                         ids=[c[0] for c in PROGRESS])
def test_trainers_up_but_not_training(name, previous, training, now, expected, recheck, holds):
    observed = Observation("g", 1, nodes=2, replicas=3, job=job(ready=2, attempt=1), stateful_set=sts(3, 3),
                           attempt=1, restarts=RESTARTED, previous=previous, now=at(now), training=training,
                           stall_seconds=245.0)
    status = compute_status(observed)
    progressing = next(c for c in status["conditions"] if c["type"] == "TrainingProgressing")
    assert (progressing["status"], progressing["reason"]) == expected
    assert holds in progressing["message"]
    assert status["phase"] == "Running" and conditions(status)["Ready"] == ("True", "AllReady"), "not part of Ready"
    assert recheck_seconds(observed, status) == recheck
    group = {"status": {**status, "training": training}}
    assert not progress_condition_stale(group), "the condition just computed agrees with the report"
    again = compute_status(dataclasses.replace(observed, previous=status["conditions"], now=at(now + 1)))
    assert not differs(status, again), "a pass a second later that finds nothing new writes nothing"
    if expected != ("True", "Iterating"):  # rank 0 reports: the next refresh says Iterating
        later = {"status": {**status, "training": report(1, now + 3)}}
        assert progress_condition_stale(later)


def test_progress_only_while_every_trainer_is_up():
    for kwargs in (dict(job=job(ready=1)), dict(job=job(ready=1, succeeded=1)),
                   dict(job=job(succeeded=2, conditions=["Complete"]))):
        status = compute_status(Observation("g", 1, nodes=2, replicas=3, stateful_set=sts(3, 3), now=at(300),
                                            previous=READY_SINCE_0, stall_seconds=245.0, **kwargs))
        assert "TrainingProgressing" not in conditions(status)


def test_every_trainer_state_has_a_phase_and_a_trainers_ready():
    from rlightning_operator._status import PHASES, TRAINERS_READY, TrainerState

    assert set(PHASES) == set(TRAINERS_READY) == set(TrainerState)


def test_a_rolling_update_is_rechecked_until_it_is_reported_stuck():
    rolling = {"status": {"replicas": 3, "readyReplicas": 2, "currentRevision": "a", "updateRevision": "b"}}
    observed = Observation("g", 1, nodes=2, replicas=3, job=job(ready=2), stateful_set=rolling, now=at(10))
    assert recheck_seconds(observed, compute_status(observed)) == ROLLOUT_RECHECK_SECONDS
    stuck = {"conditions": [{"type": "EvaluatorsReady", "status": "False", "reason": "RolloutStuck"}]}
    assert recheck_seconds(observed, stuck) is None, "reported: the pod's own events bring the next change"
    rolled = {"status": {**rolling["status"], "currentRevision": "b"}}
    done = Observation("g", 1, nodes=2, replicas=3, job=job(ready=2), stateful_set=rolled, now=at(10))
    assert recheck_seconds(done, compute_status(done)) is None
