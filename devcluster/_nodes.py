"""Fake nodes that kwok manages: pure manifests, no I/O.

kwok takes over every Node carrying the annotation :data:`KWOK_ANNOTATION` (``kwok --manage-nodes-with-
annotation-selector``) and, through the node-initialize Stage, keeps the capacity given here. There is no taint:
no real kubelet exists in the dev cluster, so pods need no toleration to land on these nodes.
"""

from __future__ import annotations

KWOK_ANNOTATION = "kwok.x-k8s.io/node"
"""Annotation key selecting the nodes kwok manages (value :data:`KWOK_ANNOTATION_VALUE`)."""

KWOK_ANNOTATION_VALUE = "fake"
"""Annotation value, as in kwok's documentation."""

GPU_RESOURCE = "nvidia.com/gpu"
"""Extended resource advertised by the GPU nodes."""

NODE_COUNT = 4
"""Number of fake nodes."""

GPU_NODES = 2
"""How many of them (the last ones) advertise :data:`GPU_RESOURCE`."""

CAPACITY = {"cpu": "32", "memory": "256Gi", "pods": "500", "ephemeral-storage": "1Ti"}
"""Capacity of every node: 4 x 500 pods hold a 1000-pod benchmark twice over."""

GPUS_PER_NODE = "8"
"""``nvidia.com/gpu`` on each GPU node."""

RESOURCE_METRICS_PATH_ANNOTATION = "metrics.k8s.io/resource-metrics-path"
"""Node annotation metrics-server (v0.7+) scrapes instead of ``/metrics/resource``: kwok serves every fake node's
resource metrics on its one server under a per-node path (``kwok/metrics-resource.yaml``)."""


def resource_metrics_path(name: str) -> str:
    """Return the path of node ``name``'s resource metrics on kwok's server (``Metric`` metrics-resource)."""
    return f"/metrics/nodes/{name}/metrics/resource"


def node_name(index: int) -> str:
    """Return the name of fake node ``index`` (``kwok-node-0`` ...)."""
    return f"kwok-node-{index}"


def pod_cidr(index: int) -> str:
    """Return the pod CIDR of fake node ``index``: a /23 (510 addresses, more than its 500 pods) in 10.244.0.0/16.

    kwok assigns fake pod IPs from the node's ``spec.podCIDRs``, so IPs are unique across nodes.
    """
    return f"10.244.{2 * index}.0/23"


def node_manifest(index: int, gpu: bool) -> dict:
    """Return one fake Node.

    Args:
        index (int): Node number, used in the name and the ``kubernetes.io/hostname`` label.
        gpu (bool): Whether it advertises ``nvidia.com/gpu: 8`` and carries ``rlightning.dev/gpu=true``.

    Returns:
        dict: A v1 Node with its own pod CIDR and status.capacity and status.allocatable set (kept by kwok's
        node-initialize Stage).
    """
    capacity = dict(CAPACITY)
    if gpu:
        capacity[GPU_RESOURCE] = GPUS_PER_NODE
    name = node_name(index)
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": name,
            "annotations": {
                KWOK_ANNOTATION: KWOK_ANNOTATION_VALUE,
                "node.alpha.kubernetes.io/ttl": "0",
                RESOURCE_METRICS_PATH_ANNOTATION: resource_metrics_path(name),
            },
            "labels": {
                "type": "kwok",
                "kubernetes.io/arch": "amd64",
                "kubernetes.io/os": "linux",
                "kubernetes.io/hostname": name,
                "node.kubernetes.io/instance-type": "kwok-gpu" if gpu else "kwok-cpu",
                "rlightning.dev/gpu": "true" if gpu else "false",
            },
        },
        "spec": {"podCIDR": pod_cidr(index), "podCIDRs": [pod_cidr(index)]},
        "status": {"capacity": capacity, "allocatable": dict(capacity)},
    }


def all_nodes() -> list[dict]:
    """Return :data:`NODE_COUNT` nodes; the last :data:`GPU_NODES` have GPUs."""
    return [node_manifest(i, gpu=i >= NODE_COUNT - GPU_NODES) for i in range(NODE_COUNT)]
