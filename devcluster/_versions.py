"""Pinned versions of every binary the dev cluster builds (the single place to bump them)."""

KUBERNETES = "v1.34.4"
"""k8s.io/kubernetes release; its staging modules are published as v0.<minor>.<patch>."""

KUBERNETES_BUILD_DATE = "2026-02-10T12:53:36Z"
"""Commit time of the KUBERNETES tag (``Time`` in the module proxy's ``.info``); stamped as buildDate."""

ETCD = "v3.6.16"
"""go.etcd.io/etcd/server/v3 release (Kubernetes 1.34 documents etcd 3.5.11+ or 3.6)."""

KWOK = "v0.8.0"
"""sigs.k8s.io/kwok release; its stage configs are read from the module at this version."""

HELM = "v3.22.0"
"""helm.sh/helm/v3 release."""

COREDNS = "v1.12.1"
"""github.com/coredns/coredns release: the real node's cluster DNS (kubernetes plugin), run as a host process."""

METRICS_SERVER = "v0.9.0"
"""sigs.k8s.io/metrics-server release (no replace directives): the resource metrics API behind HPAs, an add-on
component built on demand (``_build.build_addon``), never with the control plane."""

KARPENTER = "v1.13.0"
"""sigs.k8s.io/karpenter release (no replace directives; go 1.26.4): its kwok provider (main package ``kwok/``) is
the node autoscaler add-on, built on demand like :data:`METRICS_SERVER`. Its CRDs are read from the module at this
version."""

KEDA = "v2.21.0"
"""github.com/kedacore/keda/v2 release (go 1.26.0; one ``replace`` of a published module, repeated by the wrapper):
its operator (``cmd/operator``) and metrics API server (``cmd/adapter``) are the event-driven autoscaling add-on,
built on demand like :data:`METRICS_SERVER`. Its CRDs are read from the module at this version."""

KUEUE = "v0.17.0"
"""sigs.k8s.io/kueue release (no replace directives; go 1.25.0; the only version the module proxy lists here): its
manager (``cmd/kueue``) is the gang admission add-on for trainer Jobs, built on demand like :data:`METRICS_SERVER`.
Its CRDs are read from the module at this version."""


def staging_version(kubernetes: str = KUBERNETES) -> str:
    """Return the tag of the staging modules (k8s.io/api, ...) that ship with a Kubernetes release.

    Args:
        kubernetes (str, optional): A Kubernetes tag such as ``"v1.34.4"``. Defaults to :data:`KUBERNETES`.

    Returns:
        str: The staging tag, ``"v0.34.4"`` for ``"v1.34.4"`` (the published-modules convention of
        kubernetes/staging/README.md).
    """
    major, minor, patch = kubernetes.lstrip("v").split(".")
    del major
    return f"v0.{minor}.{patch}"
