"""Trainer rank 0 patches `status.training` of its PolicyGroup (only in a cluster, ENV_REPORT_STATUS=1).

A JSON merge patch (RFC 7386) of the status subresource touches only `status.training`, so the operator's
fields (phase, conditions, replicas) are left alone. Reports are rate-limited and an API error is logged,
never raised: training must not die because the API server is slow or the Role is wrong.

Each answer is the whole PolicyGroup: its annotation `contract.ANNOTATION_CHECKPOINT_REQUEST` (set by the operator
when a trainer's node is marked for disruption, or by a user) is kept as `checkpoint_request`, so a request reaches
rank 0 within one report interval at no extra request.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from rlightning import contract, launch
from rlightning.config import TrainingStatus

log = logging.getLogger(__name__)

MIN_INTERVAL_SECONDS = launch.STATUS_REPORT_SECONDS
"""Least time between two status patches, so a fast training loop does not load the API server."""


class StatusReporter:
    """Patches the PolicyGroup's status.training from inside a pod (in-cluster service account).

    Args:
        name (str): metadata.name of the PolicyGroup.
        namespace (str): Its namespace.
        min_interval (float, optional): Seconds between patches; `report(force=True)` ignores it.
            Defaults to MIN_INTERVAL_SECONDS.
        api (Any, optional): A `kubernetes.client.CustomObjectsApi`; defaults to one built from the
            in-cluster configuration.
    """

    def __init__(self, name: str, namespace: str, min_interval: float = MIN_INTERVAL_SECONDS, api: Any = None) -> None:
        self.name = name
        self.namespace = namespace
        self.min_interval = min_interval
        self._api = api
        self._last = float("-inf")
        self.checkpoint_request: str | None = None
        """The PolicyGroup's checkpoint request as of the last answer (None: none, or no answer yet)."""

    def _client(self) -> Any:
        if self._api is None:
            from kubernetes import client, config

            try:
                config.load_incluster_config()
            except config.ConfigException:  # a trainer outside the cluster: $KUBECONFIG names it
                config.load_kube_config()
            self._api = client.CustomObjectsApi()
        return self._api

    def _answered(self, group: Any) -> None:
        """Keep the checkpoint request of the PolicyGroup an answer holds."""
        metadata = (group.get("metadata") if isinstance(group, dict) else None) or {}
        self.checkpoint_request = (metadata.get("annotations") or {}).get(contract.ANNOTATION_CHECKPOINT_REQUEST)

    def previous(self) -> dict[str, Any]:
        """status.training as it is now: what the gang's previous attempt reported last, read at the start.

        Returns:
            dict[str, Any]: status.training (camelCase keys); {} when there is none or the read failed (logged).
        """
        try:
            group = self._client().get_namespaced_custom_object_status(
                contract.API_GROUP, contract.API_VERSION, self.namespace, contract.PLURAL, self.name
            )
        except Exception as error:  # noqa: BLE001 - any API or config error must not stop training
            log.warning("could not read status.training of %s/%s: %s", self.namespace, self.name, error)
            return {}
        self._answered(group)
        return dict(((group or {}).get("status") or {}).get("training") or {})

    def report(self, status: TrainingStatus, force: bool = False) -> bool:
        """Patch status.training unless the last patch is younger than `min_interval`.

        Args:
            status (TrainingStatus): The progress to publish.
            force (bool, optional): Patch even within the interval (the final report). Defaults to False.

        Returns:
            bool: True when the patch was sent and accepted; False when skipped or when it failed (logged).
        """
        now = time.monotonic()
        if not force and now - self._last < self.min_interval:
            return False
        self._last = now
        training = status.model_dump(by_alias=True, exclude_none=True, mode="json")
        # A merge patch keeps what it omits: an explicit null ends the wait once data flows again, and clears a
        # verdict once nothing is compared any more (no evaluator left).
        training["waitingForDataSeconds"] = status.waiting_for_data_seconds
        training["consistent"] = status.consistent
        training["consistentReason"] = status.consistent_reason
        if status.last_checkpoint is not None:  # whole, its null request included: a merge patch would keep the last
            training["lastCheckpoint"] = status.last_checkpoint.model_dump(by_alias=True, mode="json")
        body = {"status": {"training": training}}
        try:
            answer = self._client().patch_namespaced_custom_object_status(
                contract.API_GROUP,
                contract.API_VERSION,
                self.namespace,
                contract.PLURAL,
                self.name,
                body,
                _content_type="application/merge-patch+json",
            )
        except Exception as error:  # noqa: BLE001 - any API or config error must not stop training
            log.warning("could not patch status.training of %s/%s: %s", self.namespace, self.name, error)
            return False
        self._answered(answer)
        return True
