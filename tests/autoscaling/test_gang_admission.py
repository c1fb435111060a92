"""Gang admission through Kueue's protocol, on the control plane without Kueue: the test does what Kueue does.

examples/autoscaling/policygroup-queued.yaml as it is: the PolicyGroup's `kueue.x-k8s.io/queue-name` label reaches
the trainer Job, which the operator creates suspended, so no trainer pod exists until admission; status says
Queued (phase Pending, Admitted=False) and never reports it as stuck. Un-suspending the Job (Kueue's admission)
starts every trainer pod at once; suspending it again (Kueue's preemption) removes them all, and the operator
neither recreates nor re-suspends the Job on its own. Kueue itself: docs/autoscaling.md says whether it builds.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlightning import contract
from tests.operator.operator_cluster import apply, condition, get_json, pods, running, wait_for

pytestmark = pytest.mark.autoscaling
EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "autoscaling" / "policygroup-queued.yaml"
GROUP = "cartpole-queued"


def _group(cluster, namespace):
    return get_json(cluster, "pg", GROUP, "-n", namespace)


def _with_reason(cluster, namespace, reason):
    group = _group(cluster, namespace)
    return group if condition(group, "Ready").get("reason") == reason else None


def _suspend(cluster, namespace, suspend: bool) -> None:
    cluster.kubectl("patch", "job", f"{GROUP}-train", "-n", namespace, "--type=merge",
                    "-p", f'{{"spec":{{"suspend":{str(suspend).lower()}}}}}')


def test_a_queued_trainer_gang_starts_only_when_admitted_and_all_at_once(autoscaling_crd, namespace,
                                                                         autoscaling_operator):
    cluster = autoscaling_crd
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
