"""metrics-server on a running dev cluster: the resource metrics API (``metrics.k8s.io``) that HPAs and
``kubectl top`` read, as a host process registered through the API server's aggregation layer.

Built on demand from its Go module (``_build.build_addon("metrics-server")``, cached under its own key), started
with :func:`_components.metrics_server`, registered with a Service of type ExternalName pointing at 127.0.0.1
(the aggregator resolves such a Service to its external name and the APIService's port, the way kwokctl
registers a local metrics-server) and an APIService ``v1beta1.metrics.k8s.io``. It scrapes kwok's simulated
kubelet metrics of the fake nodes; a pod's usage comes from its ``kwok.x-k8s.io/usage-cpu`` and ``-memory``
annotations (``kwok/usage-from-annotation.yaml``). Stopped by pid; the APIService and Service are deleted.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from devcluster import _addon
from devcluster import _build
from devcluster import _cluster
from devcluster import _components
from devcluster import _process

NAMESPACE = "kube-system"
SERVICE = "metrics-server"
API_SERVICE = "v1beta1.metrics.k8s.io"
START_TIMEOUT_SECONDS = 120.0
"""Bound for the APIService to be Available and the resource metrics API to answer through it."""


class MetricsServerError(_addon.AddonError):
    """Raised when metrics-server exits or does not serve node metrics in time (with its log tail)."""


class MetricsServer(_addon.Addon):
    """metrics-server serving a started :class:`devcluster.Cluster`.

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with MetricsServer(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("top", "nodes")
    """

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        super().__init__(cluster, log)
        self.process: _process.Managed | None = None

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> MetricsServer:
        """Build (or find cached) metrics-server, start it, register it and wait until its API answers.

        Samples come later: a node or pod appears in the API after two scrapes (CPU is a rate), and a fake node
        only while it runs pods (kwok reports an empty node's usage as 0, which metrics-server drops).

        Args:
            timeout (float, optional): Seconds after the build. Defaults to :data:`START_TIMEOUT_SECONDS`.

        Returns:
            MetricsServer: ``self``.

        Raises:
            MetricsServerError: It exited, or the API or node metrics did not appear in time.
            _addon.AddonError: The Service or the APIService was refused.
            _build.BuildError: The build failed.
        """
        binary = _build.build_addon("metrics-server", log=self._log)
        began = time.monotonic()
        cluster = self.cluster
        argv = _components.metrics_server(cluster.workdir, cluster.kubeconfig, cluster.ports, binary)
        self.process = process = _process.start(
            "metrics-server", argv, cluster.log_dir / "metrics-server.log", detach=False
        )
        try:
            port = cluster.ports.metrics_server
            _addon.create(self._api, f"/api/v1/namespaces/{NAMESPACE}/services",
                          _addon.external_name_service(SERVICE, NAMESPACE, port))
            _addon.create(self._api, "/apis/apiregistration.k8s.io/v1/apiservices",
                          _addon.api_service("metrics.k8s.io", "v1beta1", SERVICE, NAMESPACE, port))
            self._wait(process, "APIService Available", began + timeout, self.available)
            self._wait(process, "the metrics API to answer", began + timeout, self._serving)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        self._log(f"devcluster: metrics-server serving the metrics API after {self.start_seconds:.1f}s")
        return self

    @staticmethod
    def _wait(process: _process.Managed, what: str, deadline: float, check: Callable[[], bool]) -> None:
        failure = _process.wait_until(check, deadline, [process])
        if failure is not None:
            tail = _process.log_tail(process.log_path)
            reason = "timed out" if failure == _process.TIMED_OUT else failure
            raise MetricsServerError(f"metrics-server: waiting for {what}: {reason}\n{tail}")

    def available(self) -> bool:
        """Whether the APIService reports Available=True (the aggregator reaches metrics-server)."""
        return _addon.api_service_available(self._api, API_SERVICE)

    def _serving(self) -> bool:
        return self._api.request("GET", "/apis/metrics.k8s.io/v1beta1/nodes")[0] == 200

    def stop(self) -> None:
        """Unregister and stop it (SIGTERM, then SIGKILL, by its process group); idempotent."""
        self._api.request("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}")
        self._api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")
        if self.process is not None:
            _process.stop(self.process)
            self.process = None
