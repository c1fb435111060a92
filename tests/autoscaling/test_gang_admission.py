"""Gang admission of the trainers: by a real Kueue, and through Kueue's protocol step by step.

examples/autoscaling/policygroup-queued.yaml as it is: the PolicyGroup's `kueue.x-k8s.io/queue-name` label reaches
the trainer Job, which the operator creates suspended, so no trainer pod exists until admission; status says
Queued (phase Pending, Admitted=False) and never reports it as stuck.

With Kueue v0.17 (the `kueue` fixture) and the queues of examples/autoscaling/kueue.yaml as they are: a gang larger
than the queue's quota gets no trainer pod at all, although the quota would hold some of them, and a gang that fits
is admitted whole meanwhile. Without Kueue, the test does what Kueue does (un-suspends, suspends again), which
also covers preemption: every trainer pod goes, and the operator neither recreates nor re-suspends the Job.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rlightning import contract
from tests.operator.operator_cluster import apply, condition, get_json, items, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "autoscaling"
EXAMPLE = EXAMPLES / "policygroup-queued.yaml"
QUEUES = EXAMPLES / "kueue.yaml"
GROUP = "cartpole-queued"
WIDE = "cartpole-queued-wide"


def _with_reason(cluster, namespace, reason, name=GROUP):
    group = get_json(cluster, "pg", name, "-n", namespace)
    return group if condition(group, "Ready").get("reason") == reason else None


def _suspend(cluster, namespace, suspend: bool) -> None:
    cluster.kubectl("patch", "job", f"{GROUP}-train", "-n", namespace, "--type=merge",
                    "-p", f'{{"spec":{{"suspend":{str(suspend).lower()}}}}}')


def test_a_queued_trainer_gang_has_no_pod_until_admitted_and_its_preemption_is_kept(crd, namespace, operator):
    # Kueue's steps done by hand: this test cannot tell a whole gang from pods started one by one (the Job
    # controller starts them); test_kueue_admits_a_trainer_gang_whole_or_not_at_all checks that with a real Kueue.
    cluster = crd
    apply(cluster, namespace, yaml.safe_load(EXAMPLE.read_text()))
    group = wait_for("the group to be Queued", lambda: _with_reason(cluster, namespace, "Queued"))
    assert group["status"]["phase"] == "Pending"
    assert (condition(group, "Admitted")["status"], condition(group, "Admitted")["reason"]) == ("False", "Queued")
    assert "rl-trainers" in condition(group, "TrainersReady")["message"]
    job = get_json(cluster, "job", f"{GROUP}-train", "-n", namespace)
    assert job["spec"]["suspend"] is True
    assert job["metadata"]["labels"][contract.LABEL_KUEUE_QUEUE] == "rl-trainers"
    # The evaluators are not gated (only the trainers are a gang); no trainer pod exists before admission.
    wait_for("2 evaluators Running", lambda: running(pods(cluster, namespace, "eval")) == 2)
    assert pods(cluster, namespace, "train") == []
    assert _with_reason(cluster, namespace, "Queued"), "waiting for admission is not reported as stuck"

    _suspend(cluster, namespace, False)  # Kueue admits the whole workload: its quota holds both pods
    wait_for("both trainer pods Running", lambda: running(pods(cluster, namespace, "train")) == 2)
    group = wait_for("the group to be Ready", lambda: _with_reason(cluster, namespace, "AllReady"))
    assert (group["status"]["phase"], condition(group, "Admitted")["status"]) == ("Running", "True")

    _suspend(cluster, namespace, True)  # Kueue preempts the workload: every trainer pod goes
    wait_for("no trainer pod", lambda: pods(cluster, namespace, "train") == [])
    wait_for("the group to be Queued again", lambda: _with_reason(cluster, namespace, "Queued"))
    again = get_json(cluster, "job", f"{GROUP}-train", "-n", namespace)
    assert again["metadata"]["uid"] == job["metadata"]["uid"], "the operator kept the Job Kueue suspended"
    assert again["spec"]["suspend"] is True


def _trainers(cluster, namespace, group):
    return [p for p in pods(cluster, namespace, "train") if p["metadata"]["labels"].get(contract.LABEL_GROUP) == group]


def _workload(cluster, namespace, group):
    """The Kueue Workload of a group's trainer Job (Kueue creates one per Job, owned by it), or None."""
    for workload in items(cluster, "workloads.kueue.x-k8s.io", "-n", namespace):
        owners = workload["metadata"].get("ownerReferences") or []
        if any(owner["kind"] == "Job" and owner["name"] == f"{group}-train" for owner in owners):
            return workload
    return None


def _refused_for_quota(cluster, namespace, group):
    workload = _workload(cluster, namespace, group)
    reserved = condition(workload or {}, "QuotaReserved")
    refused = reserved.get("status") == "False" and "insufficient quota" in reserved.get("message", "")
    return workload if refused else None


def test_kueue_admits_a_trainer_gang_whole_or_not_at_all(kueue, crd, namespace, operator):
    cluster = crd
    for document in yaml.safe_load_all(QUEUES.read_text()):
        apply(cluster, namespace, document)
    fits = yaml.safe_load(EXAMPLE.read_text())  # 2 trainers of 2 CPUs: the queue's whole quota (4 CPUs)
    wide = copy.deepcopy(fits)
    wide["metadata"]["name"] = WIDE
    wide["spec"]["train"]["nodes"] = 3  # 6 CPUs: 2 of its 3 pods would fit the quota, the gang does not

    apply(cluster, namespace, wide)
    workload = wait_for("Kueue to refuse the wide gang for quota", lambda: _refused_for_quota(cluster, namespace, WIDE))
    assert workload["spec"]["podSets"][0]["count"] == 3, "one Workload for the whole gang"
    wide_group = wait_for("the wide group to be Queued", lambda: _with_reason(cluster, namespace, "Queued", WIDE))
    assert condition(wide_group, "Admitted")["status"] == "False"

    apply(cluster, namespace, fits)  # BestEffortFIFO: a gang that fits passes the one that does not
    wait_for("the fitting gang Running", lambda: running(_trainers(cluster, namespace, GROUP)) == 2)
    group = wait_for("the fitting group to be Ready", lambda: _with_reason(cluster, namespace, "AllReady"))
    assert condition(group, "Admitted")["status"] == "True"
    admitted = _workload(cluster, namespace, GROUP)
    assert condition(admitted, "Admitted")["status"] == "True"
    assert admitted["status"]["admission"]["podSetAssignments"][0]["count"] == 2
    assert _trainers(cluster, namespace, WIDE) == [], "no part of the wide gang started"
    assert get_json(cluster, "job", f"{WIDE}-train", "-n", namespace)["spec"]["suspend"] is True

    # Workloads carry Kueue's finalizer: delete the groups while Kueue runs, so that the namespace can go.
    cluster.kubectl("delete", "pg", GROUP, WIDE, "-n", namespace)
    wait_for("Kueue to release the Workloads",
             lambda: items(cluster, "workloads.kueue.x-k8s.io", "-n", namespace) == [])
