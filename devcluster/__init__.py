"""devcluster: a real Kubernetes control plane on loopback for tests and local trials, built from Go modules.

What belongs here: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl (k8s.io/kubernetes
at a pinned release), etcd, kwok and helm from small wrapper modules in ``go/`` into a cache outside the repo;
starting them as a cluster with fake kwok nodes; stopping every process it started. Nothing here imports
``rlightning`` or the operator; tests reach it through the fixtures in ``tests/conftest.py``.

Command line: ``python -m devcluster build|up|down|status|gomod``. Pinned versions live in ``_versions.py``.
"""

from devcluster._build import BuildError, BuildResult, build
from devcluster._cli import main
from devcluster._cluster import Cluster, ClusterError, launch
from devcluster._ports import PortInUseError, Ports
from devcluster._versions import ETCD, HELM, KUBERNETES, KWOK

__all__ = [
    "ETCD",
    "HELM",
    "KUBERNETES",
    "KWOK",
    "BuildError",
    "BuildResult",
    "Cluster",
    "ClusterError",
    "PortInUseError",
    "Ports",
    "build",
    "launch",
    "main",
]
