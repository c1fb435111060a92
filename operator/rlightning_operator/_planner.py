"""The pure planner: desired children + observed children -> the actions that make them agree.

No I/O. Rules, per desired child (compared by kind and name):

- missing: create it;
- being deleted (deletionTimestamp set): wait; the child's DELETED event triggers the next reconcile;
- controlled by another owner (a different uid): leave it alone and report it (`Conflict`);
- Job whose spec hash differs: recreate (the pod template of a Job is immutable): delete it with
  propagationPolicy Foreground, so that its pods are gone before the new Job exists (never more trainer pods
  than desired, never two pods answering to pod 0's DNS name), and create it on the next reconcile;
- Service whose clusterIP differs from the desired one (`None`: headless; an adopted Service someone made with
  a cluster IP): recreate, delete and create at once (clusterIP is immutable: a patch gets 422 Invalid forever);
- StatefulSet whose spec hash differs: patch the template (a rolling update of the evaluators) and replicas;
  whose replicas only differ: patch `spec.replicas` alone (scaling never touches the template);
- any other child whose spec hash or owner reference differs: patch it with the desired content (a JSON merge
  patch; in the fields only this operator writes, `_OWNED_FIELDS`, it also removes what the spec dropped).

Restarts of the trainer gang (`plan_restart`) come first: a pod of the current attempt that failed or went
ends the attempt; the next one is a Job of attempt N+1, which the rules above then recreate (Foreground: every
pod of attempt N is gone before attempt N+1 exists). Pods stranded on a node that stopped answering would hold
that deletion for good: `plan_force_deletes` names those to force-delete.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from rlightning import contract
from rlightning_operator import _builders as builders
from rlightning_operator import _pods as pods

ActionType = Literal["create", "patch", "scale", "recreate", "wait", "conflict"]
# Fields of each kind that a patch sends, beside metadata; immutable fields (StatefulSet selector and
# serviceName, RoleBinding roleRef, Service clusterIP) are left out.
_PATCHED_FIELDS: dict[str, tuple[str, ...]] = {
    "ConfigMap": ("data",),
    "ServiceAccount": (),
    "Role": ("rules",),
    "RoleBinding": ("subjects",),
    "Service": ("spec",),
    "StatefulSet": ("spec",),
    "PodDisruptionBudget": ("spec",),  # all of it mutable since Kubernetes 1.15
    "NetworkPolicy": ("spec",),
}
_STATEFULSET_SPEC_FIELDS = ("replicas", "template", "updateStrategy")
# Patched fields that only this operator writes: their patch also removes what the desired manifest no longer has
# (a JSON merge patch, RFC 7386, otherwise only adds and replaces keys: a dropped nodeSelector would stay, and a PDB
# switched from maxUnavailable to minAvailable would hold both, which the API server refuses). A Service's spec is
# left out: the API server allocates fields there (clusterIPs, ipFamilies) that no patch may null.
_OWNED_FIELDS: dict[str, tuple[str, ...]] = {
    "ConfigMap": ("data",),
    "StatefulSet": ("spec",),
    "PodDisruptionBudget": ("spec",),
    "NetworkPolicy": ("spec",),  # a metrics port set to 0 drops its rule
}


@dataclasses.dataclass(frozen=True)
class Action:
    """One step the reconciler takes on one child.

    Attributes:
        type (ActionType): create, patch, scale (StatefulSet replicas only), recreate (delete now; create at
            once from `body` when it is set, else on the next reconcile, as for a Job), wait (nothing to do until
            the child is gone) or conflict (owned by another).
        kind (str): Kubernetes kind of the child, for example `Job`.
        name (str): metadata.name of the child.
        body (dict[str, Any] | None): The manifest to create (for create and a recreate at once), or the JSON
            merge patch to send; None otherwise.
        reason (str): Why, in a few words (used in Events and logs).
    """

    type: ActionType
    kind: str
    name: str
    body: dict[str, Any] | None = None
    reason: str = ""


def key(manifest: Mapping[str, Any]) -> tuple[str, str]:
    """(kind, name) of a manifest: how desired and observed children are matched."""
    return manifest["kind"], manifest["metadata"]["name"]


def _hash(manifest: Mapping[str, Any]) -> str | None:
    return (manifest.get("metadata", {}).get("annotations") or {}).get(contract.ANNOTATION_SPEC_HASH)


def _controller_uid(manifest: Mapping[str, Any]) -> str | None:
    for reference in manifest.get("metadata", {}).get("ownerReferences") or []:
        if reference.get("controller"):
            return reference.get("uid")
    return None


def _removing(desired: Any, observed: Any) -> Any:
    """`desired` as a JSON merge patch (RFC 7386) over `observed` that also sets to null every key of an object
    that `observed` has and `desired` lacks, at any depth (lists and values are replaced whole anyway).
    """
    if not isinstance(desired, Mapping) or not isinstance(observed, Mapping):
        return desired
    patch = {name: _removing(value, observed.get(name)) for name, value in desired.items()}
    patch.update({name: None for name in observed if name not in desired})
    return patch


def _patch_body(desired: Mapping[str, Any], observed: Mapping[str, Any]) -> dict[str, Any]:
    kind, metadata = desired["kind"], desired["metadata"]
    body: dict[str, Any] = {
        "metadata": {name: metadata[name] for name in ("labels", "annotations", "ownerReferences") if name in metadata}
    }
    for field in _PATCHED_FIELDS[kind]:
        value, current = desired[field], observed.get(field) or {}
        if kind == "StatefulSet":
            value = {name: value[name] for name in _STATEFULSET_SPEC_FIELDS if name in value}
            current = {name: current[name] for name in _STATEFULSET_SPEC_FIELDS if name in current}
        body[field] = _removing(value, current) if field in _OWNED_FIELDS.get(kind, ()) else value
    return body


def plan_child(desired: Mapping[str, Any], observed: Mapping[str, Any] | None) -> Action | None:
    """The action for one child, or None when it already agrees.

    Args:
        desired (Mapping[str, Any]): The built manifest, with owner references set.
        observed (Mapping[str, Any] | None): The child as read from the API server; None when it does not exist.

    Returns:
        Action | None: What to do.
    """
    kind, name = key(desired)
    if observed is None:
        return Action("create", kind, name, dict(desired), "missing")
    if observed.get("metadata", {}).get("deletionTimestamp"):
        return Action("wait", kind, name, reason="being deleted")
    owner_uid = _controller_uid(desired)
    observed_owner = _controller_uid(observed)
    if observed_owner is not None and observed_owner != owner_uid:
        return Action("conflict", kind, name, reason=f"controlled by another owner (uid {observed_owner})")
    hash_differs = _hash(observed) != _hash(desired)
    if kind == "Service" and (observed.get("spec") or {}).get("clusterIP") != desired["spec"].get("clusterIP"):
        return Action("recreate", kind, name, dict(desired), "clusterIP differs (immutable in a Service)")
    if kind == "Job":
        if hash_differs:
            return Action("recreate", kind, name, reason="pod template changed (immutable in a Job)")
        if observed_owner is None:
            adopt = {"metadata": {"ownerReferences": desired["metadata"]["ownerReferences"]}}
            return Action("patch", kind, name, adopt, "adopt")
        return None
    if kind == "StatefulSet" and not hash_differs and observed_owner is not None:
        replicas = desired["spec"]["replicas"]
        if observed.get("spec", {}).get("replicas") != replicas:
            return Action("scale", kind, name, {"spec": {"replicas": replicas}}, f"replicas -> {replicas}")
        return None
    if hash_differs or observed_owner is None:
        return Action("patch", kind, name, _patch_body(desired, observed), "spec changed" if hash_differs else "adopt")
    return None


def plan(desired: list[dict[str, Any]], observed: Mapping[tuple[str, str], Mapping[str, Any] | None]) -> list[Action]:
    """The actions for every desired child, in the order of `desired`.

    Args:
        desired (list[dict[str, Any]]): Built manifests with owner references (`builders.build_children`).
        observed (Mapping[tuple[str, str], Mapping[str, Any] | None]): (kind, name) -> child as read, or None.

    Returns:
        list[Action]: Actions for the children that differ; empty when everything agrees.
    """
    actions = []
    for manifest in desired:
        action = plan_child(manifest, observed.get(key(manifest)))
        if action is not None:
            actions.append(action)
    return actions


JOB_FAILED = "JobFailed"
"""Reason of a trainer loss seen only on the Job (Failed, not by its pod failure policy) with no pod to show it."""


@dataclasses.dataclass(frozen=True)
class Restarts:
    """The trainer gang's attempt and its restarts so far (status.train.attempt, status.restarts).

    Attributes:
        attempt (int): The current attempt, 0 first.
        failures (int): Restarts caused by failures.
        disruptions (int): Restarts caused by disruptions.
    """

    attempt: int = 0
    failures: int = 0
    disruptions: int = 0


@dataclasses.dataclass(frozen=True)
class RestartDecision:
    """What to do about a trainer gang that lost a pod.

    Attributes:
        restart (bool): True: run `after`; False: failures used up spec.train.maxRestarts, training fails.
        loss (pods.TrainerLoss): What happened.
        after (Restarts): The attempt and counts from now on (unchanged when `restart` is False).
    """

    restart: bool
    loss: pods.TrainerLoss
    after: Restarts


def _job_failed(job: Mapping[str, Any]) -> Mapping[str, Any] | None:
    for condition in (job.get("status") or {}).get("conditions") or []:
        if condition.get("type") in ("FailureTarget", "Failed") and condition.get("status") == "True":
            return condition
    return None


def plan_restart(
    job: Mapping[str, Any] | None,
    train_pods: Sequence[Mapping[str, Any]],
    current: Restarts,
    max_restarts: int,
) -> RestartDecision | None:
    """Whether the trainer gang's current attempt has ended with a loss, and what comes next.

    Only the Job of the current attempt counts (a Job of another attempt is being replaced already), and only
    while it is not being deleted, not suspended (queued in Kueue), not Complete and not failed by its pod failure
    policy (exit code 2: the spec is invalid; the status says so). Evaluator pods are never looked at: scaling them
    down is no loss.

    Args:
        job (Mapping[str, Any] | None): The trainers' Job as read.
        train_pods (Sequence[Mapping[str, Any]]): Pods as read; only trainers of the current attempt count.
        current (Restarts): The attempt and counts in status.
        max_restarts (int): spec.train.maxRestarts.

    Returns:
        RestartDecision | None: None while the attempt goes on (or has ended without a loss).
    """
    if job is None or (job.get("metadata") or {}).get("deletionTimestamp"):
        return None
    if builders.attempt_of(job) != current.attempt or (job.get("spec") or {}).get("suspend"):
        return None  # a suspended Job's pods go because Kueue queued or preempted it: admission, not a loss
    conditions = {c.get("type"): c for c in (job.get("status") or {}).get("conditions") or []
                  if c.get("status") == "True"}
    failed = _job_failed(job)
    if "Complete" in conditions or (failed is not None and failed.get("reason") == pods.POD_FAILURE_POLICY_REASON):
        return None
    loss = pods.trainer_loss([p for p in train_pods if builders.attempt_of(p) == current.attempt and
                              ((p.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE) == "train"])
    if loss is None and failed is not None:
        detail = f"{failed.get('reason') or 'Failed'}: {failed.get('message') or 'no message'}"
        name = (job.get("metadata") or {}).get("name")
        loss = pods.TrainerLoss("failure", JOB_FAILED, "", f"Job {name} failed ({detail})")
    if loss is None or loss.cause == "rejected":
        return None
    if loss.cause == "disruption":
        after = dataclasses.replace(current, attempt=current.attempt + 1, disruptions=current.disruptions + 1)
        return RestartDecision(True, loss, after)
    if current.failures >= max_restarts:
        return RestartDecision(False, loss, current)
    after = dataclasses.replace(current, attempt=current.attempt + 1, failures=current.failures + 1)
    return RestartDecision(True, loss, after)


def plan_force_deletes(
    group_pods: Sequence[Mapping[str, Any]], attempt: int, now: float
) -> list[pods.Stranded]:
    """The pods to force-delete (`pods.stranded`): evaluators (their StatefulSet replaces a pod only once it is gone)
    and trainers of an attempt before `attempt` (they hold the old Job's Foreground deletion, so the next attempt).
    A trainer of the current attempt is left alone: its loss restarts the gang first (`plan_restart`), which makes
    it a pod of an older attempt.

    Args:
        group_pods (Sequence[Mapping[str, Any]]): Pods of one PolicyGroup, as watched or listed.
        attempt (int): The trainer gang's current attempt.
        now (float): Unix seconds.

    Returns:
        list[pods.Stranded]: By node, then pod name.
    """
    found = []
    for pod in group_pods:
        role = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE)
        older = role == contract.PolicyRole.TRAIN and builders.attempt_of(pod) < attempt
        left = pods.stranded(pod, now) if older or role == contract.PolicyRole.EVAL else None
        if left is not None:
            found.append(left)
    return sorted(found, key=lambda s: (s.node, s.pod))
