"""What the add-ons (metrics-server, Karpenter, KEDA, Kueue) share to serve a dev cluster from host processes.

Each runs as a process on loopback, not as a pod, so the API server reaches it the way it would reach a pod behind
a Service: through a Service of type ExternalName whose name is 127.0.0.1 (the API server's service resolver maps
such a Service to ``https://<externalName>:<port>`` for the aggregation layer, admission webhooks and CRD
conversion alike: ``k8s.io/apiserver/pkg/util/proxy.ResolveCluster``). The TLS server name it verifies is still
``<service>.<namespace>.svc``. CRDs are read from the add-on's own module at the pinned version
(``_gomod.module_dir``) and applied server-side.
"""

from __future__ import annotations

import functools
import pathlib
from collections.abc import Callable
from typing import Self

from devcluster import _cluster
from devcluster import _http
from devcluster import _ports
from devcluster import _process


class AddonError(RuntimeError):
    """Raised when an add-on exits, is not ready in time, or its objects are refused (with its log tail)."""


class Addon:
    """An add-on serving a started :class:`devcluster.Cluster` from host processes: ``with`` starts and stops it.

    Subclasses implement :meth:`start` (build or find the binary, install, start, wait until ready, return
    ``self``) and :meth:`stop` (idempotent).

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Attributes:
        start_seconds (float): Seconds from the end of the build to ready, set by :meth:`start`.
    """

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.start_seconds = 0.0
        self._log = log
        self._api = _http.ApiServer(cluster.server, cluster.ca_cert, cluster.admin_token)

    def start(self) -> Self:
        """Start the add-on and wait until it is ready; return ``self``."""
        raise NotImplementedError

    def stop(self) -> None:
        """Stop the add-on's processes and unregister what would fail without them; idempotent."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def external_name_service(name: str, namespace: str, port: int) -> dict:
    """A Service of type ExternalName through which the API server reaches a host process on loopback.

    Args:
        name (str): Service name (the TLS server name is ``<name>.<namespace>.svc``).
        namespace (str): Its namespace (must exist).
        port (int): The process's secure port; the APIService, webhook or conversion config names the same port.

    Returns:
        dict: A v1 Service.
    """
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace, "labels": {"app.kubernetes.io/name": name}},
        "spec": {"type": "ExternalName", "externalName": _ports.HOST, "ports": [{"name": "https", "port": port}]},
    }


def api_service(group: str, version: str, service: str, namespace: str, port: int) -> dict:
    """The APIService that registers ``<group>/<version>`` with the aggregation layer, behind ``service``.

    TLS verification is skipped, as metrics-server's own manifests do: the dev cluster does not hand the add-on's
    CA to the aggregator.

    Args:
        group (str): API group (``"metrics.k8s.io"``).
        version (str): API version (``"v1beta1"``).
        service (str): The :func:`external_name_service` in front of the process.
        namespace (str): That Service's namespace.
        port (int): The process's secure port.

    Returns:
        dict: An apiregistration.k8s.io/v1 APIService named ``<version>.<group>``.
    """
    return {
        "apiVersion": "apiregistration.k8s.io/v1",
        "kind": "APIService",
        "metadata": {"name": f"{version}.{group}", "labels": {"app.kubernetes.io/name": service}},
        "spec": {
            "group": group,
            "version": version,
            "service": {"namespace": namespace, "name": service, "port": port},
            "insecureSkipTLSVerify": True,
            "groupPriorityMinimum": 100,
            "versionPriority": 100,
        },
    }


def create(api: _http.ApiServer, path: str, manifest: dict) -> None:
    """POST one object; an object that already exists (HTTP 409) is left as it is.

    Args:
        api (_http.ApiServer): The admin client.
        path (str): The collection's path (``/api/v1/namespaces/kube-system/services``).
        manifest (dict): The object.

    Raises:
        AddonError: Any other answer than 201 or 409.
    """
    status, text = api.request("POST", path, manifest)
    if status not in (201, 409):
        raise AddonError(f"POST {path}: HTTP {status}: {text[:500]}")


def apply_crds(cluster: _cluster.Cluster, paths: list[pathlib.Path], names: tuple[str, ...], deadline: float) -> None:
    """Apply CRD files server-side (their schemas exceed client-side apply's annotation) and wait until every
    named CRD is Established.

    Args:
        cluster (_cluster.Cluster): The running cluster.
        paths (list[pathlib.Path]): CRD files (one or more documents each).
        names (tuple[str, ...]): The CRDs' names (``<plural>.<group>``) to wait for.
        deadline (float): ``time.monotonic()`` bound.

    Raises:
        AddonError: A file was refused, or a CRD was not Established by the deadline.
    """
    for path in paths:
        done = cluster.kubectl(
            "apply", "--server-side", "--force-conflicts", "--field-manager=devcluster", "-f", str(path), check=False
        )
        if done.returncode != 0:
            raise AddonError(f"applying {path}: {done.stderr.strip()}")
    api = _http.ApiServer(cluster.server, cluster.ca_cert, cluster.admin_token)
    for name in names:
        if _process.wait_until(functools.partial(established, api, name), deadline, []) is not None:
            raise AddonError(f"CRD {name} was not Established in time")


def established(api: _http.ApiServer, name: str) -> bool:
    """Whether the CRD ``name`` reports Established=True."""
    crd = api.get_json(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{name}") or {}
    return _condition_true(crd, "Established")


def api_service_available(api: _http.ApiServer, name: str) -> bool:
    """Whether the APIService ``name`` reports Available=True (the aggregator reaches its backend)."""
    return _condition_true(api.get_json(f"/apis/apiregistration.k8s.io/v1/apiservices/{name}") or {}, "Available")


def _condition_true(obj: dict, kind: str) -> bool:
    conditions = (obj.get("status") or {}).get("conditions") or []
    return any(c.get("type") == kind and c.get("status") == "True" for c in conditions)
