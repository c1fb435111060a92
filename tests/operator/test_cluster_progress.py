"""Trainers up but not training, on the real control plane: kwok runs trainer pods that never report, so
TrainingProgressing turns False (NotStarted) once the bound passes with no event at all (the refresher's recheck),
and a report of the current attempt in status.training (as trainer rank 0 patches it) clears it at once."""

from __future__ import annotations

import datetime
import json

from operator_cluster import apply, condition, get_json, items, small, wait_for

# 3 x ceil(0.5) + 60 + 5 s (`launch.stall_seconds`): the shortest bound a spec can give
STALL_SECONDS = 68.0


def progressing(cluster, namespace, status):
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    return group if condition(group, "TrainingProgressing").get("status") == status else None


def test_trainers_that_never_report_are_not_started_until_rank_0_reports(crd, namespace, operator):
    apply(crd, namespace, small(replicas=1, **{"spec.weightSync.timeoutSeconds": 0.5}))
    group = wait_for("trainers up: Starting", lambda: progressing(crd, namespace, "True"))
    assert condition(group, "TrainingProgressing")["reason"] == "Starting"
    group = wait_for("NotStarted once the bound passed", lambda: progressing(crd, namespace, "False"),
                     timeout=STALL_SECONDS + 30)
    stalled = condition(group, "TrainingProgressing")
    assert stalled["reason"] == "NotStarted" and "cartpole-train-0.cartpole-train" in stalled["message"]
    assert group["status"]["phase"] == "Running", "the pods run; the condition says no training does"
    assert wait_for("a NotStarted Warning", lambda: [e for e in items(crd, "events", "-n", namespace)
                                                     if e["reason"] == "NotStarted" and e["type"] == "Warning"])
    now = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    report = {"status": {"training": {"attempt": 0, "iteration": 0, "updatedAt": now}}}
    crd.kubectl("patch", "pg", "cartpole", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps(report))
    group = wait_for("rank 0's report clears it", lambda: progressing(crd, namespace, "True"), timeout=30)
    assert condition(group, "TrainingProgressing")["reason"] == "Iterating"
