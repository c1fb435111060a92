"""KEDA on a running dev cluster: event-driven pod autoscaling (ScaledObjects), as two host processes.

Built on demand from its Go module (``_build.build_addon("keda")``: ``keda-operator`` from ``cmd/operator`` and
``keda-adapter`` from ``cmd/adapter``, cached under their own key; the admission webhooks are not built).
:meth:`Keda.start` installs the CRDs that ship in the module at the pinned version (``config/crd/bases``:
ScaledObject, ScaledJob, TriggerAuthentication, ClusterTriggerAuthentication), writes a mutual-TLS folder for the
operator-adapter gRPC link (``_pki.mutual_tls``), starts both processes with the admin kubeconfig
(``_components.keda``), registers the adapter for ``external.metrics.k8s.io`` the way metrics-server is registered
(a Service of type ExternalName pointing at 127.0.0.1 and an APIService ``v1beta1.external.metrics.k8s.io``) and
waits until the operator's ``/readyz`` answers and the APIService is Available.

How a ScaledObject scales: the operator creates and owns an HPA (``keda-hpa-<name>``) on the ScaledObject's
``scaleTargetRef`` (any resource with a /scale subresource) with one External metric per trigger; the cluster's HPA
controller reads that metric through the aggregation layer from the adapter, which asks the operator over gRPC, and
the operator runs the trigger's scaler (for ``metrics-api``: an HTTP GET of the URL). Stopped by pid; the
APIService and Service are deleted, the CRDs stay.
"""

from __future__ import annotations

import os
import pathlib
import time
from collections.abc import Callable

from devcluster import _addon
from devcluster import _build
from devcluster import _cluster
from devcluster import _components
from devcluster import _gomod
from devcluster import _http
from devcluster import _pki
from devcluster import _ports
from devcluster import _process
from devcluster import _versions

MODULE = "github.com/kedacore/keda/v2"
"""The Go module the add-on is built from (and its CRDs are read from)."""

CRD_FILES = (
    "config/crd/bases/keda.sh_scaledobjects.yaml",
    "config/crd/bases/keda.sh_scaledjobs.yaml",
    "config/crd/bases/keda.sh_triggerauthentications.yaml",
    "config/crd/bases/keda.sh_clustertriggerauthentications.yaml",
)
"""CRD files under the module folder. The eventing CRDs (CloudEventSource, ClusterCloudEventSource) are installed
too (:data:`EVENTING_CRD_FILES`), as KEDA's own chart does: the operator runs a controller for each, which watches
their kinds."""

EVENTING_CRD_FILES = (
    "config/crd/bases/eventing.keda.sh_cloudeventsources.yaml",
    "config/crd/bases/eventing.keda.sh_clustercloudeventsources.yaml",
)
"""The eventing CRDs the operator watches (it runs a controller for each)."""

CRD_NAMES = (
    "scaledobjects.keda.sh",
    "scaledjobs.keda.sh",
    "triggerauthentications.keda.sh",
    "clustertriggerauthentications.keda.sh",
    "cloudeventsources.eventing.keda.sh",
    "clustercloudeventsources.eventing.keda.sh",
)
"""Names of the CRDs in :data:`CRD_FILES` and :data:`EVENTING_CRD_FILES`, in that order."""

NAMESPACE = _components.KEDA_NAMESPACE
SERVICE = "keda-metrics-apiserver"
API_SERVICE = "v1beta1.external.metrics.k8s.io"
START_TIMEOUT_SECONDS = 120.0
"""Bound for the CRDs to be Established, the operator's ``/readyz`` to answer 200 and the APIService to be
Available."""


class KedaError(_addon.AddonError):
    """Raised when KEDA exits or is not ready in time (with its logs' tails)."""


def crd_paths(folder: pathlib.Path) -> list[pathlib.Path]:
    """Return the CRD files of :data:`CRD_FILES` and :data:`EVENTING_CRD_FILES` under a module folder.

    Args:
        folder (pathlib.Path): The module folder (``_gomod.module_dir``).

    Returns:
        list[pathlib.Path]: One path per CRD, in :data:`CRD_NAMES` order.
    """
    return [folder / relative for relative in CRD_FILES + EVENTING_CRD_FILES]


class Keda(_addon.Addon):
    """KEDA's operator and metrics adapter serving a started :class:`devcluster.Cluster`.

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Keda(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("apply", "-f", "examples/autoscaling/keda-scaledobject.yaml")
    """

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        super().__init__(cluster, log)
        self.operator: _process.Managed | None = None
        self.adapter: _process.Managed | None = None

    @property
    def log_path(self) -> pathlib.Path:
        """The operator's log file (stdout and stderr) under the cluster's log folder."""
        return self.cluster.log_dir / "keda-operator.log"

    @property
    def adapter_log_path(self) -> pathlib.Path:
        """The adapter's log file under the cluster's log folder."""
        return self.cluster.log_dir / "keda-adapter.log"

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> Keda:
        """Build (or find cached) KEDA, install its CRDs, start both processes, register the adapter and wait.

        Args:
            timeout (float, optional): Seconds after the build. Defaults to :data:`START_TIMEOUT_SECONDS`.

        Returns:
            Keda: ``self``.

        Raises:
            KedaError: A process exited, or the operator was not ready or the APIService not Available in time.
            _addon.AddonError: A CRD, the Service or the APIService was refused, or a CRD was not Established in
                time.
            _gomod.ModuleCacheError: The module's folder could not be found.
            _build.BuildError: The build failed.
            _pki.PKIError: ``openssl`` failed.
        """
        binary = _build.build_addon("keda", log=self._log)
        began = time.monotonic()
        deadline = began + timeout
        cluster = self.cluster
        _addon.apply_crds(cluster, crd_paths(_gomod.module_dir("keda", MODULE)), CRD_NAMES, deadline)
        cert_dir = _pki.mutual_tls(cluster.workdir / "keda-certs", "keda")
        operator_argv, adapter_argv, extra_env = _components.keda(
            cluster.kubeconfig, cluster.ports, binary.parent, cert_dir
        )
        env = {**os.environ, **extra_env}
        try:
            self.operator = _process.start("keda-operator", operator_argv, self.log_path, detach=False, env=env)
            self.adapter = _process.start("keda-adapter", adapter_argv, self.adapter_log_path, detach=False, env=env)
            port = cluster.ports.keda_adapter
            _addon.create(self._api, f"/api/v1/namespaces/{NAMESPACE}/services",
                          _addon.external_name_service(SERVICE, NAMESPACE, port))
            _addon.create(self._api, "/apis/apiregistration.k8s.io/v1/apiservices",
                          _addon.api_service("external.metrics.k8s.io", "v1beta1", SERVICE, NAMESPACE, port))
            readyz = f"http://{_ports.HOST}:{cluster.ports.keda_health}/readyz"
            self._wait(f"{readyz} to answer", deadline, lambda: _http.healthy(readyz))
            self._wait("APIService Available", deadline, self.available)
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - began
        self._log(f"devcluster: keda {_versions.KEDA} ready after {self.start_seconds:.1f}s")
        return self

    def _wait(self, what: str, deadline: float, check: Callable[[], bool]) -> None:
        processes = [p for p in (self.operator, self.adapter) if p is not None]
        failure = _process.wait_until(check, deadline, processes)
        if failure is not None:
            reason = "timed out" if failure == _process.TIMED_OUT else failure
            tails = "\n".join(
                f"--- {path.name} ---\n{_process.log_tail(path)}" for path in (self.log_path, self.adapter_log_path)
            )
            raise KedaError(f"keda: waiting for {what}: {reason}\n{tails}")

    def available(self) -> bool:
        """Whether the APIService reports Available=True (the aggregator reaches the adapter)."""
        return _addon.api_service_available(self._api, API_SERVICE)

    def stop(self) -> None:
        """Unregister the adapter and stop both processes (SIGTERM, then SIGKILL, by process group); idempotent.

        The CRDs stay, and so do ScaledObjects and the HPAs KEDA made for them (delete them while KEDA runs).
        """
        self._api.request("DELETE", f"/apis/apiregistration.k8s.io/v1/apiservices/{API_SERVICE}")
        self._api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}/services/{SERVICE}")
        for attribute in ("adapter", "operator"):
            process = getattr(self, attribute)
            if process is not None:
                _process.stop(process)
                setattr(self, attribute, None)
