"""What the pods of a PolicyGroup are doing, read from the status the kubelet and the scheduler write (pure).

- A crash loop: a container waiting in `CrashLoopBackOff`, or restarted after a non-zero exit and not ready;
  for trainers (restartPolicy Never: the Job replaces a failed pod with a new one) a failed pod, with the Job's
  count of failed pods as the restarts.
- Unschedulable: condition `PodScheduled=False` with reason `Unschedulable`, and the scheduler's message.
- A stuck rollout of the evaluators: the StatefulSet updates pods one at a time and waits for each to be ready,
  so one pod of the new revision that crash-loops, cannot be scheduled, or stays unready longer than
  `ROLLOUT_PROGRESS_DEADLINE_SECONDS` stops the rollout there.

Pods are read only while some are not ready (`_status.pods_matter`), through the one API module.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Mapping, Sequence
from typing import Any

CRASH_LOOP = "CrashLoopBackOff"
UNSCHEDULABLE = "Unschedulable"
ROLLOUT_STUCK = "RolloutStuck"
REASONS = (CRASH_LOOP, UNSCHEDULABLE, ROLLOUT_STUCK)
"""Condition reasons this module gives; a change to one of them is posted as a Warning Event."""
REVISION_LABEL = "controller-revision-hash"
"""Label the StatefulSet controller puts on each pod: the revision it was made from."""
_FORCED_ROLLBACK = "after fixing the spec, delete pod {pod}: a StatefulSet does not replace it by itself"
"""Kubernetes docs, StatefulSets, "Forced rollback": a pod stuck on a broken revision stays until deleted."""
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


def _name(pod: Mapping[str, Any]) -> str:
    return str((pod.get("metadata") or {}).get("name") or "")


def _statuses(pod: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    status = pod.get("status") or {}
    return [*(status.get("initContainerStatuses") or []), *(status.get("containerStatuses") or [])]


def _exit(terminated: Mapping[str, Any]) -> str:
    detail = f"exit code {terminated.get('exitCode')}"
    return detail + (f" ({terminated['reason']})" if terminated.get("reason") else "")


def _crash_loop(pod: Mapping[str, Any]) -> PodProblem | None:
    for container in _statuses(pod):
        waiting = (container.get("state") or {}).get("waiting") or {}
        last = (container.get("lastState") or {}).get("terminated") or {}
        restarts = int(container.get("restartCount") or 0)
        crashed = restarts > 0 and last.get("exitCode") not in (None, 0) and not container.get("ready")
        if waiting.get("reason") == CRASH_LOOP or crashed:
            last_exit = _exit(last) if last else "no exit code recorded"
            return PodProblem(CRASH_LOOP, f"pod {_name(pod)}: container {container.get('name')} is crash-looping: "
                                          f"last {last_exit}, {restarts} restarts", _name(pod))
    return None


def _failed(pod: Mapping[str, Any], failures: int) -> PodProblem | None:
    if (pod.get("status") or {}).get("phase") != "Failed":
        return None
    for container in _statuses(pod):
        terminated = (container.get("state") or {}).get("terminated") or {}
        if terminated.get("exitCode") not in (None, 0):
            return PodProblem(CRASH_LOOP, f"pod {_name(pod)}: container {container.get('name')} failed with "
                                          f"{_exit(terminated)}; {failures} failed pods so far", _name(pod))
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
                                                 f"for {waited:.0f} s; {_FORCED_ROLLBACK.format(pod=_name(pod))}",
                                  _name(pod))
    return None
