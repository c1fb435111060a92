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
import os
import pathlib
from collections.abc import Callable
from typing import ClassVar
from typing import Self

from devcluster import _build
from devcluster import _cluster
from devcluster import _http
from devcluster import _ports
from devcluster import _process


class AddonError(RuntimeError):
    """Raised when an add-on exits, is not ready in time, or its objects are refused (with its log tail)."""


START_TIMEOUT_SECONDS = 120.0
"""Bound for an add-on's start after its build: its objects installed (CRDs Established), its processes started
and its readiness checks passed."""


class Addon(_process.Supervisor):
    """An add-on serving a started :class:`devcluster.Cluster` from host processes: ``with`` starts and stops it.

    :meth:`start` is one template: build (or find cached) the binaries, :meth:`_install` the objects it needs,
    :meth:`_spawn` its processes, :meth:`_ready` (its waits), log. :meth:`stop` runs :meth:`_unregister`, then
    stops the processes. Subclasses set :attr:`name`, :attr:`version`, :attr:`log_name` and :attr:`error`.

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Attributes:
        name (str): Its key in ``_build.ADDONS``, and the name in its messages.
        version (str): Its pinned version (``_versions``), for messages.
        log_name (str): Its (first) process's name; its log is ``<log_name>.log`` in the cluster's log folder.
        error (type[AddonError]): What its waits raise.
        start_seconds (float): Seconds from the end of the build to ready, set by :meth:`start`.
    """

    name: ClassVar[str]
    version: ClassVar[str]
    log_name: ClassVar[str]
    error: ClassVar[type[Exception]] = AddonError

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.start_seconds = 0.0
        self.processes: list[_process.Managed] = []
        self._log = log
        self._api = _http.ApiServer(cluster.server, cluster.ca_cert, cluster.admin_token)

    @property
    def log_path(self) -> pathlib.Path:
        """Its (first) process's log file (stdout and stderr) under the cluster's log folder."""
        return self.log_file(self.log_name)

    def log_file(self, process: str) -> pathlib.Path:
        """The log file of one of its processes, by name, under the cluster's log folder."""
        return self.cluster.log_dir / f"{process}.log"

    def log_paths(self) -> list[pathlib.Path]:
        """Its processes' logs, in start order."""
        return [process.log_path for process in self.processes]

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> Self:
        """Build (or find cached) the add-on, install its objects, start its processes and wait until it is ready;
        on any failure stop what was started.

        Args:
            timeout (float, optional): Seconds after the build. Defaults to :data:`START_TIMEOUT_SECONDS`.

        Returns:
            Self: ``self``.

        Raises:
            AddonError: A process exited or was not ready in time (its own subclass, with the log tails); an object
                was refused, or a CRD was not Established in time.
            _gomod.ModuleCacheError: The module's folder (CRDs, manifests) could not be found.
            _build.BuildError: The build failed.
            _pki.PKIError: ``openssl`` failed (KEDA's certificates).
        """
        binary = _build.build_addon(self.name, log=self._log)

        def steps(deadline: float) -> None:
            self._install(deadline)
            self._spawn(binary)
            self._ready(deadline)

        self.start_seconds = self._start_or_stop(steps, timeout)
        self._log(f"devcluster: {self.name} {self.version} ready after {self.start_seconds:.1f}s")
        return self

    def _install(self, deadline: float) -> None:
        """Create what it needs in the cluster before it runs (CRDs, Services, webhooks); nothing by default."""

    def _spawn(self, binary: pathlib.Path) -> None:
        """Start its processes with :meth:`_start_process` (``binary``: the first binary :meth:`start` built)."""
        raise NotImplementedError

    def _ready(self, deadline: float) -> None:
        """Wait (with :meth:`_wait`) until it serves; raise :attr:`error` otherwise."""
        raise NotImplementedError

    def _unregister(self) -> None:
        """Remove what would fail without its processes (APIServices, webhooks); idempotent; nothing by default."""

    def _start_process(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        """Start one of its processes, tied to this Python process, logging to :meth:`log_file` of ``name``.

        Args:
            name (str): The process's name (its log file's stem).
            argv (list[str]): The command.
            env (dict[str, str] | None, optional): Variables added to this process's environment. Defaults to None.
        """
        full_env = {**os.environ, **env} if env is not None else None
        self.processes.append(_process.start(name, argv, self.log_file(name), detach=False, env=full_env))

    def stop(self) -> None:
        """Unregister it, then stop its processes (reverse start order; SIGTERM, then SIGKILL, by process group).

        Idempotent.
        """
        self._unregister()
        while self.processes:
            _process.stop(self.processes.pop())

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


def register_api(api: _http.ApiServer, group: str, version: str, service: str, namespace: str, port: int) -> None:
    """Register a host process for ``<group>/<version>`` with the aggregation layer: its
    :func:`external_name_service` and :func:`api_service` (either left as it is when it exists).

    Args:
        api (_http.ApiServer): The admin client.
        group (str): API group (``"metrics.k8s.io"``).
        version (str): API version (``"v1beta1"``).
        service (str): The Service's name.
        namespace (str): Its namespace (must exist).
        port (int): The process's secure port.

    Raises:
        AddonError: An object was refused.
    """
    create(api, f"/api/v1/namespaces/{namespace}/services", external_name_service(service, namespace, port))
    create(api, "/apis/apiregistration.k8s.io/v1/apiservices", api_service(group, version, service, namespace, port))


def unregister_api(api: _http.ApiServer, group: str, version: str, service: str, namespace: str) -> None:
    """Delete what :func:`register_api` created (the APIService first: it fails without its backend); idempotent."""
    api.request("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{version}.{group}")
    api.request("DELETE", f"/api/v1/namespaces/{namespace}/services/{service}")


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
