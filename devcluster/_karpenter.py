"""Karpenter (its kwok provider) on a running dev cluster: node autoscaling of fake nodes, as a host process.

Built on demand from its Go module (``_build.build_addon("karpenter")``, binary ``karpenter-kwok``, cached under
its own key). :meth:`Karpenter.start` installs the CRDs that ship in the module at the pinned version (NodePool,
NodeClaim and NodeOverlay from ``kwok/charts/crds``, KWOKNodeClass from ``kwok/apis/crds``), starts Karpenter with
the admin kubeconfig, leader election off and the instance types of ``karpenter/instance-types.json``, and waits
for its ``/readyz``.

How its nodes come to life: for a NodeClaim the kwok provider creates a Node itself, annotated
``kwok.x-k8s.io/node: fake`` (the annotation the dev cluster's kwok manages, ``_nodes.KWOK_ANNOTATION``) and
tainted ``karpenter.sh/unregistered:NoExecute``. kwok's node-initialize Stage makes it Ready and keeps the
capacity Karpenter wrote; Karpenter's own registration step removes the taint once it sees the Node (as it does
for a kubelet that registered with it). A NodePool provisions only while its node class is Ready; the provider
runs no controller for its KWOKNodeClass, whose CRD defaults the status to Ready. Stopped by pid; the nodes it
made stay (delete the NodePool while it runs to remove them).
"""

from __future__ import annotations

import pathlib

from devcluster import _addon
from devcluster import _components
from devcluster import _gomod
from devcluster import _http
from devcluster import _ports
from devcluster import _versions

MODULE = "sigs.k8s.io/karpenter"
"""The Go module the add-on is built from (and its CRDs are read from)."""

CRD_FILES = (
    "kwok/charts/crds/karpenter.sh_nodepools.yaml",
    "kwok/charts/crds/karpenter.sh_nodeclaims.yaml",
    "kwok/charts/crds/karpenter.sh_nodeoverlays.yaml",
    "kwok/apis/crds/karpenter.kwok.sh_kwoknodeclasses.yaml",
)
"""CRD files under the module folder: what the provider's own chart installs (``kwok/charts/crds``, whose NodePool
and NodeClaim allow the ``karpenter.kwok.sh`` label domain, ``hack/kwok/requirements.sh``) and the node class.
NodeOverlay is only read with the ``NodeOverlay`` feature gate on (off by default); it is installed as the chart
does."""

CRD_NAMES = (
    "nodepools.karpenter.sh",
    "nodeclaims.karpenter.sh",
    "nodeoverlays.karpenter.sh",
    "kwoknodeclasses.karpenter.kwok.sh",
)
"""Names of the CRDs in :data:`CRD_FILES`, in the same order."""


class KarpenterError(_addon.AddonError):
    """Raised when Karpenter exits or is not ready in time (with its log tail)."""


def crd_paths(folder: pathlib.Path) -> list[pathlib.Path]:
    """Return the CRD files of :data:`CRD_FILES` under a module folder.

    Args:
        folder (pathlib.Path): The module folder (``_gomod.module_dir``).

    Returns:
        list[pathlib.Path]: One path per CRD, in :data:`CRD_FILES` order.
    """
    return [folder / relative for relative in CRD_FILES]


class Karpenter(_addon.Addon):
    """Karpenter's kwok provider autoscaling the fake nodes of a started :class:`devcluster.Cluster`.

    :meth:`start` returns once the CRDs are Established and its ``/readyz`` answers 200 (its caches synced).
    :meth:`stop` leaves the CRDs and its nodes.

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Karpenter(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("apply", "-f", "examples/autoscaling/nodepool.yaml")
    """

    name = "karpenter"
    version = _versions.KARPENTER
    log_name = "karpenter"
    error = KarpenterError

    def _install(self, deadline: float) -> None:
        _addon.apply_crds(self.cluster, crd_paths(_gomod.module_dir(_gomod.SHARED_ADDONS, MODULE)), CRD_NAMES, deadline)

    def _spawn(self, binary: pathlib.Path) -> None:
        argv, env = _components.karpenter(
            self.cluster.kubeconfig, self.cluster.ports, binary, _components.KARPENTER_INSTANCE_TYPES
        )
        self._start_process(self.log_name, argv, env)

    def _ready(self, deadline: float) -> None:
        readyz = f"http://{_ports.HOST}:{self.cluster.ports.karpenter_health}/readyz"
        self._wait(f"{readyz} to answer", deadline, lambda: _http.healthy(readyz))
