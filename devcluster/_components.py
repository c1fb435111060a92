"""Command lines of the control-plane components: pure builders (paths and ports in, argv out), no I/O.

Flags follow the Kubernetes 1.34 component references (kubernetes.io/docs/reference/command-line-tools-reference/)
and etcd 3.6's configuration flags.
"""

from __future__ import annotations

import dataclasses
import pathlib

from devcluster import _nodes
from devcluster import _pki
from devcluster import _ports

SERVICE_ACCOUNT_ISSUER = "https://kubernetes.default.svc.cluster.local"
"""``--service-account-issuer`` (also the default API audience)."""

POD_CIDR = "10.244.0.1/16"
"""kwok ``--cidr``: fake pod IPs come from here (65k addresses; nothing routes to them)."""

NODE_LEASE_SECONDS = 40
"""kwok ``--node-lease-duration-seconds``: kwok renews a Lease per node in kube-node-lease (the kubelet default,
40 s). Without the flag kwok v0.8.0 runs with 0 (no leases) when no KwokConfiguration is given, and the node
lifecycle controller marks every node Unknown after its 50 s grace period, flapping pods to NotReady."""

CLIENT_QPS = 200
"""Client QPS of the controller-manager and the scheduler (defaults 20 and 50 make a 1000-pod rollout slow)."""

CLIENT_BURST = 400
"""Client burst matching :data:`CLIENT_QPS`."""

KWOK_NODE_IP = "127.0.0.1"
"""kwok ``--node-ip``: the fake nodes' InternalIP. With ``--node-port`` (kwok's own server port) a node's kubelet
endpoint is kwok's server, which serves each node's resource metrics (:data:`LOCAL_METRICS`) to metrics-server."""

LOCAL_METRICS = tuple(
    pathlib.Path(__file__).parent / "kwok" / name for name in ("metrics-resource.yaml", "usage-from-annotation.yaml")
)
"""kwok configs copied from the pinned module (a ``Metric`` serving kubelet resource metrics per fake node, a
``ClusterResourceUsage`` taking each pod's usage from its ``kwok.x-k8s.io/usage-cpu`` and ``-memory`` annotations,
1m CPU and 1Mi memory without them), loaded like :data:`LOCAL_STAGES`."""

LOCAL_STAGES = (pathlib.Path(__file__).parent / "kwok" / "pod-kill-on-delete.yaml",)
"""kwok Stage files of this package, loaded with the pinned module's (``_build.KWOK_STAGES``).

``pod-kill-on-delete`` makes a deleted pod terminal (Failed, containers terminated with exit code 137) before
kwok's ``pod-delete`` removes it, as a kubelet does; without it a pod whose finalizer waits for a terminal phase
(the Job controller's tracking finalizer on pods of a Job with a podFailurePolicy) never goes, nor does its
namespace."""


@dataclasses.dataclass(frozen=True)
class Layout:
    """Files of one running cluster.

    Attributes:
        workdir (pathlib.Path): Root folder of the cluster (state file, data, credentials, logs).
        bin_dir (pathlib.Path): Folder of the built binaries.
        stages_file (pathlib.Path): kwok Stage configs.
        pki (_pki.PKI): Credentials.
        admin_kubeconfig (pathlib.Path): Admin kubeconfig used by every component.
    """

    workdir: pathlib.Path
    bin_dir: pathlib.Path
    stages_file: pathlib.Path
    pki: _pki.PKI
    admin_kubeconfig: pathlib.Path

    @property
    def log_dir(self) -> pathlib.Path:
        """Folder with one ``<component>.log`` per process."""
        return self.workdir / "logs"

    @property
    def etcd_data(self) -> pathlib.Path:
        """etcd's data folder."""
        return self.workdir / "etcd-data"

    @property
    def scheduler_config(self) -> pathlib.Path:
        """KubeSchedulerConfiguration file written by :func:`scheduler_config`."""
        return self.workdir / "scheduler-config.yaml"


def etcd(layout: Layout, ports: _ports.Ports) -> list[str]:
    """Single-member etcd on loopback, without fsync (test data only)."""
    client = f"http://{_ports.HOST}:{ports.etcd_client}"
    peer = f"http://{_ports.HOST}:{ports.etcd_peer}"
    return [
        str(layout.bin_dir / "etcd"),
        "--name=devcluster",
        f"--data-dir={layout.etcd_data}",
        f"--listen-client-urls={client}",
        f"--advertise-client-urls={client}",
        f"--listen-peer-urls={peer}",
        f"--initial-advertise-peer-urls={peer}",
        f"--initial-cluster=devcluster={peer}",
        "--initial-cluster-state=new",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]


def kube_apiserver(layout: Layout, ports: _ports.Ports) -> list[str]:
    """kube-apiserver with RBAC, a static admin token, client certificates of the CA and ServiceAccount token signing.

    It reaches a real node's kubelet (logs, exec) at the node's InternalIP with a ``system:masters`` client
    certificate; the kubelet's self-signed serving certificate is not verified (no ``--kubelet-certificate-authority``).
    The aggregation layer is configured (front-proxy client certificate and request-header flags, as in
    kubernetes.io/docs/tasks/extend-kubernetes/configure-aggregation-layer/), so that an aggregated API server such
    as metrics-server can be registered with an APIService.
    """
    pki = layout.pki
    return [
        str(layout.bin_dir / "kube-apiserver"),
        f"--etcd-servers=http://{_ports.HOST}:{ports.etcd_client}",
        f"--bind-address={_ports.HOST}",
        f"--advertise-address={_ports.HOST}",
        f"--secure-port={ports.apiserver}",
        f"--tls-cert-file={pki.serving_cert}",
        f"--tls-private-key-file={pki.serving_key}",
        f"--cert-dir={layout.workdir / 'apiserver-certs'}",
        f"--token-auth-file={pki.token_file}",
        "--authorization-mode=Node,RBAC",
        f"--service-account-issuer={SERVICE_ACCOUNT_ISSUER}",
        f"--service-account-key-file={pki.sa_pub}",
        f"--service-account-signing-key-file={pki.sa_key}",
        f"--service-cluster-ip-range={_pki.SERVICE_CLUSTER_IP_RANGE}",
        f"--client-ca-file={pki.ca_cert}",
        f"--kubelet-client-certificate={pki.kubelet_client_cert}",
        f"--kubelet-client-key={pki.kubelet_client_key}",
        "--kubelet-preferred-address-types=InternalIP,Hostname",
        f"--proxy-client-cert-file={pki.proxy_client_cert}",
        f"--proxy-client-key-file={pki.proxy_client_key}",
        f"--requestheader-client-ca-file={pki.ca_cert}",
        f"--requestheader-allowed-names={_pki.FRONT_PROXY_USER}",
        "--requestheader-username-headers=X-Remote-User",
        "--requestheader-group-headers=X-Remote-Group",
        "--requestheader-extra-headers-prefix=X-Remote-Extra-",
        "--allow-privileged=true",
        "--profiling=false",
        "--max-requests-inflight=800",
        "--max-mutating-requests-inflight=400",
    ]


def kube_controller_manager(layout: Layout, ports: _ports.Ports) -> list[str]:
    """kube-controller-manager with every controller (GC, namespace, Job, StatefulSet, ...), no leader election."""
    pki = layout.pki
    kubeconfig = str(layout.admin_kubeconfig)
    return [
        str(layout.bin_dir / "kube-controller-manager"),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={_ports.HOST}",
        f"--secure-port={ports.controller_manager}",
        f"--cert-dir={layout.workdir / 'controller-manager-certs'}",
        "--controllers=*",
        "--leader-elect=false",
        f"--service-account-private-key-file={pki.sa_key}",
        f"--root-ca-file={pki.ca_cert}",
        f"--cluster-signing-cert-file={pki.ca_cert}",
        f"--cluster-signing-key-file={pki.ca_key}",
        f"--service-cluster-ip-range={_pki.SERVICE_CLUSTER_IP_RANGE}",
        f"--kube-api-qps={CLIENT_QPS}",
        f"--kube-api-burst={CLIENT_BURST}",
        "--profiling=false",
    ]


def scheduler_config(layout: Layout) -> dict:
    """KubeSchedulerConfiguration (kubescheduler.config.k8s.io/v1) with a faster client and no leader election."""
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(layout.admin_kubeconfig), "qps": CLIENT_QPS, "burst": CLIENT_BURST},
        "leaderElection": {"leaderElect": False},
    }


def kube_scheduler(layout: Layout, ports: _ports.Ports) -> list[str]:
    """kube-scheduler reading :func:`scheduler_config`."""
    kubeconfig = str(layout.admin_kubeconfig)
    return [
        str(layout.bin_dir / "kube-scheduler"),
        f"--config={layout.scheduler_config}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={_ports.HOST}",
        f"--secure-port={ports.scheduler}",
        f"--cert-dir={layout.workdir / 'scheduler-certs'}",
    ]


def kwok(layout: Layout, ports: _ports.Ports) -> list[str]:
    """kwok managing the annotated fake nodes with the pinned Stage configs, :data:`LOCAL_STAGES` and
    :data:`LOCAL_METRICS`; its server is every fake node's kubelet endpoint.
    """
    return [
        str(layout.bin_dir / "kwok"),
        f"--kubeconfig={layout.admin_kubeconfig}",
        f"--config={layout.stages_file}",
        *(f"--config={path}" for path in LOCAL_STAGES + LOCAL_METRICS),
        f"--manage-nodes-with-annotation-selector={_nodes.KWOK_ANNOTATION}={_nodes.KWOK_ANNOTATION_VALUE}",
        f"--cidr={POD_CIDR}",
        f"--server-address={_ports.HOST}:{ports.kwok}",
        f"--node-ip={KWOK_NODE_IP}",
        f"--node-port={ports.kwok}",
        f"--node-lease-duration-seconds={NODE_LEASE_SECONDS}",
    ]


METRICS_RESOLUTION = "10s"
"""metrics-server ``--metric-resolution``: how often it scrapes (its minimum; the HPA controller syncs every 15 s)."""


def metrics_server(
    workdir: pathlib.Path, kubeconfig: pathlib.Path, ports: _ports.Ports, binary: pathlib.Path
) -> list[str]:
    """metrics-server on loopback, serving ``metrics.k8s.io`` behind the API server's aggregation layer.

    It authenticates the API server's proxied requests by the front-proxy certificate (the request-header
    configuration it reads from ``kube-system/extension-apiserver-authentication``) and serves with a
    self-signed certificate (the APIService skips verification). It scrapes each node at its InternalIP and
    status port: kwok's server for fake nodes (plain HTTP, hence the deprecated insecure mode; the per-node path
    comes from the node annotation ``_nodes.RESOURCE_METRICS_PATH_ANNOTATION``). A real node's kubelet serves
    HTTPS only, so it is not scraped in this mode.

    Args:
        workdir (pathlib.Path): The cluster's folder (its serving certificate goes under it).
        kubeconfig (pathlib.Path): The admin kubeconfig.
        ports (_ports.Ports): Its port block (``metrics_server``).
        binary (pathlib.Path): The built metrics-server (``_build.build_addon``).

    Returns:
        list[str]: The command line (flags of metrics-server v0.9, ``metrics-server --help``).
    """
    return [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={_ports.HOST}",
        f"--secure-port={ports.metrics_server}",
        f"--cert-dir={workdir / 'metrics-server-certs'}",
        "--kubelet-preferred-address-types=InternalIP",
        "--kubelet-use-node-status-port",
        "--deprecated-kubelet-completely-insecure",
        f"--metric-resolution={METRICS_RESOLUTION}",
        "--kubelet-request-timeout=5s",  # below the resolution, which metrics-server requires
        "--profiling=false",
    ]


KARPENTER_INSTANCE_TYPES = pathlib.Path(__file__).parent / "karpenter" / "instance-types.json"
"""The instance types Karpenter's kwok provider offers (its ``--instance-types-file-path``): three CPU sizes and
one GPU type, on-demand in one zone, priced in proportion to their size (a GPU costs as much as 24 CPUs), so
Karpenter picks the smallest that fits and a GPU type only for pods that ask for ``nvidia.com/gpu``."""


def karpenter(
    kubeconfig: pathlib.Path, ports: _ports.Ports, binary: pathlib.Path, instance_types: pathlib.Path
) -> tuple[list[str], dict[str, str]]:
    """Karpenter's kwok provider as a host process: its command line and the environment it adds.

    It reads the cluster from ``KUBECONFIG`` (its flag set has no ``--kubeconfig``) and runs without leader
    election (one replica; ``DISABLE_LEADER_ELECTION``). Its metrics and health servers bind every interface at
    the block's ``karpenter_metrics`` and ``karpenter_health`` ports (Karpenter takes ports, not addresses).

    Args:
        kubeconfig (pathlib.Path): The admin kubeconfig.
        ports (_ports.Ports): The cluster's port block.
        binary (pathlib.Path): The built ``karpenter-kwok`` (``_build.build_addon("karpenter")``).
        instance_types (pathlib.Path): Instance types file (:data:`KARPENTER_INSTANCE_TYPES`).

    Returns:
        tuple[list[str], dict[str, str]]: The command line (flags of Karpenter v1.13, ``karpenter-kwok --help``)
        and the variables to add to the environment.
    """
    argv = [
        str(binary),
        f"--metrics-port={ports.karpenter_metrics}",
        f"--health-probe-port={ports.karpenter_health}",
        f"--instance-types-file-path={instance_types}",
        "--log-level=info",
    ]
    return argv, {"KUBECONFIG": str(kubeconfig), "DISABLE_LEADER_ELECTION": "true"}


KEDA_NAMESPACE = "kube-system"
"""Namespace KEDA believes it runs in (``POD_NAMESPACE``, ``KEDA_CLUSTER_OBJECT_NAMESPACE``): where it would look
for the Secrets of ClusterTriggerAuthentications. Nothing of KEDA's is created there by the dev cluster except the
adapter's ExternalName Service."""


def keda(
    kubeconfig: pathlib.Path, ports: _ports.Ports, binaries: pathlib.Path, cert_dir: pathlib.Path
) -> tuple[list[str], list[str], dict[str, str]]:
    """KEDA's operator and metrics adapter as host processes: their command lines and the environment they add.

    The operator runs its ScaledObject controller and, on ``keda_metrics_service``, the gRPC service from which the
    adapter reads the scalers' values; the adapter serves ``external.metrics.k8s.io`` behind the aggregation layer
    (authenticating the API server's proxied requests by the front-proxy certificate, as metrics-server does) and
    answers with what it asks the operator. The two authenticate each other with the certificate in ``cert_dir``
    (``ca.crt``, ``tls.crt``, ``tls.key``; ``_pki.mutual_tls``): the operator's certificate rotation (which would
    write them into a Secret and patch the APIService and webhooks) stays off, its default. The adapter also serves
    the API with that certificate (the APIService skips verification). Leader election off (one replica),
    Prometheus metrics of the operator off (one port fewer), every namespace watched (``WATCH_NAMESPACE`` empty).

    Args:
        kubeconfig (pathlib.Path): The admin kubeconfig.
        ports (_ports.Ports): The cluster's port block (``keda_*``).
        binaries (pathlib.Path): Folder of ``keda-operator`` and ``keda-adapter`` (``_build.build_addon("keda")``).
        cert_dir (pathlib.Path): The mutual-TLS folder.

    Returns:
        tuple[list[str], list[str], dict[str, str]]: The operator's and the adapter's command lines (flags of KEDA
        v2.21, ``cmd/operator/main.go`` and ``cmd/adapter/main.go``) and the variables to add to the environment.
    """
    grpc = f"{_ports.HOST}:{ports.keda_metrics_service}"
    operator = [
        str(binaries / "keda-operator"),
        f"--kubeconfig={kubeconfig}",
        "--leader-elect=false",
        "--enable-prometheus-metrics=false",
        f"--health-probe-bind-address={_ports.HOST}:{ports.keda_health}",
        f"--metrics-service-bind-address={grpc}",
        f"--cert-dir={cert_dir}",
        "--enable-cert-rotation=false",
        "--zap-log-level=info",
    ]
    adapter = [
        str(binaries / "keda-adapter"),
        f"--kubeconfig={kubeconfig}",
        f"--lister-kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={_ports.HOST}",
        f"--secure-port={ports.keda_adapter}",
        f"--cert-dir={cert_dir}",
        f"--tls-cert-file={cert_dir / 'tls.crt'}",
        f"--tls-private-key-file={cert_dir / 'tls.key'}",
        f"--metrics-service-address={grpc}",
        f"--port={ports.keda_adapter_metrics}",
        "--profiling=false",
    ]
    env = {
        "KUBECONFIG": str(kubeconfig),
        "WATCH_NAMESPACE": "",
        "POD_NAMESPACE": KEDA_NAMESPACE,
        "KEDA_CLUSTER_OBJECT_NAMESPACE": KEDA_NAMESPACE,
    }
    return operator, adapter, env


KUEUE_NAMESPACE = "kueue-system"
"""Namespace of Kueue's own objects (its webhook Service and certificate Secret), as its release installs them."""

KUEUE_WEBHOOK_SERVICE = "kueue-webhook-service"
"""The webhook Service's name: Kueue's certificate names ``<service>.<namespace>.svc``, and the API server verifies
that name when it calls a webhook or a conversion through the Service (an ExternalName on loopback here)."""

KUEUE_WEBHOOK_SECRET = "kueue-webhook-server-cert"
"""The Secret where Kueue's certificate rotation keeps its CA and serving certificate (it must exist, empty)."""

KUEUE_INTEGRATIONS = ("batch/job",)
"""Kueue job integrations turned on: batch/v1 Jobs only (the trainer Job). Webhooks of the others answer as no-ops
and are not registered (``_kueue.webhook_configurations``)."""


def kueue_configuration(ports: _ports.Ports, cert_dir: pathlib.Path) -> dict:
    """Kueue's configuration file (``config.kueue.x-k8s.io/v1beta2`` Configuration) for a host process.

    Kueue's internal certificate management stays on (its default): it writes the webhook certificate into
    ``cert_dir`` and the Secret, and injects its CA into the webhook configurations and the CRDs' conversion
    webhooks, as it does in a cluster. Webhooks and health probes listen on loopback; metrics are off (``"0"``;
    with certificate management on they need no certificate files), and so is the visibility API server
    (``VisibilityOnDemand``, which would need an APIService). Leader election off (one replica).

    Args:
        ports (_ports.Ports): The cluster's port block (``kueue_*``).
        cert_dir (pathlib.Path): Folder for the webhook certificate (``tls.crt``, ``tls.key``).

    Returns:
        dict: The configuration (fields of Kueue v0.17, ``apis/config/v1beta2/configuration_types.go``).
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": KUEUE_NAMESPACE,
        "health": {"healthProbeBindAddress": f"{_ports.HOST}:{ports.kueue_health}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": _ports.HOST, "port": ports.kueue_webhook, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {
            "enable": True,
            "webhookServiceName": KUEUE_WEBHOOK_SERVICE,
            "webhookSecretName": KUEUE_WEBHOOK_SECRET,
        },
        "manageJobsWithoutQueueName": False,
        "integrations": {"frameworks": list(KUEUE_INTEGRATIONS)},
        "featureGates": {"VisibilityOnDemand": False},
    }


def kueue(kubeconfig: pathlib.Path, binary: pathlib.Path, config: pathlib.Path) -> tuple[list[str], dict[str, str]]:
    """Kueue's manager as a host process: its command line and the environment it adds.

    Args:
        kubeconfig (pathlib.Path): The admin kubeconfig (read through ``KUBECONFIG``, as controller-runtime does).
        binary (pathlib.Path): The built ``kueue`` (``_build.build_addon("kueue")``).
        config (pathlib.Path): The file holding :func:`kueue_configuration`.

    Returns:
        tuple[list[str], dict[str, str]]: The command line (flags of Kueue v0.17, ``cmd/kueue/main.go``) and the
        variables to add to the environment.
    """
    return [str(binary), f"--config={config}", "--zap-log-level=info"], {"KUBECONFIG": str(kubeconfig)}
