"""The one module that talks to the Kubernetes API for the reconciler (kopf's own watches and bookkeeping aside).

Objects are plain dicts (JSON in, JSON out) addressed by kind; each request is counted in the operator's
metrics. Errors are classified: `NotFound` reads return None, `Conflict` on create is returned to the caller
(which reads and patches), everything retryable (429, 5xx, connection errors) raises `TransientApiError`,
the rest `PermanentApiError`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
import urllib.parse
from collections.abc import Mapping
from typing import Any

import kubernetes
import urllib3

from rlightning import contract
from rlightning_operator import _metrics as metrics


@dataclasses.dataclass(frozen=True)
class Kind:
    """Where a kind lives in the REST API: `<prefix>/namespaces/<ns>/<plural>/<name>`."""

    prefix: str
    plural: str


KINDS: dict[str, Kind] = {
    "ConfigMap": Kind("/api/v1", "configmaps"),
    "Job": Kind("/apis/batch/v1", "jobs"),
    "Lease": Kind("/apis/coordination.k8s.io/v1", "leases"),
    "NetworkPolicy": Kind("/apis/networking.k8s.io/v1", "networkpolicies"),
    contract.KIND: Kind(f"/apis/{contract.GROUP_VERSION}", contract.PLURAL),
    "Pod": Kind("/api/v1", "pods"),
    "PodDisruptionBudget": Kind("/apis/policy/v1", "poddisruptionbudgets"),
    "Role": Kind("/apis/rbac.authorization.k8s.io/v1", "roles"),
    "RoleBinding": Kind("/apis/rbac.authorization.k8s.io/v1", "rolebindings"),
    "Service": Kind("/api/v1", "services"),
    "ServiceAccount": Kind("/api/v1", "serviceaccounts"),
    "StatefulSet": Kind("/apis/apps/v1", "statefulsets"),
}
_RETRYABLE = {408, 429, 500, 502, 503, 504}
MERGE_PATCH = "application/merge-patch+json"


class ApiError(Exception):
    """A request the API server refused or that did not complete.

    Args:
        verb (str): get, create, patch or delete.
        path (str): The request path.
        status (int): HTTP status; 0 when no response came back.
        message (str): The server's message (Status.message) or the transport error.
    """

    def __init__(self, verb: str, path: str, status: int, message: str) -> None:
        super().__init__(f"{verb} {path}: {status or 'no response'} {message}".strip())
        self.verb, self.path, self.status, self.message = verb, path, status, message


class TransientApiError(ApiError):
    """Worth retrying with backoff: throttling, server errors, timeouts, connection failures."""


class PermanentApiError(ApiError):
    """Retrying the same request cannot help (forbidden, invalid, conflict on something other than create)."""


class Conflict(ApiError):
    """The object already exists (HTTP 409 on create)."""


def load_api_client(pool_size: int = 32) -> kubernetes.client.ApiClient:
    """An API client from the in-cluster service account, else from $KUBECONFIG (or ~/.kube/config).

    Args:
        pool_size (int, optional): Connections kept to the API server (handlers run in threads). Defaults to 32.

    Returns:
        kubernetes.client.ApiClient: A client configured for the cluster.
    """
    configuration = kubernetes.client.Configuration()
    try:
        kubernetes.config.load_incluster_config(client_configuration=configuration)
    except kubernetes.config.ConfigException:
        # Read $KUBECONFIG now: the client's default path was fixed when it was imported.
        kubernetes.config.load_kube_config(config_file=os.environ.get("KUBECONFIG"), client_configuration=configuration)
    configuration.connection_pool_maxsize = pool_size
    # One attempt per request, so that its timeout is its bound (urllib3 would retry a read timeout 3 times);
    # callers retry with backoff.
    configuration.retries = 0
    return kubernetes.client.ApiClient(configuration)


class KubeClient:
    """JSON requests for the children of PolicyGroups, PolicyGroups' status and the leader-election Lease.

    Args:
        api_client (kubernetes.client.ApiClient): Authenticated client (see `load_api_client`).
        timeout_seconds (float, optional): Bound on each request. Defaults to 30.0.

    Attributes:
        last_answer (float): `time.monotonic()` of the last response of the API server (any HTTP status: the
            server answered); the time of construction before the first.
    """

    def __init__(self, api_client: kubernetes.client.ApiClient, timeout_seconds: float = 30.0) -> None:
        self._client = api_client
        self._timeout = timeout_seconds
        self.last_answer = time.monotonic()

    def _path(self, kind: str, namespace: str, name: str | None = None, subresource: str | None = None) -> str:
        where = KINDS[kind]
        path = f"{where.prefix}/namespaces/{namespace}/{where.plural}"
        if name is not None:
            path += f"/{name}"
        if subresource is not None:
            path += f"/{subresource}"
        return path

    def _request(
        self,
        verb: str,
        method: str,
        kind: str,
        path: str,
        body: Any = None,
        content_type: str = "application/json",
        timeout: float | None = None,
    ) -> tuple[int, dict[str, Any]]:
        headers = {"Accept": "application/json", "Content-Type": content_type}
        method, url, headers, body, _ = self._client.param_serialize(
            method, path, header_params=headers, body=body, auth_settings=["BearerToken"]
        )
        started = time.monotonic()
        try:
            response = self._client.call_api(
                method, url, header_params=headers, body=body, _request_timeout=timeout or self._timeout
            )
            raw = response.read()
        except (urllib3.exceptions.HTTPError, OSError) as error:
            metrics.API_REQUESTS.labels(verb=verb, kind=kind, code="error").inc()
            raise TransientApiError(verb, path, 0, str(error)) from error
        finally:
            metrics.API_SECONDS.labels(verb=verb).observe(time.monotonic() - started)
        status = response.status
        self.last_answer = time.monotonic()
        metrics.API_REQUESTS.labels(verb=verb, kind=kind, code=str(status)).inc()
        try:
            data = json.loads(raw) if raw else {}
        except ValueError:
            data = {"message": raw[:200].decode(errors="replace")}
        if 200 <= status < 300:
            return status, data
        message = data.get("message", "") if isinstance(data, dict) else ""
        if status == 409 and verb == "create":
            raise Conflict(verb, path, status, message)
        if status in _RETRYABLE:
            raise TransientApiError(verb, path, status, message)
        raise PermanentApiError(verb, path, status, message)

    def read(self, kind: str, namespace: str, name: str, timeout: float | None = None) -> dict[str, Any] | None:
        """GET one object; None when it does not exist.

        Args:
            kind (str): A key of `KINDS`.
            namespace (str): Namespace.
            name (str): metadata.name.
            timeout (float | None, optional): Bound in seconds; None for the client's. Defaults to None.

        Returns:
            dict[str, Any] | None: The object.

        Raises:
            TransientApiError: Retry later.
            PermanentApiError: For example 403 Forbidden.
        """
        try:
            return self._request("get", "GET", kind, self._path(kind, namespace, name), timeout=timeout)[1]
        except PermanentApiError as error:
            if error.status == 404:
                return None
            raise

    def list(self, kind: str, namespace: str, label_selector: str) -> list[dict[str, Any]]:
        """GET the objects of a kind in a namespace that match a label selector (read-only; pods, for status).

        Args:
            kind (str): A key of `KINDS`.
            namespace (str): Namespace.
            label_selector (str): For example "rlightning.io/policy-group=cartpole".

        Returns:
            list[dict[str, Any]]: The items.

        Raises:
            TransientApiError: Retry later.
            PermanentApiError: For example 403 Forbidden.
        """
        query = urllib.parse.urlencode({"labelSelector": label_selector})
        return self._request("list", "GET", kind, f"{self._path(kind, namespace)}?{query}")[1].get("items") or []

    def create(self, manifest: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """POST a new object.

        Args:
            manifest (Mapping[str, Any]): The object, with metadata.namespace set.
            timeout (float | None, optional): Bound in seconds; None for the client's. Defaults to None.

        Returns:
            dict[str, Any]: The object as stored.

        Raises:
            Conflict: It already exists (read it and patch instead).
            TransientApiError: Retry later.
            PermanentApiError: Invalid or forbidden.
        """
        kind, namespace = manifest["kind"], manifest["metadata"]["namespace"]
        return self._request(
            "create", "POST", kind, self._path(kind, namespace), body=dict(manifest), timeout=timeout
        )[1]

    def replace(self, manifest: Mapping[str, Any], timeout: float | None = None) -> dict[str, Any]:
        """PUT an object whole; with metadata.resourceVersion set, only if nobody changed it since (optimistic
        concurrency: the leader election's compare-and-swap).

        Args:
            manifest (Mapping[str, Any]): The object, with metadata.namespace, name and resourceVersion.
            timeout (float | None, optional): Bound in seconds; None for the client's. Defaults to None.

        Returns:
            dict[str, Any]: The object as stored.

        Raises:
            PermanentApiError: 409 when the resourceVersion is stale, 404 when gone, or forbidden.
            TransientApiError: Retry later.
        """
        kind, metadata = manifest["kind"], manifest["metadata"]
        path = self._path(kind, metadata["namespace"], metadata["name"])
        return self._request("replace", "PUT", kind, path, body=dict(manifest), timeout=timeout)[1]

    def ping(self, timeout: float | None = None) -> None:
        """GET /version (readable by every client): proof that the API server answers, for the liveness check.

        Args:
            timeout (float | None, optional): Bound in seconds; None for the client's. Defaults to None.

        Raises:
            ApiError: No answer, or an error status.
        """
        self._request("get", "GET", "Version", "/version", timeout=timeout)

    def patch(
        self, kind: str, namespace: str, name: str, body: Mapping[str, Any], subresource: str | None = None
    ) -> dict[str, Any]:
        """PATCH an object (JSON merge patch, RFC 7386: maps merge, lists are replaced).

        Args:
            kind (str): A key of `KINDS`.
            namespace (str): Namespace.
            name (str): metadata.name.
            body (Mapping[str, Any]): The merge patch.
            subresource (str | None, optional): For example `status` or `scale`. Defaults to None.

        Returns:
            dict[str, Any]: The object as stored after the patch.

        Raises:
            TransientApiError: Retry later.
            PermanentApiError: Gone (404), invalid or forbidden.
        """
        path = self._path(kind, namespace, name, subresource)
        return self._request("patch", "PATCH", kind, path, body=dict(body), content_type=MERGE_PATCH)[1]

    def delete(
        self, kind: str, namespace: str, name: str, propagation: str = "Foreground",
        grace_period_seconds: int | None = None,
    ) -> None:
        """DELETE an object; a missing object counts as deleted.

        Args:
            kind (str): A key of `KINDS`.
            namespace (str): Namespace.
            name (str): metadata.name.
            propagation (str, optional): Background, Foreground or Orphan. Defaults to "Foreground" (the object
                stays, with a deletionTimestamp, until its dependents are gone).
            grace_period_seconds (int | None, optional): 0 removes a pod at once, without waiting for its kubelet to
                confirm (`kubectl delete --force --grace-period=0`). Defaults to None (the object's own).

        Raises:
            TransientApiError: Retry later.
            PermanentApiError: Forbidden.
        """
        body: dict[str, Any] = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": propagation}
        if grace_period_seconds is not None:
            body["gracePeriodSeconds"] = grace_period_seconds
        try:
            self._request("delete", "DELETE", kind, self._path(kind, namespace, name), body=body)
        except PermanentApiError as error:
            if error.status != 404:
                raise
