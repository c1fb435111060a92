"""What the watches delivered, kept for the reconciler's passes, so that a status pass reads nothing from the API
server: each PolicyGroup (or the operator's own status write of it), its Job and StatefulSet, and the pods its
status reads; and, per PolicyGroup, the pods force-deleted from nodes that stopped answering.

Watched objects are kept as compact JSON (`_packed`), each read handing out a copy of its own. Safe from any thread:
the watches note from the event loop, passes read from kopf's and the refresher's threads.
"""

from __future__ import annotations

import dataclasses
import json
import threading
import time
from collections.abc import Mapping, Set
from typing import Any

from rlightning import contract
from rlightning_operator import _builders as builders
from rlightning_operator import _pods as pods

STATUS_ECHO_SECONDS = 10.0
"""How long the PolicyGroup watch may take to deliver the operator's own status write; past it, passes read the
PolicyGroup from the API server until the watch delivers it again."""
_GROUP_METADATA_DROPPED = ("managedFields", "annotations")
"""What is not kept of a PolicyGroup's metadata: nothing reads its annotations (kopf's diff base there is a copy of
the spec, kubectl's last-applied configuration one of the whole object)."""


@dataclasses.dataclass(frozen=True)
class _SeenGroup:
    """A PolicyGroup as last watched, or as the operator's own status write returned it.

    Attributes:
        body (str | None): The object (`_packed`); None while unknown: an event other than the write's came before
            the write's own (it may be older or newer than the write: passes read the PolicyGroup until the write's
            event comes).
        awaiting (str | None): resourceVersion of that write until the watch delivers it; None when `body` came
            from the watch.
        since (float): `time.monotonic()` of the write.
    """

    body: str | None
    awaiting: str | None = None
    since: float = 0.0


@dataclasses.dataclass(frozen=True)
class _SeenPod:
    """A pod as the pod watch last delivered it (`_pods.trim`med, `_packed`); `gone` after its DELETED event."""

    packed: str
    gone: bool = False

    @property
    def pod(self) -> dict[str, Any]:
        """The pod (a copy of its own)."""
        return json.loads(self.packed)


class WatchCache:
    """The PolicyGroups, children and pods as their watches last delivered them (see the module docstring)."""

    def __init__(self) -> None:
        # The pods the status reads, per PolicyGroup, as the pod watch last delivered them (trimmed), so that no
        # pass lists pods: every trainer pod (one deleted stays, marked gone: the evidence of a loss once it is
        # gone and the Job failed because of it) and the evaluator pods not settled (`_pods.settled`).
        self._pods_seen: dict[tuple[str, str], dict[str, _SeenPod]] = {}
        # Pods force-deleted from nodes that stopped answering, until their role is ready again: the status names
        # the nodes meanwhile (`status.unreachable_left`). An operator that restarts meanwhile forgets them.
        self._unreachable: dict[tuple[str, str], list[pods.Stranded]] = {}
        self._pods_guard = threading.Lock()
        # Each PolicyGroup as the watch (or the operator's own status write) last gave it, so that a pass reads none.
        self._groups_seen: dict[tuple[str, str], _SeenGroup] = {}
        # Each PolicyGroup's status as the operator last wrote it (`_packed`): a pass never starts from an earlier
        # attempt (`Reconciler._not_before_own_restart`).
        self._status_written: dict[tuple[str, str], str] = {}
        self._groups_guard = threading.Lock()
        # Each Job and StatefulSet as the child watch last delivered it (no pod template; `_packed`), (kind,
        # namespace, name) -> child, so that a status refresh reads neither (a whole reconcile reads them fresh).
        self._children_seen: dict[tuple[str, str, str], str] = {}

    def note_child(self, child: Mapping[str, Any], deleted: bool = False) -> None:
        """Remember a Job or StatefulSet as the child watch delivered it, without its pod template and managed
        fields (forget it after its DELETED event).

        Args:
            child (Mapping[str, Any]): The Job or StatefulSet.
            deleted (bool, optional): It is gone. Defaults to False.
        """
        metadata = child.get("metadata") or {}
        key = (str(child.get("kind") or ""), metadata.get("namespace", ""), metadata.get("name", ""))
        with self._groups_guard:
            if deleted:
                self._children_seen.pop(key, None)
                return
            self._children_seen[key] = _packed({
                **_without_metadata({k: v for k, v in child.items() if k != "spec"}, ("managedFields",)),
                "spec": {k: v for k, v in (child.get("spec") or {}).items() if k != "template"},
            })

    def children_not_listed(
        self, kind: str, namespace: str | None, listed: Set[tuple[str, str]]
    ) -> list[dict[str, Any]]:
        """The `kind` children kept in `namespace` that a complete listing of them did not hold: deleted while their
        watch was down.

        Args:
            kind (str): `Job` or `StatefulSet`.
            namespace (str | None): The namespace listed; None for every namespace.
            listed (Set[tuple[str, str]]): (namespace, name) of every child of that kind the listing held.

        Returns:
            list[dict[str, Any]]: Those children as last watched (without their pod templates).
        """
        with self._groups_guard:
            return [json.loads(packed) for (child_kind, child_namespace, name), packed in self._children_seen.items()
                    if child_kind == kind and namespace in (None, child_namespace)
                    and (child_namespace, name) not in listed]

    def child(self, kind: str, namespace: str, name: str) -> dict[str, Any] | None:
        """A Job or StatefulSet as last watched (without its pod template).

        Args:
            kind (str): `Job` or `StatefulSet`.
            namespace (str): Its namespace.
            name (str): Its name.

        Returns:
            dict[str, Any] | None: A copy of its own; None when not delivered (or deleted).
        """
        with self._groups_guard:
            seen = self._children_seen.get((kind, namespace, name))
        return json.loads(seen) if seen is not None else None

    def note_group(self, body: Mapping[str, Any], deleted: bool = False) -> None:
        """Remember a PolicyGroup as the watch delivered it (forget it after its DELETED event).

        Until the operator's own status write comes back through the watch, an event of another write may be older
        than it (delivered late) or newer (another writer): the body is unknown then, and passes read it. An event
        whose status is the one written is not older: it is the write's, or a later one that left status alone
        (kopf's own annotation patch right after the write; kopf releases that batch events deliver only the last
        of a batch window, which may hide the write's event).

        Args:
            body (Mapping[str, Any]): The PolicyGroup.
            deleted (bool, optional): It is gone. Defaults to False.
        """
        metadata = body.get("metadata") or {}
        key = (metadata.get("namespace", ""), metadata.get("name", ""))
        with self._groups_guard:
            seen = self._groups_seen.get(key)
            if deleted:
                self._groups_seen.pop(key, None)
            elif seen is None or seen.awaiting in (None, metadata.get("resourceVersion")) or \
                    body.get("status") == self._written_status(key):
                self._groups_seen[key] = _SeenGroup(_packed(_without_metadata(body, _GROUP_METADATA_DROPPED)))
            else:
                self._groups_seen[key] = _SeenGroup(None, seen.awaiting, seen.since)

    def group(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The PolicyGroup as the watch last delivered it (or as the operator's own status write returned it); None
        when it must be read from the API server: the watch has not delivered it, or delivered another write before
        the operator's own (`note_group`), or not the operator's own within `STATUS_ECHO_SECONDS`.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.

        Returns:
            dict[str, Any] | None: A copy of its own, or None.
        """
        with self._groups_guard:
            seen = self._groups_seen.get((namespace, name))
            if seen is not None and seen.awaiting is not None and time.monotonic() - seen.since > STATUS_ECHO_SECONDS:
                del self._groups_seen[(namespace, name)]  # the watch may have relisted past the write: start over
            elif seen is not None and seen.body is not None:
                return json.loads(seen.body)
        return None

    def note_status_written(self, namespace: str, name: str, stored: Mapping[str, Any]) -> None:
        """Remember a PolicyGroup as the operator's own status write returned it, until the watch delivers it (unless
        the watch already did: its event can come before the response is handled in the writing thread).

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            stored (Mapping[str, Any]): The PolicyGroup as the status patch returned it.
        """
        stored = _without_metadata(stored, _GROUP_METADATA_DROPPED)
        key, written = (namespace, name), stored.get("status") or {}
        with self._groups_guard:
            seen = self._groups_seen.get(key)
            self._status_written[key] = _packed(written)
            if seen is None or seen.body is None or json.loads(seen.body).get("status") != written:
                self._groups_seen[key] = _SeenGroup(_packed(stored), stored["metadata"].get("resourceVersion"),
                                                    time.monotonic())

    def written_status(self, namespace: str, name: str) -> dict[str, Any] | None:
        """The status this operator last wrote for a PolicyGroup.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.

        Returns:
            dict[str, Any] | None: That status; None if it wrote none.
        """
        with self._groups_guard:
            return self._written_status((namespace, name))

    def _written_status(self, key: tuple[str, str]) -> dict[str, Any] | None:
        written = self._status_written.get(key)  # the caller holds `_groups_guard`
        return None if written is None else json.loads(written)

    def note_pod(self, pod: Mapping[str, Any], deleted: bool = False) -> None:
        """Remember the state of a pod as the pod watch delivered it, or forget it when the status cannot need it.

        Args:
            pod (Mapping[str, Any]): A pod of a managed workload; pods of no role or group are ignored.
            deleted (bool, optional): The pod is gone (a DELETED event). Defaults to False.
        """
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        role, group = labels.get(contract.LABEL_ROLE), labels.get(contract.LABEL_GROUP)
        if role not in (contract.PolicyRole.TRAIN, contract.PolicyRole.EVAL) or not group:
            return
        key, name = (metadata.get("namespace", ""), group), metadata.get("name", "")
        with self._pods_guard:
            seen = self._pods_seen.setdefault(key, {})
            if role == contract.PolicyRole.TRAIN:
                seen[name] = _SeenPod(_packed(pods.trim(pod)), gone=deleted)
            elif deleted or pods.settled(pod):
                seen.pop(name, None)
            else:
                seen[name] = _SeenPod(_packed(pods.trim(pod)))
            if not seen:
                del self._pods_seen[key]

    def pods_not_listed(self, namespace: str | None, listed: Set[tuple[str, str]]) -> list[dict[str, Any]]:
        """The pods kept (and not known gone) in `namespace` that a complete listing of it did not hold: deleted while
        the pod watch was down.

        Args:
            namespace (str | None): The namespace listed; None for every namespace.
            listed (Set[tuple[str, str]]): (namespace, name) of every pod the listing held.

        Returns:
            list[dict[str, Any]]: Those pods as last watched (`_pods.trim`med).
        """
        with self._pods_guard:
            return [seen.pod for (pod_namespace, _), kept in self._pods_seen.items()
                    if namespace in (None, pod_namespace)
                    for name, seen in kept.items() if not seen.gone and (pod_namespace, name) not in listed]

    def live_pods(self, namespace: str, name: str) -> list[dict[str, Any]]:
        """The pods of a PolicyGroup the status may read (trainers, evaluators not settled), as last watched.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.

        Returns:
            list[dict[str, Any]]: Copies of their own (`_pods.trim`med); none known gone.
        """
        with self._pods_guard:
            return [seen.pod for seen in self._pods_seen.get((namespace, name), {}).values() if not seen.gone]

    def trainer_pods(self, namespace: str, name: str, attempt: int, suspended: bool) -> dict[str, dict[str, Any]]:
        """The trainer pods of attempt `attempt` as last watched, by name (a pod gone already included); those of
        other attempts, and all of them while the Job is `suspended` (a suspension's removals are no evidence of a
        loss once the Job runs again), are forgotten.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            attempt (int): The trainer gang's current attempt.
            suspended (bool): Its Job is suspended.

        Returns:
            dict[str, dict[str, Any]]: Pod name -> the pod (`_pods.trim`med).
        """
        with self._pods_guard:
            seen = self._pods_seen.get((namespace, name), {})
            remembered = {}
            for pod_name, kept in list(seen.items()):
                pod = kept.pod
                if ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE) != \
                        contract.PolicyRole.TRAIN:
                    continue
                if suspended or builders.attempt_of(pod) != attempt:
                    del seen[pod_name]
                else:
                    remembered[pod_name] = pod
            return remembered

    def node_of(self, namespace: str, name: str, pod: str) -> str:
        """The node of a PolicyGroup's pod as the pod watch last delivered it.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            pod (str): The pod's name.

        Returns:
            str: spec.nodeName; "" when unknown.
        """
        with self._pods_guard:
            seen = self._pods_seen.get((namespace, name), {}).get(pod)
        return str((seen.pod.get("spec") or {}).get("nodeName") or "") if seen is not None else ""

    def note_unreachable(self, namespace: str, name: str, stranded: list[pods.Stranded]) -> None:
        """Remember pods force-deleted from nodes that stopped answering, for the status, until `keep_unreachable`
        drops them.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            stranded (list[pods.Stranded]): The pods force-deleted.
        """
        with self._pods_guard:
            self._unreachable.setdefault((namespace, name), []).extend(stranded)

    def unreachable(self, namespace: str, name: str) -> list[pods.Stranded]:
        """The pods of a PolicyGroup force-deleted from nodes that stopped answering, still remembered.

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.

        Returns:
            list[pods.Stranded]: A list of its own.
        """
        with self._pods_guard:
            return list(self._unreachable.get((namespace, name), ()))

    def keep_unreachable(self, namespace: str, name: str, left: list[pods.Stranded]) -> None:
        """Remember only `left` of those pods (`status.unreachable_left`: the others' role is ready again).

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
            left (list[pods.Stranded]): The pods still to name.
        """
        with self._pods_guard:
            if left:
                self._unreachable[(namespace, name)] = left
            else:
                self._unreachable.pop((namespace, name), None)

    def forget(self, namespace: str, name: str) -> None:
        """Drop everything kept of a PolicyGroup (call once it is gone).

        Args:
            namespace (str): The PolicyGroup's namespace.
            name (str): Its name.
        """
        with self._pods_guard:
            self._pods_seen.pop((namespace, name), None)
            self._unreachable.pop((namespace, name), None)
        with self._groups_guard:
            self._groups_seen.pop((namespace, name), None)
            self._status_written.pop((namespace, name), None)
            self._children_seen.pop(("Job", namespace, contract.train_name(name)), None)
            self._children_seen.pop(("StatefulSet", namespace, contract.eval_name(name)), None)


def _without_metadata(obj: Mapping[str, Any], drop: tuple[str, ...]) -> dict[str, Any]:
    """A shallow copy of `obj` without the metadata fields `drop` names (`managedFields`: server-side apply's
    bookkeeping, several KB an object that nothing here reads).
    """
    metadata = obj.get("metadata") or {}
    return {**obj, "metadata": {k: v for k, v in metadata.items() if k not in drop}}


def _packed(obj: Mapping[str, Any]) -> str:
    """`obj` as compact JSON, the form watched objects are kept in (`json.loads` gives each pass a copy of its own).
    One string an object rather than the hundreds of small dicts and strings of a parsed body: about a fifth of the
    memory, and nothing long-lived left among the small objects that bursts of watch events allocate and free, so the
    allocator can return their memory.
    """
    return json.dumps(obj, separators=(",", ":"))
