"""devcluster: a real Kubernetes control plane on loopback for tests and local trials, built from Go modules.

What belongs here: building kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kubelet
(k8s.io/kubernetes at a pinned release), etcd, kwok, helm and CoreDNS from small wrapper modules in ``go/`` into a
cache outside the repo; starting them as a cluster with fake kwok nodes and, on demand, one real node (kubelet,
containerd, bridge CNI, CoreDNS; ``_realnode.py``), metrics-server (an add-on built and cached on its own;
``_metrics_server.py``), Karpenter's kwok provider (node autoscaling, an add-on too; ``_karpenter.py``), KEDA
(event-driven pod autoscaling, an add-on too; ``_keda.py``) and Kueue (gang admission of Jobs; ``_kueue.py``);
stopping every process it started and undoing host changes. Nothing here imports ``rlightning`` or the operator;
tests reach it through the fixtures in ``tests/conftest.py``.

Command line: ``python -m devcluster build|up [--real-node]|down|status|gomod``. Pinned versions live in
``_versions.py``.
"""

from devcluster._build import BuildError, BuildResult, build
from devcluster._cli import main
from devcluster._cluster import Cluster, ClusterError, launch
from devcluster._karpenter import Karpenter, KarpenterError
from devcluster._keda import Keda, KedaError
from devcluster._kueue import Kueue, KueueError
from devcluster._metrics_server import MetricsServer, MetricsServerError
from devcluster._nodeconfig import IMAGE, NODE_LABEL, NODE_NAME
from devcluster._ports import PortInUseError, Ports
from devcluster._realnode import RealNode, RealNodeError
from devcluster._versions import ETCD, HELM, KARPENTER, KEDA, KUBERNETES, KUEUE, KWOK, METRICS_SERVER

__all__ = [
    "ETCD",
    "HELM",
    "IMAGE",
    "KARPENTER",
    "KEDA",
    "KUBERNETES",
    "KUEUE",
    "KWOK",
    "METRICS_SERVER",
    "NODE_LABEL",
    "NODE_NAME",
    "BuildError",
    "BuildResult",
    "Cluster",
    "ClusterError",
    "Karpenter",
    "KarpenterError",
    "Keda",
    "KedaError",
    "Kueue",
    "KueueError",
    "MetricsServer",
    "MetricsServerError",
    "PortInUseError",
    "Ports",
    "RealNode",
    "RealNodeError",
    "build",
    "launch",
    "main",
]
