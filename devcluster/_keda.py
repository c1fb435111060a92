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

import pathlib

from devcluster import _addon
from devcluster import _components
from devcluster import _gomod
from devcluster import _http
from devcluster import _pki
from devcluster import _ports
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
GROUP = "external.metrics.k8s.io"
VERSION = "v1beta1"
API_SERVICE = f"{VERSION}.{GROUP}"
ADAPTER = "keda-adapter"
"""The adapter's process name (its log: ``keda-adapter.log``); the operator's is ``keda-operator``."""


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

    :meth:`start` returns once the CRDs are Established, the operator's ``/readyz`` answers 200 and the APIService
    is Available. :meth:`stop` leaves the CRDs, and so ScaledObjects and the HPAs KEDA made for them (delete them
    while KEDA runs).

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Keda(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("apply", "-f", "examples/autoscaling/keda-scaledobject.yaml")
    """

    name = "keda"
    version = _versions.KEDA
    log_name = "keda-operator"
    error = KedaError

    @property
    def adapter_log_path(self) -> pathlib.Path:
        """The adapter's log file under the cluster's log folder."""
        return self.log_file(ADAPTER)

    def _install(self, deadline: float) -> None:
        _addon.apply_crds(self.cluster, crd_paths(_gomod.module_dir(_gomod.SHARED_ADDONS, MODULE)), CRD_NAMES, deadline)
        _addon.register_api(self._api, GROUP, VERSION, SERVICE, NAMESPACE, self.cluster.ports.keda_adapter)

    def _spawn(self, binary: pathlib.Path) -> None:
        cluster = self.cluster
        cert_dir = _pki.mutual_tls(cluster.workdir / "keda-certs", "keda")
        operator_argv, adapter_argv, env = _components.keda(cluster.kubeconfig, cluster.ports, binary.parent, cert_dir)
        self._start_process(self.log_name, operator_argv, env)
        self._start_process(ADAPTER, adapter_argv, env)

    def _ready(self, deadline: float) -> None:
        readyz = f"http://{_ports.HOST}:{self.cluster.ports.keda_health}/readyz"
        self._wait(f"{readyz} to answer", deadline, lambda: _http.healthy(readyz))
        self._wait("APIService Available", deadline, self.available)

    def available(self) -> bool:
        """Whether the APIService reports Available=True (the aggregator reaches the adapter)."""
        return _addon.api_service_available(self._api, API_SERVICE)

    def _unregister(self) -> None:
        _addon.unregister_api(self._api, GROUP, VERSION, SERVICE, NAMESPACE)
