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
from devcluster import _ports
from devcluster import _process
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

START_TIMEOUT_SECONDS = 120.0
"""Bound for the CRDs to be Established and Karpenter's ``/readyz`` to answer 200 (its caches synced)."""


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

    Args:
        cluster (_cluster.Cluster): The running control plane (started by this process or attached).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Karpenter(cluster):  # doctest: +SKIP
        ...     cluster.kubectl("apply", "-f", "examples/autoscaling/nodepool.yaml")
    """

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        super().__init__(cluster, log)
        self.process: _process.Managed | None = None

    @property
    def log_path(self) -> pathlib.Path:
        """Karpenter's log file (stdout and stderr) under the cluster's log folder."""
        return self.cluster.log_dir / "karpenter.log"

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> Karpenter:
        """Build (or find cached) Karpenter, install its CRDs, start it and wait until it is ready.

        Args:
            timeout (float, optional): Seconds after the build. Defaults to :data:`START_TIMEOUT_SECONDS`.

        Returns:
            Karpenter: ``self``.

        Raises:
            KarpenterError: Karpenter exited or was not ready in time.
            _addon.AddonError: A CRD was refused or not Established in time.
            _build.BuildError: The build failed.
            _gomod.ModuleCacheError: The module's folder could not be found.
        """
        binary = _build.build_addon("karpenter", log=self._log)
        began = time.monotonic()
        deadline = began + timeout
        _addon.apply_crds(self.cluster, crd_paths(_gomod.module_dir("karpenter", MODULE)), CRD_NAMES, deadline)
        argv, env = _components.karpenter(
            self.cluster.kubeconfig, self.cluster.ports, binary, _components.KARPENTER_INSTANCE_TYPES
        )
        self.process = process = _process.start(
            "karpenter", argv, self.log_path, detach=False, env={**os.environ, **env}
        )
        readyz = f"http://{_ports.HOST}:{self.cluster.ports.karpenter_health}/readyz"
        failure = _process.wait_until(lambda: _http.healthy(readyz), deadline, [process])
        if failure is not None:
            self.stop()
            reason = "timed out" if failure == _process.TIMED_OUT else failure
            raise KarpenterError(f"karpenter: waiting for {readyz}: {reason}\n{_process.log_tail(self.log_path)}")
        self.start_seconds = time.monotonic() - began
        self._log(f"devcluster: karpenter {_versions.KARPENTER} ready after {self.start_seconds:.1f}s")
        return self

    def stop(self) -> None:
        """Stop it (SIGTERM, then SIGKILL, by its process group); idempotent. The CRDs and its nodes stay."""
        if self.process is not None:
            _process.stop(self.process)
            self.process = None
