"""Configuration of the real node: pure builders (paths and addresses in, argv, files and manifests out), no I/O.

The node is one kubelet on containerd (runc, cgroupfs) with Debian's bridge CNI plugins on a bridge of its own,
and CoreDNS on the bridge address as the cluster DNS. Every folder it writes is under one root (its layout) so
that teardown knows what to remove. Sources: KubeletConfiguration v1beta1 and the kubelet flag reference
(kubernetes.io/docs/reference/config-api/kubelet-config.v1beta1/), containerd 1.6's docs/cri/config.md, the CNI
plugins' docs (www.cni.dev/plugins/current/main/bridge/), CoreDNS's kubernetes plugin (coredns.io/plugins/kubernetes/).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from devcluster import _pki

NODE_NAME = "real-node-0"
"""Name of the real node (also its ``kubernetes.io/hostname`` label and the CN of its client certificate)."""

NODE_LABEL = "rlightning.dev/real-node"
"""Label (value ``"true"``) that pods put in their nodeSelector to land on the real node (kwok nodes lack it)."""

BRIDGE = "rlnode0"
"""Linux bridge of the pod network (created by devcluster, removed at teardown)."""

POD_SUBNET = "10.89.0.0/24"
"""Pod addresses (host-local IPAM), outside kwok's 10.244.0.0/16 and the service range 10.96.0.0/16."""

BRIDGE_IP = "10.89.0.1"
"""Address of :data:`BRIDGE`: the pods' gateway, the node's InternalIP, the kubelet's and CoreDNS's address."""

BRIDGE_PREFIX = 24
"""Prefix length of :data:`POD_SUBNET`."""

KUBELET_PORT = 10250
"""kubelet's HTTPS port on :data:`BRIDGE_IP` (logs, exec, port-forward for the API server)."""

KUBELET_HEALTHZ_PORT = 10248
"""kubelet's ``/healthz`` port on :data:`BRIDGE_IP`."""

CLUSTER_DOMAIN = "cluster.local"
"""DNS domain of Services and pods (kubelet ``clusterDomain``, CoreDNS zone)."""

IMAGE = "rlightning.local/runtime:dev"
"""Name of the local image whose containers see the Python install, the repository and its virtualenv; what
``spec.image`` must say for pods on the real node (imagePullPolicy IfNotPresent or Never: nothing is pulled)."""

PAUSE_IMAGE = "rlightning.local/pause:dev"
"""Name of the local sandbox image (containerd ``sandbox_image``)."""

CONTAINERD_NAMESPACE = "k8s.io"
"""containerd namespace of the CRI plugin (``ctr -n``)."""

CNI_BIN_DIR = pathlib.Path("/usr/lib/cni")
"""Where Debian's containernetworking-plugins installs the plugins."""

CONTAINERD = pathlib.Path("/usr/bin/containerd")
"""containerd from the Debian package."""

CTR = pathlib.Path("/usr/bin/ctr")
"""containerd's client from the Debian package (image import, listing)."""

@dataclasses.dataclass(frozen=True)
class NodeLayout:
    """Folders and files of one real node, all under ``root``.

    Attributes:
        root (pathlib.Path): The node's folder (inside the cluster's work folder).
    """

    root: pathlib.Path

    @property
    def containerd_config(self) -> pathlib.Path:
        """containerd's config.toml."""
        return self.root / "containerd" / "config.toml"

    @property
    def containerd_root(self) -> pathlib.Path:
        """containerd's persistent data (content store, snapshots)."""
        return self.root / "containerd" / "root"

    @property
    def containerd_state(self) -> pathlib.Path:
        """containerd's runtime state: shims, sandbox /dev/shm mounts, CNI netns (``netns_mounts_under_state_dir``)."""
        return self.root / "containerd" / "state"

    @property
    def runc_root(self) -> pathlib.Path:
        """runc's state folder (runc option ``Root``), instead of ``/run/containerd/runc``."""
        return self.root / "containerd" / "runc"

    @property
    def containerd_socket(self) -> pathlib.Path:
        """containerd's gRPC socket (the kubelet's CRI endpoint)."""
        return self.root / "containerd" / "containerd.sock"

    @property
    def base_runtime_spec(self) -> pathlib.Path:
        """OCI runtime spec every container starts from (containerd ``base_runtime_spec``)."""
        return self.root / "containerd" / "base-spec.json"

    @property
    def cni_conf_dir(self) -> pathlib.Path:
        """Folder of the CNI network config list."""
        return self.root / "cni" / "net.d"

    @property
    def kubelet_root(self) -> pathlib.Path:
        """kubelet ``--root-dir`` (pod volumes, plugins, its serving certificate)."""
        return self.root / "kubelet"

    @property
    def kubelet_config(self) -> pathlib.Path:
        """KubeletConfiguration file."""
        return self.root / "kubelet-config.yaml"

    @property
    def kubelet_kubeconfig(self) -> pathlib.Path:
        """kubeconfig of the node identity (client certificate ``system:node:<name>``)."""
        return self.root / "kubelet.kubeconfig"

    @property
    def pod_logs(self) -> pathlib.Path:
        """kubelet ``podLogsDir`` (instead of ``/var/log/pods``)."""
        return self.root / "pod-logs"

    @property
    def resolv_conf(self) -> pathlib.Path:
        """kubelet ``resolvConf``: search paths only, no upstream server (pods resolve cluster names only)."""
        return self.root / "resolv.conf"

    @property
    def corefile(self) -> pathlib.Path:
        """CoreDNS's Corefile."""
        return self.root / "Corefile"

    @property
    def images(self) -> pathlib.Path:
        """Folder of the built image tars and the pause program."""
        return self.root / "images"


def containerd_config(layout: NodeLayout) -> str:
    """containerd 1.6 config (version 2) with its own root, state, socket, runc root and CNI folders.

    ``restrict_oom_score_adj``: root may not lower oom_score_adj on these machines, and without it every sandbox
    fails with "can't get final child's PID from pipe: EOF". ``netns_mounts_under_state_dir`` keeps the pods'
    network namespaces under the state folder instead of ``/var/run/netns``. The sandbox image is local, so
    nothing is pulled.

    Args:
        layout (NodeLayout): The node's folders.

    Returns:
        str: TOML text.
    """
    cri = '[plugins."io.containerd.grpc.v1.cri"]'
    runc = f"{cri[:-1]}.containerd.runtimes.runc]"
    return "\n".join(
        [
            "version = 2",
            f'root = "{layout.containerd_root}"',
            f'state = "{layout.containerd_state}"',
            "oom_score = 0",
            "",
            "[grpc]",
            f'  address = "{layout.containerd_socket}"',
            "",
            '[plugins."io.containerd.internal.v1.opt"]',
            f'  path = "{layout.root / "containerd" / "opt"}"',
            "",
            cri,
            f'  sandbox_image = "{PAUSE_IMAGE}"',
            "  restrict_oom_score_adj = true",
            "  netns_mounts_under_state_dir = true",
            "  disable_tcp_service = true",
            f'  stream_server_address = "{BRIDGE_IP}"',
            "  enable_selinux = false",
            "  disable_apparmor = true",
            "",
            f"{cri[:-1]}.containerd]",
            '  snapshotter = "overlayfs"',
            '  default_runtime_name = "runc"',
            "",
            runc,
            '  runtime_type = "io.containerd.runc.v2"',
            f'  base_runtime_spec = "{layout.base_runtime_spec}"',
            "",
            f"{runc[:-1]}.options]",
            "  SystemdCgroup = false",
            f'  Root = "{layout.runc_root}"',
            "",
            f"{cri[:-1]}.cni]",
            f'  bin_dir = "{CNI_BIN_DIR}"',
            f'  conf_dir = "{layout.cni_conf_dir}"',
            "",
        ]
    )


def containerd(layout: NodeLayout) -> list[str]:
    """containerd reading :func:`containerd_config`."""
    return [str(CONTAINERD), "--config", str(layout.containerd_config)]


def cni_conflist(layout: NodeLayout) -> dict:
    """CNI network config list: a bridge on :data:`BRIDGE` with host-local addresses, then portmap and bandwidth.

    bandwidth caps a pod's links as a cluster's CNI does: containerd passes the pod's
    ``kubernetes.io/ingress-bandwidth`` and ``kubernetes.io/egress-bandwidth`` annotations (bits per second, as
    quantities) as the ``bandwidth`` capability, and the plugin puts a tbf qdisc on the host end of the pod's veth
    (ingress) and on an ifb device its traffic is redirected through (egress). Source: Kubernetes docs, "Network
    Plugins" (support traffic shaping); CNI plugins docs, "bandwidth plugin".

    No IP masquerade: pods only talk to each other, the node and the API server (through one DNAT rule), so no
    NAT chains are left to clean up. host-local keeps its leases under the node's folder.

    Args:
        layout (NodeLayout): The node's folders.

    Returns:
        dict: The conflist (CNI spec 0.4.0, which Debian's plugins 1.1 and containerd 1.6 both speak).
    """
    return {
        "cniVersion": "0.4.0",
        "name": "devcluster",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": True,
                "ipMasq": False,
                "hairpinMode": True,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET, "gateway": BRIDGE_IP}]],
                    "routes": [{"dst": "0.0.0.0/0"}],
                    "dataDir": str(layout.root / "cni" / "ipam"),
                },
            },
            {"type": "portmap", "capabilities": {"portMappings": True}},
            {"type": "bandwidth", "capabilities": {"bandwidth": True}},
        ],
    }


def base_runtime_spec(default_spec: dict, read_only_binds: list[pathlib.Path]) -> dict:
    """containerd's default OCI spec plus read-only bind mounts at the same paths inside every container.

    Args:
        default_spec (dict): Output of ``ctr oci spec`` (containerd's defaults for this version).
        read_only_binds (list[pathlib.Path]): Absolute host folders (``/usr``, the Python install, the repository,
            its virtualenv).

    Returns:
        dict: A copy of ``default_spec`` with one ``bind`` mount per folder (``rbind,ro``), after the defaults.
    """
    spec = json.loads(json.dumps(default_spec))
    spec["mounts"] = [
        *spec.get("mounts", []),
        *(
            {"destination": str(path), "type": "bind", "source": str(path), "options": ["rbind", "ro"]}
            for path in read_only_binds
        ),
    ]
    return spec


def kubelet_config(layout: NodeLayout, ca_cert: pathlib.Path) -> dict:
    """KubeletConfiguration (kubelet.config.k8s.io/v1beta1) of the real node.

    ``failCgroupV1: false`` lets kubelet 1.34 run on this machine's cgroup v1 hierarchy; ``cgroupfs`` because
    there is no systemd. Requests from the API server are authenticated by client certificate (the CA's) and
    authorized by SubjectAccessReview. Eviction thresholds are near zero and image GC is off so a busy shared
    disk never evicts the test pods or deletes the local images (nothing could pull them back).
    ``makeIPTablesUtilChains: false``: the node needs no KUBE-* chains (no kube-proxy), so none are left behind.

    Args:
        layout (NodeLayout): The node's folders.
        ca_cert (pathlib.Path): CA certificate of the cluster.

    Returns:
        dict: The configuration document.
    """
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": BRIDGE_IP,
        "port": KUBELET_PORT,
        "readOnlyPort": 0,
        "healthzBindAddress": BRIDGE_IP,
        "healthzPort": KUBELET_HEALTHZ_PORT,
        "containerRuntimeEndpoint": f"unix://{layout.containerd_socket}",
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        "clusterDNS": [BRIDGE_IP],
        "clusterDomain": CLUSTER_DOMAIN,
        "resolvConf": str(layout.resolv_conf),
        "podLogsDir": str(layout.pod_logs),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca_cert)},
        },
        "authorization": {"mode": "Webhook"},
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "serializeImagePulls": False,
        "nodeStatusReportFrequency": "10s",
        "syncFrequency": "10s",
        "makeIPTablesUtilChains": False,
    }


def kubelet(layout: NodeLayout, bin_dir: pathlib.Path) -> list[str]:
    """kubelet reading :func:`kubelet_config`, registering :data:`NODE_NAME` with :data:`NODE_LABEL`."""
    return [
        str(bin_dir / "kubelet"),
        f"--config={layout.kubelet_config}",
        f"--kubeconfig={layout.kubelet_kubeconfig}",
        f"--root-dir={layout.kubelet_root}",
        f"--cert-dir={layout.kubelet_root / 'pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={BRIDGE_IP}",
        f"--node-labels={NODE_LABEL}=true,type=real",
        "--v=1",
    ]


def resolv_conf() -> str:
    """The pods' base resolv.conf: no nameserver (the kubelet adds :data:`BRIDGE_IP`), no host search paths."""
    return "options ndots:1\n"


def corefile(kubeconfig: pathlib.Path) -> str:
    """CoreDNS configuration: the kubernetes plugin for :data:`CLUSTER_DOMAIN` on :data:`BRIDGE_IP`:53.

    Names outside the cluster zones get NXDOMAIN from a second server block (pods have no route out), quickly
    instead of timing out. Two blocks, because CoreDNS runs plugins in its fixed order (template before
    kubernetes), and the most specific zone's block answers a query.

    Args:
        kubeconfig (pathlib.Path): kubeconfig CoreDNS watches Services and EndpointSlices with.

    Returns:
        str: Corefile text.
    """
    return (
        f"{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{\n"
        f"    bind {BRIDGE_IP}\n"
        f"    errors\n"
        f"    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{\n"
        f"        kubeconfig {kubeconfig}\n"
        f"        pods insecure\n"
        f"        ttl 5\n"
        f"    }}\n"
        f"}}\n"
        f".:53 {{\n"
        f"    bind {BRIDGE_IP}\n"
        f"    template ANY ANY {{\n"
        f"        rcode NXDOMAIN\n"
        f"    }}\n"
        f"}}\n"
    )


def coredns(layout: NodeLayout, bin_dir: pathlib.Path) -> list[str]:
    """CoreDNS reading :func:`corefile`."""
    return [str(bin_dir / "coredns"), "-conf", str(layout.corefile)]


def api_server_dnat(apiserver_port: int) -> list[str]:
    """iptables arguments (table nat, chain PREROUTING, without ``-A``/``-D``) of the one rule pods need.

    Pods reach the ``kubernetes`` Service IP; with no kube-proxy this rule sends their connections to the API
    server on 127.0.0.1, which the bridge accepts because of ``route_localnet=1``.

    Args:
        apiserver_port (int): The API server's port on 127.0.0.1.

    Returns:
        list[str]: Rule specification.
    """
    return [
        "-s", POD_SUBNET,
        "-d", f"{_pki.KUBERNETES_SERVICE_IP}/32",
        "-p", "tcp",
        "--dport", "443",
        "-m", "comment", "--comment", "rlightning devcluster: pods to kube-apiserver",
        "-j", "DNAT",
        "--to-destination", f"127.0.0.1:{apiserver_port}",
    ]  # fmt: skip


def image_env(repo: pathlib.Path, venv_bin: pathlib.Path) -> list[str]:
    """Environment of the runtime image: the virtualenv first on PATH, the checkout's code on PYTHONPATH.

    The shared virtualenv's editable install may point at another checkout; PYTHONPATH puts the repository whose
    tests run first, so pods run its code.

    Args:
        repo (pathlib.Path): Repository root.
        venv_bin (pathlib.Path): The virtualenv's ``bin`` folder (resolved).

    Returns:
        list[str]: ``NAME=value`` entries.
    """
    return [
        f"PATH={venv_bin}:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"PYTHONPATH={repo}:{repo / 'operator'}",
        "PYTHONUNBUFFERED=1",
        "HOME=/tmp",
    ]
