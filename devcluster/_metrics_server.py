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

import pathlib

from devcluster import _addon
from devcluster import _components
from devcluster import _versions

NAMESPACE = "kube-system"
SERVICE = "metrics-server"
GROUP = "metrics.k8s.io"
VERSION = "v1beta1"
API_SERVICE = f"{VERSION}.{GROUP}"


class MetricsServerError(_addon.AddonError):
    """Raised when metrics-server exits or does not serve node metrics in time (with its log tail)."""


class MetricsServer(_addon.Addon):
    """metrics-server serving a started :class:`devcluster.Cluster`.

    :meth:`start` returns once the APIService is Available and the resource metrics API answers. Samples come
    later: a node or pod appears in the API after two scrapes (CPU is a rate), and a fake node only while it runs
    pods (kwok reports an empty node's usage as 0, which metrics-server drops).

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with MetricsServer(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("top", "nodes")
    """

    name = "metrics-server"
    version = _versions.METRICS_SERVER
    log_name = "metrics-server"
    error = MetricsServerError

    def _install(self, deadline: float) -> None:
        _addon.register_api(self._api, GROUP, VERSION, SERVICE, NAMESPACE, self.cluster.ports.metrics_server)

    def _spawn(self, binary: pathlib.Path) -> None:
        cluster = self.cluster
        self._start_process(
            self.log_name, _components.metrics_server(cluster.workdir, cluster.kubeconfig, cluster.ports, binary)
        )

    def _ready(self, deadline: float) -> None:
        self._wait("APIService Available", deadline, self.available)
        self._wait("the metrics API to answer", deadline, self._serving)

    def available(self) -> bool:
        """Whether the APIService reports Available=True (the aggregator reaches metrics-server)."""
        return _addon.api_service_available(self._api, API_SERVICE)

    def _serving(self) -> bool:
        return self._api.request("GET", "/apis/metrics.k8s.io/v1beta1/nodes")[0] == 200

    def _unregister(self) -> None:
        _addon.unregister_api(self._api, GROUP, VERSION, SERVICE, NAMESPACE)
