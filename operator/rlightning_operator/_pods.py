"""What the pods of a PolicyGroup are doing, read from the status the kubelet and the scheduler write (pure).

- A crash loop: a container waiting in `CrashLoopBackOff`, or restarted after a non-zero exit and not ready;
  for trainers (restartPolicy Never: the Job replaces a failed pod with a new one) a failed pod, with the Job's
  count of failed pods as the restarts.
- Unschedulable: condition `PodScheduled=False` with reason `Unschedulable`, and the scheduler's message.
- A stuck rollout of the evaluators: the StatefulSet updates pods one at a time and waits for each to be ready,
  so one pod of the new revision that crash-loops, cannot be scheduled, or stays unready longer than
  `ROLLOUT_PROGRESS_DEADLINE_SECONDS` stops the rollout there.

- A trainer lost (`trainer_loss`): a pod of the gang's current attempt that failed (a container exited non-zero),
  or that was disrupted (condition `DisruptionTarget`: preempted, evicted, its node tainted or gone) or deleted.
  The operator restarts the whole gang as a new attempt on either (`_planner.plan_restart`).
- Stranded on an unreachable node (`stranded`): a pod the taint manager deleted, which no kubelet may be there to
  end (`_planner.plan_force_deletes` says which the operator force-deletes, without waiting for its grace period);
  `unreachable_nodes` names their nodes for the Event and the conditions.

Each message ends with what the failed container said (`said`: its termination message, which for a trainer is the
first failing rank's own exception, `rlightning.runtime._errors`).

The operator keeps no list of pods: the pod watch feeds the reconciler `trim`med pods, and only those whose state
a check here may read (`settled` tells which it may drop), so memory grows with the pods not ready, not with all.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rlightning import contract

CRASH_LOOP = "CrashLoopBackOff"
UNSCHEDULABLE = "Unschedulable"
ROLLOUT_STUCK = "RolloutStuck"
REASONS = (CRASH_LOOP, UNSCHEDULABLE, ROLLOUT_STUCK)
"""Condition reasons this module gives; a change to one of them is posted as a Warning Event."""
REVISION_LABEL = "controller-revision-hash"
"""Label the StatefulSet controller puts on each pod: the revision it was made from."""
_FORCED_ROLLBACK = "after fixing the spec, delete pod {pod}: a StatefulSet does not replace it by itself"
"""Kubernetes docs, StatefulSets, "Forced rollback": a pod stuck on a broken revision stays until deleted."""
MESSAGE_CHARS = 1024
"""The most of a container's termination message (on one line) a condition shows: the exception and where it was
raised fit; a whole traceback does not belong in a condition (`kubectl logs` has it)."""
ROLLOUT_PROGRESS_DEADLINE_SECONDS = 600.0
"""How long a pod of a new revision may stay unready before the rollout counts as stuck: the default
`progressDeadlineSeconds` of a Deployment (StatefulSets have no such field)."""


@dataclasses.dataclass(frozen=True)
class PodProblem:
    """A problem to report in a condition and a Warning Event.

    Attributes:
        reason (str): One of `REASONS`.
        message (str): For people: the pod, the container, the exit code and restarts, or the scheduler's words.
        pod (str): The pod's name.
    """

    reason: str
    message: str
    pod: str


_METADATA_KEPT = (
    "name", "namespace", "uid", "labels", "creationTimestamp", "deletionTimestamp", "deletionGracePeriodSeconds"
)
_CONTAINER_KEPT = ("name", "ready", "restartCount", "state", "lastState")


def trim(pod: Mapping[str, Any]) -> dict[str, Any]:
    """The part of a pod that this module, `_status` and the planner read: names, labels (role, attempt, revision),
    times, its node, phase, conditions and container states; the rest of the spec, annotations and managed fields
    go.

    Args:
        pod (Mapping[str, Any]): A pod as watched.

    Returns:
        dict[str, Any]: A new dict with `kind`, `metadata`, `status` and, once scheduled, `spec.nodeName` only.
    """
    metadata = pod.get("metadata") or {}
    status = pod.get("status") or {}
    kept_status: dict[str, Any] = {key: status[key] for key in ("phase", "reason", "conditions") if key in status}
    for key in ("initContainerStatuses", "containerStatuses"):
        if key in status:
            kept_status[key] = [{k: c[k] for k in _CONTAINER_KEPT if k in c} for c in status[key] or []]
    node = (pod.get("spec") or {}).get("nodeName")
    return {"kind": "Pod", "metadata": {key: metadata[key] for key in _METADATA_KEPT if key in metadata},
            "status": kept_status, **({"spec": {"nodeName": node}} if node else {})}


def settled(pod: Mapping[str, Any]) -> bool:
    """Whether no check of this module can find a problem in `pod` as it is: Running, Ready, every container ready,
    not being deleted. A settled evaluator pod need not be kept (its StatefulSet counts it ready).

    Args:
        pod (Mapping[str, Any]): A pod as watched.

    Returns:
        bool: True for a pod that is serving.
    """
    status = pod.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return (status.get("phase") == "Running" and ready and not (pod.get("metadata") or {}).get("deletionTimestamp")
            and all(c.get("ready") for c in status.get("containerStatuses") or []))


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _exit(terminated: Mapping[str, Any]) -> str:
    detail = f"exit code {terminated.get('exitCode')}"
    return detail + (f" ({terminated['reason']})" if terminated.get("reason") else "")


def said(terminated: Mapping[str, Any]) -> str:
    """What a terminated container said (its termination message: a trainer's failing rank's own exception, or
    the log's tail), on one line, at most `MESSAGE_CHARS` characters, as `: <message>`; "" when it said nothing.

    Args:
        terminated (Mapping[str, Any]): `state.terminated` or `lastState.terminated` of a container status.

    Returns:
        str: The suffix for a condition's message.
    """
    message = " ".join(str(terminated.get("message") or "").split())
    if len(message) > MESSAGE_CHARS:
        message = message[: MESSAGE_CHARS - 3] + "..."
    return f": {message}" if message else ""


def _crash_loop(pod: Mapping[str, Any]) -> PodProblem | None:
    for container in _statuses(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        restarts = int(container.get("restartCount") or 0)
        crashed = restarts > 0 and last.get("exitCode") not in (None, 0) and not container.get("ready")
        if waiting.get("reason") == CRASH_LOOP or crashed:
            last_exit = _exit(last) if last else "no exit code recorded"
            return PodProblem(CRASH_LOOP, f"pod {_name(pod)}: container {container.get('name')} is crash-looping: "
                                          f"last {last_exit}, {restarts} restarts{said(last)}", _name(pod))
    return None


def _failed(pod: Mapping[str, Any], failures: int) -> PodProblem | None:
    if (pod.get("status") or {}).get("phase") != "Failed":
        return None
    for container in _statuses(pod):
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") not in (None, 0):
            return PodProblem(CRASH_LOOP, f"pod {_name(pod)}: container {container.get('name')} failed with "
                                          f"{_exit(terminated)}; {failures} failed pods so far{said(terminated)}",
                              _name(pod))
    return None


def _unschedulable(pod: Mapping[str, Any]) -> PodProblem | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if (condition.get("type"), condition.get("status"), condition.get("reason")) == (
            "PodScheduled", "False", UNSCHEDULABLE
        ):
            return PodProblem(UNSCHEDULABLE, f"pod {_name(pod)}: {condition.get('message') or 'unschedulable'}",
                              _name(pod))
    return None


def _newest_first(pods: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """Newest pod first (RFC 3339 UTC times sort as strings), then by name, for a deterministic choice."""
    by_name = sorted(pods, key=_name)
    return sorted(by_name, key=lambda p: str((p.get("metadata") or {}).get("creationTimestamp") or ""), reverse=True)


def diagnose(pods: Sequence[Mapping[str, Any]], failures: int = 0) -> PodProblem | None:
    """The first problem among `pods`: a crash loop (or failed pod), else an unschedulable pod.

    Args:
        pods (Sequence[Mapping[str, Any]]): Pods of one role, as read.
        failures (int, optional): Failed pods counted by the trainers' Job (its `status.failed`). Defaults to 0.

    Returns:
        PodProblem | None: The problem, or None when none of these shows.
    """
    live = [p for p in _newest_first(pods) if not (p.get("metadata") or {}).get("deletionTimestamp")]
    for check in (_crash_loop, lambda p: _failed(p, failures), _unschedulable):
        for pod in live:
            problem = check(pod)
            if problem is not None:
                return problem
    return None


def _seconds(timestamp: str) -> float:
    return datetime.datetime.fromisoformat(timestamp.replace("Z", "+00:00")).timestamp()


def stuck_rollout(
    stateful_set: Mapping[str, Any] | None, pods: Sequence[Mapping[str, Any]], now: str
) -> PodProblem | None:
    """Whether the evaluators' rolling update is stuck on a pod of the new revision.

    Args:
        stateful_set (Mapping[str, Any] | None): The StatefulSet as read.
        pods (Sequence[Mapping[str, Any]]): Its pods, as read.
        now (str): RFC 3339 time.

    Returns:
        PodProblem | None: Reason `ROLLOUT_STUCK` naming the revision and what holds it, or None.
    """
    status = (stateful_set or {}).get("status") or {}
    update, current = status.get("updateRevision"), status.get("currentRevision")
    if not update or not current or update == current:
        return None
    updated = [p for p in pods if ((p.get("metadata") or {}).get("labels") or {}).get(REVISION_LABEL) == update]
    problem = diagnose(updated)
    if problem is not None:
        return PodProblem(ROLLOUT_STUCK, f"rollout to revision {update} is stuck: {problem.message}; "
                                         f"{_FORCED_ROLLBACK.format(pod=problem.pod)}", problem.pod)
    for pod in _newest_first(updated):
        conditions = (pod.get("status") or {}).get("conditions") or []
        ready: Mapping[str, Any] = next((c for c in conditions if c.get("type") == "Ready"), {})
        since = ready.get("lastTransitionTime") or (pod.get("metadata") or {}).get("creationTimestamp")
        if ready.get("status") != "True" and since and now:
            waited = _seconds(now) - _seconds(since)
            if waited > ROLLOUT_PROGRESS_DEADLINE_SECONDS:
                return PodProblem(ROLLOUT_STUCK, f"rollout to revision {update} is stuck: pod {_name(pod)} not ready "
                                                 f"since {since} (over {ROLLOUT_PROGRESS_DEADLINE_SECONDS:.0f} s); "
                                                 f"{_FORCED_ROLLBACK.format(pod=_name(pod))}",
                                  _name(pod))
    return None


POD_FAILURE_POLICY_REASON = "PodFailurePolicy"
"""Reason of a Job's Failed condition when a FailJob rule of its pod failure policy matched (exit code 2)."""
POD_FAILED = "PodFailed"
"""Reason of a trainer loss: a container of the pod exited with a non-zero code (other than exit code 2)."""
POD_DELETED = "PodDeleted"
"""Reason of a trainer loss: the pod was deleted (`kubectl delete pod`, a controller) with no DisruptionTarget."""
DISRUPTION_TARGET = "DisruptionTarget"
"""Pod condition the control plane sets before it deletes a pod for a disruption; its reason says which:
PreemptionByScheduler, EvictionByEvictionAPI, DeletionByTaintManager (node not ready or tainted), DeletionByPodGC
(node gone), TerminationByKubelet (node shutdown or pressure). Kubernetes docs, "Pod disruption conditions"."""
LossCause = Literal["failure", "disruption", "rejected"]


@dataclasses.dataclass(frozen=True)
class TrainerLoss:
    """Why a trainer gang can no longer go on.

    Attributes:
        cause (LossCause): `failure` (counts against spec.train.maxRestarts), `disruption` (does not) or `rejected`
            (exit code 2: the spec is bad; the Job's pod failure policy fails it, no restart helps).
        reason (str): `POD_FAILED`, `POD_DELETED`, or the DisruptionTarget condition's reason.
        pod (str): The pod's name.
        message (str): For people: the pod and what happened to it.
        since (float): Unix seconds when it happened (container finish, deletion request, condition time); 0 when
            unknown.
    """

    cause: LossCause
    reason: str
    pod: str
    message: str
    since: float = 0.0


def _time(value: Any, offset: float = 0.0) -> float:
    return _seconds(str(value)) - offset if value else 0.0


def _disruption(pod: Mapping[str, Any]) -> TrainerLoss | None:
    for condition in (pod.get("status") or {}).get("conditions") or []:
        if condition.get("type") == DISRUPTION_TARGET and condition.get("status") == "True":
            reason = str(condition.get("reason") or DISRUPTION_TARGET)
            detail = condition.get("message") or reason
            return TrainerLoss("disruption", reason, _name(pod), f"pod {_name(pod)} disrupted: {detail}",
                               _time(condition.get("lastTransitionTime")))
    metadata = pod.get("metadata") or {}
    if metadata.get("deletionTimestamp"):
        # deletionTimestamp is the deletion request plus its grace period.
        requested = _time(metadata["deletionTimestamp"], float(metadata.get("deletionGracePeriodSeconds") or 0))
        return TrainerLoss("disruption", POD_DELETED, _name(pod), f"pod {_name(pod)} was deleted", requested)
    return None


def _failure(pod: Mapping[str, Any]) -> TrainerLoss | None:
    for container in _statuses(pod):
        terminated = (container.get("state") or {}).get("terminated") or {}
        code = terminated.get("exitCode")
        if code in (None, 0):
            continue
        cause: LossCause = "rejected" if code == contract.EXIT_BAD_MANIFEST else "failure"
        return TrainerLoss(cause, POD_FAILED, _name(pod),
                           f"pod {_name(pod)}: container {container.get('name')} failed with {_exit(terminated)}"
                           f"{said(terminated)}",
                           _time(terminated.get("finishedAt")))
    if (pod.get("status") or {}).get("phase") == "Failed":
        reason = (pod.get("status") or {}).get("reason") or "no exit code recorded"
        return TrainerLoss("failure", POD_FAILED, _name(pod), f"pod {_name(pod)} failed ({reason})")
    return None


def trainer_loss(pods: Sequence[Mapping[str, Any]]) -> TrainerLoss | None:
    """What ends a trainer gang's attempt, from its pods: a failure, a disruption, or nothing.

    A pod that is deleted or disrupted first and fails afterwards (SIGTERM, a kill after its grace period) is a
    disruption; so is a pod whose peers failed only after it was lost (DDP ranks fail when a peer goes). A pod
    that failed by itself at or before the first disruption is a failure: the Job controller deletes the other
    pods of a failed Job, and those deletions must not hide it. Exit code 2 (`rejected`) wins over both.
    A pod that succeeded is no loss unless it was deleted (`plan_restart` ignores a Complete Job).

    Args:
        pods (Sequence[Mapping[str, Any]]): The trainer pods of one attempt, as read.

    Returns:
        TrainerLoss | None: The loss to act on, or None while every pod runs, waits or succeeded.
    """
    failures, disruptions = [], []
    for pod in sorted(pods, key=_name):
        # A trainer exits 0 on SIGTERM (it checkpoints first): deleted before its Job completed, it is lost all
        # the same.
        disruption = _disruption(pod)
        if disruption is not None:
            disruptions.append(disruption)
            continue
        if (pod.get("status") or {}).get("phase") == "Succeeded":
            continue
        failure = _failure(pod)
        if failure is not None:
            failures.append(failure)
    rejected = [f for f in failures if f.cause == "rejected"]
    if rejected:
        return rejected[0]
    first_failure = min(failures, key=lambda loss: loss.since, default=None)
    first_disruption = min(disruptions, key=lambda loss: loss.since, default=None)
    if first_failure is not None and (first_disruption is None or first_failure.since <= first_disruption.since):
        return first_failure
    return first_disruption


TAINT_MANAGER = "DeletionByTaintManager"
"""DisruptionTarget reason of a pod the taint manager deleted: its node carried a NoExecute taint the pod did not
tolerate, or tolerated for `tolerationSeconds` only. The node lifecycle controller taints a node whose kubelet
stopped answering `node.kubernetes.io/unreachable:NoExecute` (Ready Unknown) and every pod gets that toleration for
300 s by default (admission plugin DefaultTolerationSeconds). Kubernetes docs, "Taints and Tolerations",
taint-based evictions."""


@dataclasses.dataclass(frozen=True)
class Stranded:
    """A pod left on a node that stopped answering, which only a forced deletion removes.

    Attributes:
        pod (str): The pod's name.
        node (str): Its node (`spec.nodeName`).
        since (str): RFC 3339 time the node lifecycle controller marked the pod not ready (its Ready condition's
            lastTransitionTime: when the node was found unreachable), else when the taint manager deleted it.
        role (str): The pod's `contract.LABEL_ROLE` (train or eval): whose readiness condition names the node.
    """

    pod: str
    node: str
    since: str
    role: str


def _condition(pod: Mapping[str, Any], type_: str) -> Mapping[str, Any]:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return next((c for c in conditions if c.get("type") == type_), {})


def released_at(pod: Mapping[str, Any]) -> float | None:
    """When `pod` counts as stranded if it is still there: when the taint manager deleted it (its deletionTimestamp
    less its deletionGracePeriodSeconds), for a pod on a node, not ready, evicted by the taint manager.

    The taint manager evicts a pod once its toleration of the node's NoExecute taint (`builders.NODE_LOSS_TAINTS`,
    `unreachableTolerationSeconds`) has passed. A kubelet that answers ends a deleted pod's containers within the
    grace period and removes the pod; one that does not leaves it Terminating until the node comes back or is
    deleted, so the operator does not wait out a grace period no kubelet will honour. Kubernetes' own answer for
    such a pod is a forced deletion (`kubectl delete --force --grace-period=0`, or the out-of-service taint whose
    pod garbage collector does the same): Kubernetes docs, "Force Delete StatefulSet Pods" and "Non-graceful node
    shutdown". Forcing it out early is safe for the run: a pod of an old attempt can neither publish weights, nor
    be trained on, nor write a checkpoint (docs/operator.md, the fencing list).

    Args:
        pod (Mapping[str, Any]): A pod as watched or listed (`trim`med is enough).

    Returns:
        float | None: Unix seconds; None for a pod that is not a taint manager's eviction in progress.
    """
    metadata = pod.get("metadata") or {}
    disruption = _condition(pod, DISRUPTION_TARGET)
    node = (pod.get("spec") or {}).get("nodeName")
    if not node or not metadata.get("deletionTimestamp") or _condition(pod, "Ready").get("status") == "True":
        return None
    if disruption.get("status") != "True" or disruption.get("reason") != TAINT_MANAGER:
        return None
    return _time(metadata["deletionTimestamp"], float(metadata.get("deletionGracePeriodSeconds") or 0))


def stranded(pod: Mapping[str, Any], now: float) -> Stranded | None:
    """`pod` as `Stranded` once its `released_at` has passed, else None.

    Args:
        pod (Mapping[str, Any]): A pod as watched or listed.
        now (float): Unix seconds.

    Returns:
        Stranded | None: The pod, its node and since when the node is unreachable.
    """
    due = released_at(pod)
    if due is None or due > now:
        return None
    since = _condition(pod, "Ready").get("lastTransitionTime") or \
        _condition(pod, DISRUPTION_TARGET).get("lastTransitionTime") or ""
    role = str(((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE) or "")
    return Stranded(_name(pod), str((pod.get("spec") or {}).get("nodeName")), str(since), role)


def unreachable_nodes(left: Sequence[Stranded]) -> str:
    """The nodes that stopped answering under `left`, for people: `node N unreachable since T` per node (T the
    earliest of its pods' `since`), by node name, joined by "; ".

    Args:
        left (Sequence[Stranded]): Stranded pods.

    Returns:
        str: For example `node kwok-node-1 unreachable since 2026-12-03T04:10:00Z`; "" for no pods.

    Examples:
        >>> unreachable_nodes([Stranded("g-eval-1", "n1", "2026-12-03T04:10:05Z", "eval"),
        ...                    Stranded("g-eval-0", "n1", "2026-12-03T04:10:00Z", "eval")])
        'node n1 unreachable since 2026-12-03T04:10:00Z'
    """
    since: dict[str, str] = {}
    for pod in left:
        since[pod.node] = min(since.get(pod.node, pod.since), pod.since)
    return "; ".join(f"node {node} unreachable since {since[node]}" for node in sorted(since))
