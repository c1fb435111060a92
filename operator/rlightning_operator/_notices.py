"""The disruption notices of the nodes the trainer pods run on, as the pod and node watches deliver them.

The pod watch says which nodes host trainer pods (`note_pod`); the node watch hands every node here (`note_node`),
which keeps only those nodes: a notice that appears on one of them (`_disruption.notice`) is returned once, with the
PolicyGroups whose trainers run there, so that the caller asks each for a checkpoint at once. A notice stays known
while its node carries it and `KEEP_SECONDS` after its node was deleted or its last trainer pod went, so that the
restart its drain causes is named `Preempted` however late the pod's loss is handled (`notice_for`).
Thread-safe: the watches feed it on the event loop, the reconciles read it in their threads.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from typing import Any

from rlightning import contract
from rlightning_operator import _disruption as disruption

KEEP_SECONDS = 3600.0
"""How long a notice is kept after its node stopped hosting trainer pods or was deleted: far longer than a drain
and the restart pass that follows it."""


@dataclasses.dataclass(frozen=True)
class CheckpointAsk:
    """A PolicyGroup whose trainers run on a node newly marked for disruption.

    Attributes:
        namespace (str): The PolicyGroup's namespace.
        group (str): Its name.
        notice (disruption.Notice): The node's notice.
    """

    namespace: str
    group: str
    notice: disruption.Notice


class NodeNotices:
    """Which nodes trainer pods run on, and the notices those nodes carry."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._trainers: dict[tuple[str, str], tuple[str, str]] = {}  # (namespace, pod) -> (group, node)
        self._notices: dict[str, disruption.Notice] = {}
        self._left: dict[str, float] = {}  # node -> when it stopped hosting trainers or was deleted

    def note_pod(self, pod: Mapping[str, Any], deleted: bool, now: float) -> None:
        """Track a trainer pod's node (other pods are ignored).

        Args:
            pod (Mapping[str, Any]): A pod as watched (`_pods.trim`med is enough).
            deleted (bool): It is gone.
            now (float): Unix seconds.
        """
        metadata = pod.get("metadata") or {}
        labels = metadata.get("labels") or {}
        node = (pod.get("spec") or {}).get("nodeName")
        if labels.get(contract.LABEL_ROLE) != contract.PolicyRole.TRAIN or not labels.get(contract.LABEL_GROUP):
            return
        key = (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))
        with self._guard:
            before = self._trainers.pop(key, None)
            if not deleted and node:
                self._trainers[key] = (str(labels[contract.LABEL_GROUP]), str(node))
                self._left.pop(str(node), None)
            if before is not None and before[1] not in {n for _, n in self._trainers.values()}:
                self._left.setdefault(before[1], now)

    def note_node(self, node: Mapping[str, Any], deleted: bool, now: float) -> list[CheckpointAsk]:
        """Take a node's event: keep or drop its notice when trainer pods run on it (nothing is kept of others).

        Args:
            node (Mapping[str, Any]): A Node as watched.
            deleted (bool): It is gone.
            now (float): Unix seconds.

        Returns:
            list[CheckpointAsk]: One per PolicyGroup with trainers on the node when its notice is new, by namespace
                and name; [] otherwise.
        """
        name = str((node.get("metadata") or {}).get("name") or "")
        with self._guard:
            self._prune(now)
            groups = sorted({(namespace, group) for (namespace, _), (group, on) in self._trainers.items()
                             if on == name})
            if deleted:
                if name in self._notices:
                    self._left.setdefault(name, now)
                return []
            if not groups:
                return []
            before = self._notices.get(name)
            found = disruption.notice(node, now)
            if found is None:
                self._notices.pop(name, None)
                return []
            if before is not None and before.taint == found.taint:
                return []
            self._notices[name] = found
            return [CheckpointAsk(namespace, group, found) for namespace, group in groups]

    def notice_for(self, node: str) -> disruption.Notice | None:
        """The notice `node` carries (or carried, when it is gone since), None when none is known."""
        with self._guard:
            return self._notices.get(node)

    def _prune(self, now: float) -> None:
        for node, since in list(self._left.items()):
            if now - since > KEEP_SECONDS:
                del self._left[node]
                self._notices.pop(node, None)
