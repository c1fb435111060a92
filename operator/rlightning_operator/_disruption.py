"""Node disruption notices and the reason of a gang restart (pure: no I/O, no clock).

A node that is about to go carries a notice before its pods get SIGTERM: Karpenter taints a node it disrupts
(`karpenter.sh/disrupted:NoSchedule`), the cluster autoscaler one it deletes (`ToBeDeletedByClusterAutoscaler`),
cloud termination handlers taint it (AWS node termination handler, GKE) or cordon and drain it (`kubectl drain`
cordons first: `spec.unschedulable`). `notice` reads one node; `restart_reason` names why the trainer gang
restarted, from the loss of its pod (`_pods.trainer_loss`) and the notice its node carried then.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping
from typing import Any

from rlightning_operator import _pods as pods

PREEMPTED = "Preempted"
"""A trainer pod lost while its node carried a disruption notice (`notice`), or preempted by the scheduler."""
NODE_LOST = "NodeLost"
"""A trainer pod lost with its node: the taint manager deleted it (node unreachable) or the pod garbage collector
(node object gone)."""
EVICTED = "Evicted"
"""A trainer pod evicted (the eviction API, or the kubelet under node pressure or at its shutdown) from a node that
carried no notice."""
FAILED = "Failed"
"""A trainer container exited non-zero, or the Job failed."""
POD_DELETED = pods.POD_DELETED
"""A trainer pod deleted (`kubectl delete pod`, a controller), with no disruption condition and no notice."""
RESTART_REASONS = (PREEMPTED, NODE_LOST, EVICTED, FAILED, POD_DELETED)
"""Every value of status.restarts.reason, the keys of status.restarts.byReason and of the operator's
`rlightning_operator_gang_restarts_total{reason}`."""

DISRUPTION_TAINTS: Mapping[str, str] = {
    "karpenter.sh/disrupted": "Karpenter disrupts the node",
    "ToBeDeletedByClusterAutoscaler": "the cluster autoscaler deletes the node",
    "cloud.google.com/impending-node-termination": "GKE terminates the node",
    "aws-node-termination-handler/spot-itn": "AWS reclaims the spot instance",
    "aws-node-termination-handler/asg-lifecycle-termination": "the AWS Auto Scaling group terminates the node",
    "aws-node-termination-handler/scheduled-maintenance": "AWS maintenance stops the node",
}
"""Taint keys that announce a node's end, and who puts them: Karpenter docs, "Disruption" (termination controller);
cluster autoscaler FAQ, "How does scale-down work?"; GKE docs, "Graceful node termination" of Spot VMs; the AWS node
termination handler's README (its taints in queue-processor and IMDS modes)."""
CORDONED = "node.kubernetes.io/unschedulable"
"""The taint the node lifecycle controller mirrors `spec.unschedulable` to: a node cordoned (`kubectl cordon`, the
first step of `kubectl drain` and of most termination handlers)."""
NOTICE_SLACK_SECONDS = 10.0
"""How long after a pod's loss a notice of its node still counts as its cause: the loss's time comes from the API
server's whole-second timestamps, the notice's from when the operator's watch delivered it (a drain's first
eviction can come within the second of its cordon)."""


@dataclasses.dataclass(frozen=True)
class Notice:
    """A node marked for disruption.

    Attributes:
        node (str): The node's name.
        taint (str): The taint key that marks it (`DISRUPTION_TAINTS`, or `CORDONED`).
        detail (str): For people: who marks it and what comes next.
        since (float): Unix seconds: the taint's `timeAdded` when set (NoExecute taints only), else when the
            operator first saw the notice.
    """

    node: str
    taint: str
    detail: str
    since: float


def notice(node: Mapping[str, Any], seen_at: float) -> Notice | None:
    """The disruption notice `node` carries: a taint of `DISRUPTION_TAINTS` (whatever its effect), else a cordon.

    Args:
        node (Mapping[str, Any]): A Node as watched.
        seen_at (float): Unix seconds the notice was first seen (for taints without `timeAdded`).

    Returns:
        Notice | None: The notice; None for a node that carries none.

    Examples:
        >>> notice({"metadata": {"name": "n1"}, "spec": {"taints": [
        ...     {"key": "karpenter.sh/disrupted", "effect": "NoSchedule"}]}}, 100.0).taint
        'karpenter.sh/disrupted'
    """
    name = str((node.get("metadata") or {}).get("name") or "")
    spec = node.get("spec") or {}
    taints = spec.get("taints") or []
    for taint in sorted(taints, key=lambda t: str(t.get("key"))):
        key = str(taint.get("key") or "")
        if key in DISRUPTION_TAINTS:
            return Notice(name, key, f"node {name}: {DISRUPTION_TAINTS[key]} (taint {key})",
                          _added(taint, seen_at))
    cordon = next((t for t in taints if t.get("key") == CORDONED), None)
    if spec.get("unschedulable") or cordon is not None:
        return Notice(name, CORDONED, f"node {name} is cordoned (drained next)", _added(cordon or {}, seen_at))
    return None


def _added(taint: Mapping[str, Any], seen_at: float) -> float:
    added = taint.get("timeAdded")
    if not added:
        return seen_at
    return datetime.datetime.fromisoformat(str(added).replace("Z", "+00:00")).timestamp()


_DISRUPTION_REASONS = {
    pods.TAINT_MANAGER: NODE_LOST,
    "DeletionByPodGC": NODE_LOST,
    "PreemptionByScheduler": PREEMPTED,
    "EvictionByEvictionAPI": EVICTED,
    "TerminationByKubelet": EVICTED,
}
"""DisruptionTarget reasons (`_pods.DISRUPTION_TARGET`) by restart reason, for a node that carried no notice."""


def restart_reason(loss: pods.TrainerLoss, node_notice: Notice | None) -> str:
    """Why the trainer gang restarts, one of `RESTART_REASONS`.

    A disruption of a pod whose node carried a notice no later than `NOTICE_SLACK_SECONDS` after the loss is
    `PREEMPTED`, whatever removed the pod (a drain's eviction, the kubelet's shutdown, a deletion); otherwise the
    pod's DisruptionTarget reason decides (`PREEMPTED` for the scheduler's preemption, `NODE_LOST`, `EVICTED`), a
    deletion without one is `POD_DELETED`, and a failure `FAILED`.

    Args:
        loss (pods.TrainerLoss): What ended the attempt.
        node_notice (Notice | None): The notice the lost pod's node carried, if any.

    Returns:
        str: The reason.
    """
    if loss.cause != "disruption":
        return FAILED
    if node_notice is not None and (not loss.since or node_notice.since <= loss.since + NOTICE_SLACK_SECONDS):
        return PREEMPTED
    return _DISRUPTION_REASONS.get(loss.reason, POD_DELETED if loss.reason == pods.POD_DELETED else EVICTED)


CHECKPOINT_GRACE = "CheckpointWithinGracePeriod"
"""Condition type: whether the trainers' last checkpoint took less than their pods' grace period."""
CHECKPOINT_SLOWER_THAN_GRACE = "CheckpointSlowerThanGracePeriod"
"""Its reason when not: a SIGTERM (a drain, a preemption) kills the trainer before its final checkpoint is written."""


def checkpoint_grace(training: Mapping[str, Any], grace_seconds: int) -> tuple[bool, str, str] | None:
    """Whether the last checkpoint trainer rank 0 reported (status.training.lastCheckpoint) fits the trainer pods'
    `terminationGracePeriodSeconds`: on SIGTERM a trainer finishes its iteration, then checkpoints, within it.

    Args:
        training (Mapping[str, Any]): status.training as rank 0 wrote it.
        grace_seconds (int): The trainer pods' terminationGracePeriodSeconds (`rlightning.launch.grace_seconds`).

    Returns:
        tuple[bool, str, str] | None: (fits, reason, message) of condition `CHECKPOINT_GRACE`; None before a
            checkpoint was reported.
    """
    last = training.get("lastCheckpoint") or {}
    seconds = last.get("seconds")
    if not isinstance(seconds, (int, float)):
        return None
    took = f"the last checkpoint (iteration {last.get('iteration', 0)}) took {seconds:.1f} s"
    if seconds < grace_seconds:
        return True, "WithinGracePeriod", f"{took}, within the trainer pods' grace period of {grace_seconds} s"
    return False, CHECKPOINT_SLOWER_THAN_GRACE, (
        f"{took}, not less than the trainer pods' grace period of {grace_seconds} s: a trainer stopped by SIGTERM (a "
        "drain, a preemption) is killed before its final checkpoint is written and its run goes back to the one "
        "before; raise spec.weightSync.timeoutSeconds (the grace period is its drain time plus a margin) or make "
        "checkpoints faster")
