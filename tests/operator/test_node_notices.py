"""Node disruption notices and the reason of a gang restart, by table (`_disruption`), and which notices the
operator keeps and acts on (`_notices`: only nodes that trainer pods run on, each new notice once)."""

from __future__ import annotations

import pytest

from rlightning import contract
from rlightning_operator import Observation, compute_status
from rlightning_operator import _disruption as disruption
from rlightning_operator import _notices
from rlightning_operator._notices import NodeNotices
from rlightning_operator._pods import TrainerLoss

T = 1_000.0


def node(name="n1", taints=(), unschedulable=False) -> dict:
    return {"metadata": {"name": name}, "spec": {"taints": list(taints), "unschedulable": unschedulable}}


def taint(key, effect="NoSchedule", added=None) -> dict:
    return {"key": key, "effect": effect, **({"timeAdded": added} if added else {})}


# (name, node, expected (taint, since) or None)
NOTICES = [
    ("no taint", node(), None),
    ("another taint", node(taints=[taint("nvidia.com/gpu")]), None),
    ("Karpenter", node(taints=[taint("karpenter.sh/disrupted")]), ("karpenter.sh/disrupted", T)),
    ("cluster autoscaler", node(taints=[taint("ToBeDeletedByClusterAutoscaler", "NoSchedule")]),
     ("ToBeDeletedByClusterAutoscaler", T)),
    ("GKE, with its time", node(taints=[taint("cloud.google.com/impending-node-termination", "NoExecute",
                                               "1970-01-01T00:10:00Z")]),
     ("cloud.google.com/impending-node-termination", 600.0)),
    ("AWS spot interruption", node(taints=[taint("aws-node-termination-handler/spot-itn")]),
     ("aws-node-termination-handler/spot-itn", T)),
    ("cordoned (spec)", node(unschedulable=True), (disruption.CORDONED, T)),
    ("cordoned (its taint)", node(taints=[taint(disruption.CORDONED)]), (disruption.CORDONED, T)),
    ("a disruption taint wins over a cordon", node(taints=[taint("karpenter.sh/disrupted")], unschedulable=True),
     ("karpenter.sh/disrupted", T)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "found", "expected"), NOTICES, ids=[c[0] for c in NOTICES])
def test_notice_table(name, found, expected):
    result = disruption.notice(found, T)
    assert (None if result is None else (result.taint, result.since)) == expected
    if result is not None:
        assert result.node == "n1" and "n1" in result.detail


def loss(cause="disruption", reason="PodDeleted", since=T) -> TrainerLoss:
    return TrainerLoss(cause, reason, "g-train-0-a", "m", since)


NOTICE = disruption.Notice("n1", "karpenter.sh/disrupted", "d", T - 30)
# (name, loss, notice, expected reason)
REASONS = [
    ("deleted, no notice", loss(), None, "PodDeleted"),
    ("deleted on a noticed node", loss(), NOTICE, "Preempted"),
    ("drained (evicted) on a noticed node", loss(reason="EvictionByEvictionAPI"), NOTICE, "Preempted"),
    ("kubelet's shutdown on a noticed node", loss(reason="TerminationByKubelet"), NOTICE, "Preempted"),
    ("evicted, no notice", loss(reason="EvictionByEvictionAPI"), None, "Evicted"),
    ("node pressure, no notice", loss(reason="TerminationByKubelet"), None, "Evicted"),
    ("scheduler's preemption", loss(reason="PreemptionByScheduler"), None, "Preempted"),
    ("node unreachable", loss(reason="DeletionByTaintManager"), None, "NodeLost"),
    ("node object gone", loss(reason="DeletionByPodGC"), None, "NodeLost"),
    ("a failure on a noticed node is a failure", loss("failure", "PodFailed"), NOTICE, "Failed"),
    ("the Job failed", loss("failure", "JobFailed", 0.0), None, "Failed"),
    ("a notice within the slack after the loss counts", loss(since=T - 30 - disruption.NOTICE_SLACK_SECONDS), NOTICE,
     "Preempted"),
    ("a notice well after the loss does not", loss(since=T - 31 - disruption.NOTICE_SLACK_SECONDS), NOTICE,
     "PodDeleted"),
    ("a loss of unknown time on a noticed node", loss(since=0.0), NOTICE, "Preempted"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "lost", "found", "expected"), REASONS, ids=[c[0] for c in REASONS])
def test_restart_reason_table(name, lost, found, expected):
    assert disruption.restart_reason(lost, found) == expected
    assert expected in disruption.RESTART_REASONS


def trainer(name, node_name, group="g", namespace="ns", role="train") -> dict:
    labels = {contract.LABEL_GROUP: group, contract.LABEL_ROLE: role}
    return {"metadata": {"name": name, "namespace": namespace, "labels": labels}, "spec": {"nodeName": node_name}}


def test_only_nodes_that_trainers_run_on_are_kept_and_each_new_notice_is_asked_once():
    notices = NodeNotices()
    notices.note_pod(trainer("g-train-0", "n1"), False, T)
    notices.note_pod(trainer("h-train-0", "n1", group="h"), False, T)
    notices.note_pod(trainer("g-eval-0", "n2", role="eval"), False, T)
    marked = [taint("karpenter.sh/disrupted")]
    assert notices.note_node(node("n2", marked), False, T) == []  # an evaluator's node
    assert notices.notice_for("n2") is None
    asks = notices.note_node(node("n1", marked), False, T)
    assert [(a.namespace, a.group, a.notice.taint) for a in asks] == [("ns", "g", "karpenter.sh/disrupted"),
                                                                       ("ns", "h", "karpenter.sh/disrupted")]
    assert notices.note_node(node("n1", marked), False, T + 1) == []  # the same notice: asked once
    assert notices.note_node(node("n1", marked, unschedulable=True), False, T + 2) == []
    # the drain: the pods and the node go; the notice stays for the restart's reason
    notices.note_pod(trainer("g-train-0", "n1"), True, T + 3)
    notices.note_node(node("n1", marked), True, T + 4)
    assert notices.notice_for("n1").taint == "karpenter.sh/disrupted"


def test_a_notice_withdrawn_is_forgotten_and_a_new_one_asked_again():
    notices = NodeNotices()
    notices.note_pod(trainer("g-train-0", "n1"), False, T)
    assert len(notices.note_node(node("n1", unschedulable=True), False, T)) == 1
    assert notices.note_node(node("n1"), False, T + 1) == []  # uncordoned
    assert notices.notice_for("n1") is None
    assert len(notices.note_node(node("n1", [taint("ToBeDeletedByClusterAutoscaler")]), False, T + 2)) == 1


def test_notices_of_nodes_without_trainers_go_after_keep_seconds():
    notices = NodeNotices()
    notices.note_pod(trainer("g-train-0", "n1"), False, T)
    notices.note_node(node("n1", unschedulable=True), False, T)
    notices.note_pod(trainer("g-train-0", "n1"), True, T + 1)
    notices.note_node(node("n9"), False, T + 1 + _notices.KEEP_SECONDS - 1)
    assert notices.notice_for("n1") is not None
    notices.note_node(node("n9"), False, T + 2 + _notices.KEEP_SECONDS)
    assert notices.notice_for("n1") is None


# (name, status.training, grace seconds, expected (fits, reason) or None)
GRACE = [
    ("no checkpoint reported", {}, 45, None),
    ("well within", {"lastCheckpoint": {"iteration": 3, "seconds": 0.4}}, 45, (True, "WithinGracePeriod")),
    ("as long as the grace period", {"lastCheckpoint": {"iteration": 3, "seconds": 45.0}}, 45,
     (False, disruption.CHECKPOINT_SLOWER_THAN_GRACE)),
    ("longer", {"lastCheckpoint": {"iteration": 3, "seconds": 80.2}}, 45,
     (False, disruption.CHECKPOINT_SLOWER_THAN_GRACE)),
]  # fmt: skip


@pytest.mark.parametrize(("name", "training", "grace", "expected"), GRACE, ids=[c[0] for c in GRACE])
def test_checkpoint_grace_table(name, training, grace, expected):
    found = disruption.checkpoint_grace(training, grace)
    assert (None if found is None else found[:2]) == expected
    if found is not None:
        assert f"{grace} s" in found[2] and "iteration 3" in found[2]


def test_the_status_warns_of_a_checkpoint_slower_than_the_grace_period():
    job = {"kind": "Job", "metadata": {"name": "g-train", "labels": {contract.LABEL_ATTEMPT: "0"}},
           "status": {"ready": 1}}
    base = {"nodes": 1, "job": job, "now": "2026-12-01T10:00:00Z", "grace_seconds": 45}
    slow = {"lastCheckpoint": {"iteration": 7, "seconds": 50.0}}
    conditions = {c["type"]: c for c in compute_status(Observation("g", 1, training=slow, **base))["conditions"]}
    assert conditions[disruption.CHECKPOINT_GRACE]["status"] == "False"
    assert conditions[disruption.CHECKPOINT_GRACE]["reason"] == disruption.CHECKPOINT_SLOWER_THAN_GRACE
    assert conditions["Ready"]["reason"] != disruption.CHECKPOINT_SLOWER_THAN_GRACE, "a warning, not part of Ready"
    quiet = compute_status(Observation("g", 1, training={}, **base))["conditions"]
    assert disruption.CHECKPOINT_GRACE not in {c["type"] for c in quiet}
