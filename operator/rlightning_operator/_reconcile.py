"""One reconcile of one PolicyGroup: validate, build, observe, plan, act, report (one status write at most).

A reconcile first asks whether the trainer gang's attempt has ended with a lost pod (`_planner.plan_restart`);
if so it posts a Warning Event, builds the Job of the next attempt (which the plan then recreates: Foreground
deletion, and no new Job while any trainer pod of another attempt remains) and records the restart in status.
Once training has ended, the evaluators are scaled to zero unless spec.eval.afterTraining is Serve. Pods the taint
manager evicted from a node that stopped answering are force-deleted at once, no kubelet being there to end them
(`_planner.plan_force_deletes`), so that they hold neither the next attempt nor the evaluators' replacement.

A pass reads the PolicyGroup, its Job and StatefulSet and its pods as their watches last delivered them
(`_watchcache.WatchCache`, `Reconciler.cache`), and computes the status from a pure observation of what it saw and
did (`observe`).

Synchronous (the kubernetes client blocks); kopf runs it in its thread pool. Reconciles of the same
PolicyGroup are serialised by a per-object lock, so a handler and a child-triggered refresh never act at once.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import logging
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from rlightning import contract, launch
from rlightning.config import ManifestError, PolicyGroupManifest, parse_manifest
from rlightning_operator import _builders as builders
from rlightning_operator import _disruption as disruption
from rlightning_operator import _kube as kube
from rlightning_operator import _metrics as metrics
from rlightning_operator import _notices as notices
from rlightning_operator import _planner as planner
from rlightning_operator import _pods as pods
from rlightning_operator import _status as status
from rlightning_operator import _watchcache as watchcache

logger = logging.getLogger(__name__)

EventPoster = Callable[[Mapping[str, Any], str, str, str], None]
"""(object, type Normal|Warning, reason, message) -> None; posts a Kubernetes Event about the object."""


class InvalidSpecError(Exception):
    """The PolicyGroup's spec fails validation; retrying cannot help until the spec changes.

    Args:
        problems (list[str]): One `"<field path>: <rule>"` line per problem.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What one reconcile did.

    Attributes:
        actions (list[planner.Action]): Actions applied, in order.
        status (dict[str, Any]): The operator's part of status as computed.
        status_written (bool): Whether status was patched (it is only when it changed).
        blocked (list[str]): Children (`Kind/name`) being deleted or controlled by another owner: the caller
            reconciles again later, since no watched event may announce that they are gone.
        recheck_seconds (float | None): Refresh the status after this many seconds even if nothing happens (a
            condition turns with time: `_status.recheck_seconds`); None when none waits.
    """

    actions: list[planner.Action]
    status: dict[str, Any]
    status_written: bool
    blocked: list[str] = dataclasses.field(default_factory=list)
    recheck_seconds: float | None = None


@dataclasses.dataclass(frozen=True)
class _Pass:
    """What one pass saw and did, for the status it reports.

    Attributes:
        job (Mapping[str, Any] | None): The trainer Job as observed or as the pass left it.
        stateful_set (Mapping[str, Any] | None): The evaluators' StatefulSet, likewise.
        current (planner.Restarts): The gang's attempt and restart counts after the pass.
        actions (list[planner.Action]): Actions applied, in order.
        conflicts (list[str]): Children controlled by another owner, with the reason.
        blocked (list[str]): Children (`Kind/name`) the pass had to leave for later.
        restarts (Mapping[str, Any] | None): status.restarts as a gang restart of this pass set it; None: as is.
    """

    job: Mapping[str, Any] | None
    stateful_set: Mapping[str, Any] | None
    current: planner.Restarts
    actions: list[planner.Action] = dataclasses.field(default_factory=list)
    conflicts: list[str] = dataclasses.field(default_factory=list)
    blocked: list[str] = dataclasses.field(default_factory=list)
    restarts: Mapping[str, Any] | None = None


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


_MANIFEST_KEYS = ("apiVersion", "kind", "metadata", "spec")
_EVENT_REASONS = {"create": "Created", "patch": "Patched", "scale": "Scaled", "recreate": "Recreating"}
NODE_UNREACHABLE = "NodeUnreachable"
"""Reason of the Warning Event naming a node that stopped answering and the pods force-deleted from it."""
_EVENT_VERBS = {"patch": "patched", "scale": "scaled", "recreate": "recreating"}


class Reconciler:
    """Reconciles PolicyGroups through one `KubeClient`.

    Args:
        client (kube.KubeClient): The API.
        post_event (EventPoster): Posts Events about a PolicyGroup.
        network_policy (builders.NetworkPolicyOptions | None, optional): Give each PolicyGroup's trainers a
            NetworkPolicy with these options (`builders.build_network_policy`); None: none (a cluster without
            NetworkPolicy support). Defaults to None.
        node_notices (notices.NodeNotices | None, optional): The disruption notices of the trainers' nodes, which
            name a restart `Preempted` (`_disruption.restart_reason`). Defaults to None: a new, empty one.

    Attributes:
        cache (watchcache.WatchCache): The PolicyGroups, children and pods as watched; the watches note into it.
    """

    def __init__(
        self, client: kube.KubeClient, post_event: EventPoster,
        network_policy: builders.NetworkPolicyOptions | None = None,
        node_notices: notices.NodeNotices | None = None,
    ) -> None:
        self._client = client
        self._post_event = post_event
        self._network_policy = network_policy
        self.node_notices = node_notices or notices.NodeNotices()
        # Weak values: a lock lives while a reconcile holds it or a thread waits for it, and goes after, so
        # memory stays bounded without ever dropping a lock in use (a PolicyGroup deleted and created again
        # under the same name while a reconcile runs still gets the same lock).
        # Re-entrant: `refresh` reads the PolicyGroup under the lock, then runs a pass that takes it again.
        self._locks: weakref.WeakValueDictionary[tuple[str, str], threading.RLock] = weakref.WeakValueDictionary()
        self._locks_guard = threading.Lock()
        self.cache = watchcache.WatchCache()

    def _watched_child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Job or StatefulSet as last watched, else as read now (None when it does not exist)."""
        watched = self.cache.child(kind, namespace, name)
        return watched if watched is not None else self._client.read(kind, namespace, name)

    def _lock(self, namespace: str, name: str) -> threading.RLock:
        with self._locks_guard:
            lock = self._locks.get((namespace, name))
            if lock is None:
                lock = self._locks[(namespace, name)] = threading.RLock()
            return lock

    def read_group(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PolicyGroup as the watch last delivered it (or as the operator's own status write returned it); read
        from the API server when the watch has not delivered it, or delivered another write before the operator's
        own, or not the operator's own in time (`watchcache.WatchCache.group`).

        Returns:
            dict[str, Any] | None: The PolicyGroup, or None when it is gone.

        Raises:
            kube.TransientApiError: The read failed in a way worth retrying.
            kube.PermanentApiError: The read was refused.
        """
        watched = self.cache.group(namespace, name)
        return watched if watched is not None else self._client.read(contract.KIND, namespace, name)

    def _patch_status(self, namespace: str, name: str, patch: Mapping[str, Any]) -> None:
        """Patch a PolicyGroup's status; the cache keeps the object it returned until the watch delivers it."""
        self.cache.note_status_written(namespace, name, self._client.patch(
            contract.KIND, namespace, name, {"status": dict(patch)}, subresource="status"))

    def refresh(self, namespace: str, name: str, full: bool) -> Outcome | None:
        """A pass for a PolicyGroup named by an event of its children or pods: `reconcile` (``full``) or
        `refresh_status`, on the PolicyGroup as known once the pass holds its lock (`read_group`). A body read
        before could predate another pass's status write (a gang restart's: it would rebuild the attempt before).

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            full (bool): Reconcile whole rather than refresh the status.

        Returns:
            Outcome | None: None when the PolicyGroup is gone (what was remembered of it is forgotten) or being
            deleted.

        Raises:
            InvalidSpecError, kube.TransientApiError, kube.PermanentApiError: As `reconcile`.
        """
        with self._lock(namespace, name):
            body = self.read_group(namespace, name)
            if body is None:  # deleted: its pods' last events brought it here, and nothing will need them
                self.cache.forget(namespace, name)
                return None
            if body["metadata"].get("deletionTimestamp"):
                return None
            return self.reconcile(body) if full else self.refresh_status(body)

    def reconcile(self, body: Mapping[str, Any]) -> Outcome:
        """Make the children of a PolicyGroup match its spec and write its status.

        Args:
            body (Mapping[str, Any]): The PolicyGroup object (apiVersion, kind, metadata, spec, status).

        Returns:
            Outcome: Actions applied and the status computed.

        Raises:
            InvalidSpecError: The spec is invalid (status and a Warning Event say which field, after this call).
            kube.TransientApiError: The API failed in a way worth retrying.
            kube.PermanentApiError: The API refused a request (for example Forbidden).
        """
        metadata = body["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        with self._lock(namespace, name), self._refusals_reported(body):
            return self._reconcile_locked(self._not_before_own_restart(body), namespace, name)

    def refresh_status(self, body: Mapping[str, Any]) -> Outcome:
        """Recompute and write the status from the Job, the StatefulSet and the pods as watched; act on nothing,
        unless the trainer gang lost a pod, or the Job or the StatefulSet is missing or differs from what the spec
        asks (a template, replicas, an owner; evaluators to stop once training has ended): then reconcile whole.

        For child and pod events that only moved progress (pods becoming ready): no read (the watches gave the
        PolicyGroup and its children; a child not delivered yet is read), one status write when it changed.

        Args:
            body (Mapping[str, Any]): The PolicyGroup object.

        Returns:
            Outcome: No actions; the status computed.

        Raises:
            InvalidSpecError: The spec is invalid (reported as in `reconcile`).
            kube.TransientApiError: The API failed in a way worth retrying.
            kube.PermanentApiError: The API refused a request.
        """
        metadata = body["metadata"]
        namespace, name = metadata["namespace"], metadata["name"]
        with self._lock(namespace, name), self._refusals_reported(body):
            body = self._not_before_own_restart(body)
            manifest = self._validate(body, namespace, name)
            job = self._watched_child("Job", namespace, contract.train_name(name))
            current = _current_restarts(body, job)
            decision = planner.plan_restart(job, self._trainer_pods(namespace, name, job, current), current,
                                            manifest.spec.train.max_restarts)
            if decision is not None and decision.restart:
                return self._reconcile_locked(body, namespace, name)
            stateful_set = self._watched_child("StatefulSet", namespace, contract.eval_name(name))
            desired = {planner.key(child): child
                       for child in self._desired(body, manifest, namespace, job, current, workloads_only=True)}
            watched = {("Job", contract.train_name(name)): job, ("StatefulSet", contract.eval_name(name)): stateful_set}
            if any(planner.plan_child(desired[key], observed) is not None for key, observed in watched.items()):
                return self._reconcile_locked(body, namespace, name)  # missing, changed, or evaluators to stop
            self._force_delete_stranded(body, namespace, name, current)
            return self._report(body, namespace, name, manifest, _Pass(job, stateful_set, current))

    def _not_before_own_restart(self, body: Mapping[str, Any]) -> Mapping[str, Any]:
        """`body`, with the status of this operator's last write for it instead of its own when that write is of a
        later attempt of the trainer gang: `body` predates a gang restart (an event queued before it), and a pass on
        it would rebuild the attempt before and report no restart.
        """
        metadata = body["metadata"]
        written = self.cache.written_status(metadata["namespace"], metadata["name"])
        if written is None or _attempt(written) <= _attempt(body.get("status") or {}):
            return body
        return {**body, "status": written}

    @contextlib.contextmanager
    def _refusals_reported(self, body: Mapping[str, Any]) -> Iterator[None]:
        """Report a refusal of the API server (403, 422: retrying the same request cannot help until someone
        fixes RBAC, a policy or a webhook) as Ready=False with its message and one Warning Event, then re-raise.

        The Warning is posted when the Ready condition changes, so a retry that meets the same refusal posts
        none; an operator that may not even patch status logs that and posts one per retry.
        """
        try:
            yield
        except kube.PermanentApiError as error:
            if error.status == 404:  # gone meanwhile: the next event or retry sorts it out
                raise
            metadata = body["metadata"]
            namespace, name = metadata["namespace"], metadata["name"]
            message = f"the API server refused {error.verb} {error.path}: {error.status} {error.message}"[:1000]
            logger.warning("%s/%s: %s", namespace, name, message)
            previous = (body.get("status") or {}).get("conditions") or []
            conditions = status.refused_conditions(
                previous, int(metadata.get("generation") or 0), error.status, message, _now()
            )
            if conditions is not None:
                try:
                    self._patch_status(namespace, name, {"conditions": conditions})
                except kube.ApiError as status_error:
                    logger.warning("%s/%s: cannot report it in status: %s", namespace, name, status_error)
                self._post_event(body, "Warning", conditions[-1]["reason"], message)
            raise

    def _validate(self, body: Mapping[str, Any], namespace: str, name: str) -> PolicyGroupManifest:
        """The validated manifest; for an invalid spec, status and one Warning Event, then InvalidSpecError."""
        try:
            return parse_manifest({key: body[key] for key in _MANIFEST_KEYS if key in body})
        except ManifestError as error:
            current_status = body.get("status") or {}
            observation = status.Observation(
                name,
                int(body["metadata"].get("generation") or 0),
                problems=error.problems,
                previous=current_status.get("conditions") or [],
                now=_now(),
            )
            computed = status.compute_status(observation)
            if self._write_status(namespace, name, current_status, computed):  # once per invalid generation
                self._post_event(body, "Warning", "InvalidSpec", "; ".join(error.problems)[:1000])
            raise InvalidSpecError(error.problems) from None

    def _report(
        self, body: Mapping[str, Any], namespace: str, name: str, manifest: PolicyGroupManifest, done: _Pass
    ) -> Outcome:
        """Compute the status from the observed Job, StatefulSet and (while some are not ready) pods, write it
        when it changed, and post a Warning Event when a pod problem appears (once per change of reason).
        """
        current_status = body.get("status") or {}
        live = self.cache.live_pods(namespace, name)
        unreachable = self.cache.unreachable(namespace, name)
        observation = observe(body, manifest, done, live, unreachable, _now())
        computed = status.compute_status(observation)
        left = status.unreachable_left(unreachable, computed)
        if len(left) < len(unreachable):  # a role ready again: its pods are replaced
            self.cache.keep_unreachable(namespace, name, left)
        written = self._write_status(namespace, name, current_status, computed)
        if written:  # once per transition, not once per retry
            _warn_of_new_problems(self._post_event, body, observation, computed)
        # a pod the taint manager deleted is force-deleted from its deletion's time on: a recheck for when the API
        # server's clock (deletionTimestamp) runs ahead of ours, as no event would announce that time
        now = time.time()
        rechecks = [due - now + 1.0 for due in map(pods.released_at, live) if due is not None and due > now]
        rechecks.append(status.recheck_seconds(observation, computed) or float("inf"))
        recheck = min(rechecks)
        return Outcome(actions=done.actions, status=computed, status_written=written, blocked=done.blocked,
                       recheck_seconds=None if recheck == float("inf") else max(1.0, recheck))

    def _trainer_pods(
        self, namespace: str, name: str, job: Mapping[str, Any] | None, current: planner.Restarts
    ) -> list[dict[str, Any]]:
        """The trainer pods of the current attempt as last seen by the pod watch (a pod gone already included), and
        as listed too when the Job is failing (the watch may not have delivered the failed pod yet; a gang that
        runs or starts costs no pod list). Pods of other attempts are forgotten.
        """
        suspended = bool((job or {}).get("spec", {}).get("suspend"))
        remembered = self.cache.trainer_pods(namespace, name, current.attempt, suspended)
        gang = _gang_state(job, current.attempt)
        if gang == "none":
            return []
        listed = self._client.list("Pod", namespace, _trainer_selector(name)) if gang == "failing" else []
        names = {(p.get("metadata") or {}).get("name") for p in listed}
        return listed + [pod for pod_name, pod in sorted(remembered.items()) if pod_name not in names]

    def _restart(
        self, body: Mapping[str, Any], manifest: PolicyGroupManifest, decision: planner.RestartDecision,
        before: planner.Restarts,
    ) -> dict[str, Any]:
        """Announce a restart of the trainer gang (Event, metric); returns status.restarts after it."""
        after, loss = decision.after, decision.loss
        metadata = body["metadata"]
        node_notice = self.node_notices.notice_for(
            self.cache.node_of(metadata["namespace"], metadata["name"], loss.pod))
        reason = disruption.restart_reason(loss, node_notice)
        metrics.GANG_RESTARTS.labels(reason=reason).inc()
        by_reason = dict(((body.get("status") or {}).get("restarts") or {}).get("byReason") or {})
        by_reason[reason] = int(by_reason.get(reason) or 0) + 1
        detail = loss.message + (f"; {node_notice.detail}" if reason == disruption.PREEMPTED and node_notice else "")
        counted = (f"failure {after.failures} of spec.train.maxRestarts {manifest.spec.train.max_restarts}"
                   if loss.cause == "failure" else "a disruption, not counted against spec.train.maxRestarts")
        message = f"{reason}: attempt {after.attempt} replaces attempt {before.attempt}: {detail} ({counted})"
        logger.warning("%s/%s: restarting the trainer gang: %s", metadata["namespace"], metadata["name"], message)
        self._post_event(body, "Warning", "TrainerRestarting", message[:1000])
        if not manifest.spec.train.checkpoint.persistent_volume_claim:
            self._post_event(body, "Warning", status.CHECKPOINTS_NOT_PERSISTENT,
                             f"attempt {after.attempt} starts without checkpoints: the trainers' run directory is an "
                             "emptyDir; it keeps the fleet's weight version but not weights, optimizer and progress "
                             "(set spec.train.checkpoint.persistentVolumeClaim)")
        return {
            "total": after.failures + after.disruptions,
            "failures": after.failures,
            "disruptions": after.disruptions,
            "reason": reason,
            "pod": loss.pod,
            "message": detail,
            "byReason": by_reason,
        }

    def _reconcile_locked(self, body: Mapping[str, Any], namespace: str, name: str) -> Outcome:
        manifest = self._validate(body, namespace, name)
        job_name = contract.train_name(name)
        # A PolicyGroup with no status that this operator never wrote one for was never reconciled: its children
        # are created without reading them first (a child that exists after all, from a pass whose status write was
        # lost, answers 409 and is read then).
        fresh = not body.get("status") and self.cache.written_status(namespace, name) is None
        job = None if fresh else self._client.read("Job", namespace, job_name)
        current = _current_restarts(body, job)
        decision = planner.plan_restart(job, self._trainer_pods(namespace, name, job, current), current,
                                        manifest.spec.train.max_restarts)
        restarts = None
        if decision is not None and decision.restart:
            restarts = self._restart(body, manifest, decision, current)
            current = decision.after
        desired = self._desired(body, manifest, namespace, job, current)
        observed: dict[tuple[str, str], dict[str, Any] | None] = {}
        for kind, child_name in map(planner.key, desired):
            observed[(kind, child_name)] = job if kind == "Job" or fresh else \
                self._client.read(kind, namespace, child_name)
        actions = planner.plan(desired, observed)
        old: list[dict[str, Any]] = []
        if any(action.kind == "Job" and action.type in ("create", "wait") for action in actions):
            # the old attempt's pods may hold this Job's deletion or creation: listed only while they can
            old = [p for p in self._client.list("Pod", namespace, _trainer_selector(name))
                   if builders.attempt_of(p) != current.attempt]
        self._force_delete_stranded(body, namespace, name, current, old)
        actions = [_old_attempt_gone(action, old) for action in actions]
        applied, conflicts, blocked = _act(self._client, self._post_event, body, actions, observed)
        job = observed.get(("Job", job_name))
        stateful_set = observed.get(("StatefulSet", contract.eval_name(name)))
        return self._report(body, namespace, name, manifest,
                            _Pass(job, stateful_set, current, applied, conflicts, blocked, restarts))

    def _desired(
        self, body: Mapping[str, Any], manifest: PolicyGroupManifest, namespace: str, job: Mapping[str, Any] | None,
        current: planner.Restarts, workloads_only: bool = False,
    ) -> list[dict[str, Any]]:
        """The children as they should be: built for the current attempt, the evaluators scaled to zero once
        training has ended (when spec.eval.afterTraining is Stop), owned by the PolicyGroup; with `workloads_only`,
        the Job and the StatefulSet alone (what a status pass compares).
        """
        state = builders.RunState(current.attempt, builders.created_seconds(body),
                                  _stop_evaluators(manifest, job, current))
        built = builders.build_workloads(manifest, namespace, state) if workloads_only else \
            builders.build_children(manifest, namespace, self._network_policy, state)
        return [builders.with_owner(child, dict(body)) for child in built]

    def _force_delete_stranded(
        self, body: Mapping[str, Any], namespace: str, name: str, current: planner.Restarts,
        listed: list[dict[str, Any]] | None = None,
    ) -> None:
        """Force-delete the pods stranded on unreachable nodes (`planner.plan_force_deletes`) among the pods as
        watched and `listed`, with one Warning Event `NodeUnreachable` per node naming it and its pods; remember
        them for the status until their role is ready again.
        """
        candidates = {(p.get("metadata") or {}).get("name", ""): p
                      for p in [*self.cache.live_pods(namespace, name), *(listed or [])]}
        by_node: dict[str, list[pods.Stranded]] = {}
        for left in planner.plan_force_deletes(list(candidates.values()), current.attempt, time.time()):
            metrics.ACTIONS.labels(type="force-delete", kind="Pod").inc()
            self._client.delete("Pod", namespace, left.pod, propagation="Background", grace_period_seconds=0)
            by_node.setdefault(left.node, []).append(left)
        for gone in by_node.values():
            message = f"{pods.unreachable_nodes(gone)}: force-deleted pods {', '.join(g.pod for g in gone)}"
            logger.warning("%s/%s: %s", namespace, name, message)
            self._post_event(body, "Warning", NODE_UNREACHABLE, message[:1000])
        if by_node:
            self.cache.note_unreachable(namespace, name, [g for gone in by_node.values() for g in gone])

    def _write_status(
        self, namespace: str, name: str, current: Mapping[str, Any], computed: Mapping[str, Any]
    ) -> bool:
        if not status.differs(current, computed):
            return False
        try:
            self._patch_status(namespace, name, computed)
        except kube.PermanentApiError as error:
            if error.status == 404:  # deleted meanwhile; garbage collection removes the children
                return False
            raise
        return True


def observe(
    body: Mapping[str, Any], manifest: PolicyGroupManifest, done: _Pass, live_pods: list[dict[str, Any]],
    unreachable: list[pods.Stranded], now: str,
) -> status.Observation:
    """What the status is computed from, after one pass: a pure function of what the pass saw and did.

    Args:
        body (Mapping[str, Any]): The PolicyGroup the pass started from.
        manifest (PolicyGroupManifest): Its validated spec.
        done (_Pass): The Job, StatefulSet, attempt and what the pass did.
        live_pods (list[dict[str, Any]]): The group's pods as watched (`watchcache.WatchCache.live_pods`); read only
            while some are not ready (`status.pods_matter`).
        unreachable (list[pods.Stranded]): Pods force-deleted from nodes that stopped answering, still remembered.
        now (str): The time for new conditions (RFC 3339).

    Returns:
        status.Observation: The input of `status.compute_status`.
    """
    job, stateful_set, current, conflicts = done.job, done.stateful_set, done.current, done.conflicts
    restarts, name = done.restarts, body["metadata"]["name"]
    current_status = body.get("status") or {}
    nodes, replicas = manifest.spec.train.nodes, manifest.spec.eval.replicas
    if _stop_evaluators(manifest, job, current):
        replicas = 0
    group_pods = live_pods if status.pods_matter(nodes, replicas, job, stateful_set) else []
    previous = current_status.get("conditions") or []
    return status.Observation(
        name,
        int(body["metadata"].get("generation") or 0),
        nodes=nodes,
        replicas=replicas,
        job=job,
        stateful_set=stateful_set,
        pods=group_pods,
        conflicts=conflicts,
        previous=previous,
        now=now,
        attempt=current.attempt,
        restarts=current_status.get("restarts") or {} if restarts is None else restarts,
        max_restarts=manifest.spec.train.max_restarts,
        after_training=manifest.spec.eval.after_training,
        checkpoints_persistent=bool(manifest.spec.train.checkpoint.persistent_volume_claim),
        fleet_data=launch.fleet_collects(manifest.spec),
        training=current_status.get("training") or {},
        stall_seconds=launch.stall_seconds(manifest.spec),
        unreachable=unreachable,
        grace_seconds=launch.grace_seconds(manifest.spec),
    )


def _act(
    client: kube.KubeClient, post_event: EventPoster, body: Mapping[str, Any], actions: list[planner.Action],
    observed: dict[tuple[str, str], dict[str, Any] | None],
) -> tuple[list[planner.Action], list[str], list[str]]:
    """Apply a pass's actions in order (`_apply`; a child created meanwhile is read and planned again), with one
    Event naming every child created; `observed` ((kind, name) -> child) gets each child as the pass left it.

    Returns:
        tuple[list[planner.Action], list[str], list[str]]: The actions applied, the children controlled by another
        owner (with the reason), and the children (`Kind/name`) left for a later pass.
    """
    namespace = body["metadata"]["namespace"]
    conflicts: list[str] = []
    blocked: list[str] = []
    created: list[str] = []
    applied: list[planner.Action] = []
    try:
        for action in actions:
            try:
                result = _apply(client, post_event, action, namespace, body)
            except kube.Conflict:  # created meanwhile (a restart, a stale read, a fresh group's leftover)
                result = client.read(action.kind, namespace, action.name)
                follow_up = planner.plan_child(action.body or {}, result)
                if follow_up is None:
                    observed[(action.kind, action.name)] = result
                    continue
                action = follow_up
                result = _apply(client, post_event, action, namespace, body)
            applied.append(action)
            if action.type == "create":  # one Event a pass names them all (below)
                attempt = f" (attempt {builders.attempt_of(action.body)})" if action.kind == "Job" else ""
                created.append(f"{action.kind} {action.name}{attempt}")
            if action.type in ("conflict", "wait"):
                blocked.append(f"{action.kind}/{action.name}")
                if action.type == "conflict":
                    conflicts.append(f"{action.kind}/{action.name}: {action.reason}")
            elif action.type == "recreate" and action.body is not None and result is None:
                blocked.append(f"{action.kind}/{action.name}")  # the old one is still being deleted
            elif result is not None or action.type == "recreate":
                observed[(action.kind, action.name)] = result
    finally:  # what was created is announced also when a later request failed; a group's first pass creates
        # about 11 children, and an Event each was a third of the writes a group cost the API server
        if created:
            post_event(body, "Normal", _EVENT_REASONS["create"], f"created {', '.join(created)}"[:1000])
    return applied, conflicts, blocked


def _apply(
    client: kube.KubeClient, post_event: EventPoster, action: planner.Action, namespace: str,
    body: Mapping[str, Any],
) -> dict[str, Any] | None:
    """Apply one action; returns the child as stored afterwards (None after a delete or for wait/conflict);
    raises kube.Conflict when a child to create exists. Every action but a creation posts its own Event (the
    caller names a pass's creations in one).
    """
    if action.type in ("wait", "conflict"):  # reported through Outcome.blocked and the status
        return None
    metrics.ACTIONS.labels(type=action.type, kind=action.kind).inc()
    logger.info("%s/%s: %s %s %s (%s)", namespace, body["metadata"]["name"], action.type, action.kind,
                action.name, action.reason)
    if action.type == "recreate" and action.body is None:  # a Job: created again once its pods are gone
        client.delete(action.kind, namespace, action.name, propagation="Foreground")
        result = None
    elif action.type == "recreate":  # nothing depends on it: delete and create at once
        client.delete(action.kind, namespace, action.name, propagation="Background")
        try:
            result = client.create(action.body or {})
        except kube.Conflict:  # a finalizer keeps the old one a while: created on a later pass
            result = None
    elif action.type == "create":  # kube.Conflict when it exists: the caller reads it and plans again
        result = client.create(action.body or {})
    else:
        result = client.patch(action.kind, namespace, action.name, action.body or {})
    if action.type != "create":
        message = f"{_EVENT_VERBS[action.type]} {action.kind} {action.name}: {action.reason}"
        post_event(body, "Normal", _EVENT_REASONS[action.type], message)
    return result


def _warn_of_new_problems(
    post_event: EventPoster, body: Mapping[str, Any], observation: status.Observation, computed: Mapping[str, Any],
) -> None:
    """Log and post a Warning Event for children controlled by another owner, and for each condition whose reason
    became a pod problem or a warning (`_pods.REASONS`, `_status.WARNING_REASONS`); call when the status was written.
    """
    namespace, name = body["metadata"]["namespace"], body["metadata"]["name"]
    if observation.conflicts:
        conflicts = "; ".join(observation.conflicts)
        logger.warning("%s/%s: children controlled by another owner: %s", namespace, name, conflicts)
        post_event(body, "Warning", "Conflict", conflicts[:1000])
    before = {c.get("type"): c.get("reason") for c in observation.previous}
    for condition in computed["conditions"]:
        warned = (*pods.REASONS, *status.WARNING_REASONS)
        if condition["reason"] in warned and before.get(condition["type"]) != condition["reason"] and \
                condition["type"] != "Ready":
            logger.warning("%s/%s: %s: %s", namespace, name, condition["reason"], condition["message"])
            post_event(body, "Warning", condition["reason"], condition["message"][:1000])


def _gang_state(job: Mapping[str, Any] | None, attempt: int) -> str:
    """The trainer gang of `attempt` as its Job tells: "none" (no Job of that attempt, or it completed), "failing"
    (failed, failing, or with pods failed or terminating) or "running".
    """
    if job is None or builders.attempt_of(job) != attempt:
        return "none"
    job_status = job.get("status") or {}
    conditions = {c.get("type") for c in job_status.get("conditions") or [] if c.get("status") == "True"}
    if "Complete" in conditions:
        return "none"
    failing = conditions & {"FailureTarget", "Failed"} or job_status.get("failed") or job_status.get("terminating")
    return "failing" if failing else "running"


def _trainer_selector(group: str) -> str:
    return f"{contract.LABEL_GROUP}={group},{contract.LABEL_ROLE}={contract.PolicyRole.TRAIN}"


def _attempt(status: Mapping[str, Any]) -> int:
    """status.train.attempt (0 when absent)."""
    return int((status.get("train") or {}).get("attempt") or 0)


def _current_restarts(body: Mapping[str, Any], job: Mapping[str, Any] | None) -> planner.Restarts:
    """The attempt and restart counts in status; the attempt is at least the Job's (a status read before the
    last write).
    """
    current = body.get("status") or {}
    restarts = current.get("restarts") or {}
    return planner.Restarts(
        attempt=max(_attempt(current), builders.attempt_of(job) if job is not None else 0),
        failures=int(restarts.get("failures") or 0),
        disruptions=int(restarts.get("disruptions") or 0),
    )


def _old_attempt_gone(action: planner.Action, old: list[dict[str, Any]]) -> planner.Action:
    """`action`, or a wait when it creates the trainers' Job while `old` trainer pods of another attempt remain
    (Foreground deletion makes that rare: a pod orphaned or deleted in the background; one force-deleted this pass
    is waited for too, its DELETED event brings the next pass).
    """
    if (action.type, action.kind) != ("create", "Job") or not old:
        return action
    names = ", ".join(sorted((p.get("metadata") or {}).get("name", "") for p in old))
    return planner.Action("wait", action.kind, action.name, reason=f"pods of another attempt remain: {names}")


def _stop_evaluators(manifest: PolicyGroupManifest, job: Mapping[str, Any] | None, current: planner.Restarts) -> bool:
    """Whether the evaluators should be scaled to zero: training has ended and spec.eval.afterTraining is Stop."""
    return manifest.spec.eval.after_training == "Stop" and status.training_ended(job, current.attempt)
