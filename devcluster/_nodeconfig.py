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

CONTAINER_SOURCE = pathlib.PurePosixPath("/opt/rlightning/src")
"""Where every container sees the checkout (read-only), whatever its host path: a clone under ``/tmp`` would be
hidden by a pod's emptyDir at ``/tmp`` (the chart's Deployment mounts one), and one with a space in its path would
need quoting in every shebang and ``PATH``."""

CONTAINER_VENV = pathlib.PurePosixPath("/opt/rlightning/venv")
"""Where every container sees the virtualenv (read-only), for the same reasons as :data:`CONTAINER_SOURCE`."""

CONTAINER_SCRIPTS = pathlib.PurePosixPath("/opt/rlightning/bin")
"""The virtualenv's console scripts (``rlightning-operator``, ``torchrun`` ...) in the runtime image, with their
shebangs on :data:`CONTAINER_VENV`'s python: pip writes the interpreter's host path into each script."""

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


@dataclasses.dataclass(frozen=True)
class Bind:
    """A read-only bind mount of a host folder into every container.

    Attributes:
        source (pathlib.Path): Absolute host folder.
        destination (pathlib.PurePosixPath): Absolute path inside the container.
    """

    source: pathlib.Path
    destination: pathlib.PurePosixPath


def base_runtime_spec(default_spec: dict, binds: list[Bind]) -> dict:
    """containerd's default OCI spec plus read-only bind mounts into every container.

    Args:
        default_spec (dict): Output of ``ctr oci spec`` (containerd's defaults for this version).
        binds (list[Bind]): ``/usr`` and the Python install at their host paths, the repository at
            :data:`CONTAINER_SOURCE`, its virtualenv at :data:`CONTAINER_VENV`.

    Returns:
        dict: A copy of ``default_spec`` with one ``bind`` mount per entry (``rbind,ro``), after the defaults.
    """
    spec = json.loads(json.dumps(default_spec))
    mounts = [
        {"destination": str(bind.destination), "type": "bind", "source": str(bind.source), "options": ["rbind", "ro"]}
        for bind in binds
    ]
    spec["mounts"] = [*spec.get("mounts", []), *mounts]
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


SYSTEM_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""The usual PATH of a Debian image, after the project's folders in :func:`image_env`."""


def image_env() -> list[str]:
    """Environment of the runtime image: its scripts and the virtualenv first on PATH, the checkout on PYTHONPATH.

    The shared virtualenv's editable install may point at another checkout; PYTHONPATH puts the repository whose
    tests run first, so pods run its code. Every path is a fixed one inside the container (:data:`CONTAINER_SCRIPTS`,
    :data:`CONTAINER_VENV`, :data:`CONTAINER_SOURCE`), never the host's.

    Returns:
        list[str]: ``NAME=value`` entries.
    """
    return [
        f"PATH={CONTAINER_SCRIPTS}:{CONTAINER_VENV / 'bin'}:{SYSTEM_PATH}",
        f"PYTHONPATH={CONTAINER_SOURCE}:{CONTAINER_SOURCE / 'operator'}",
        "PYTHONUNBUFFERED=1",
        "HOME=/tmp",
    ]


_SH_TRAMPOLINE = (b"#!/bin/sh", b"'''exec' ", b"' '''")
"""distlib's ScriptMaker header for an interpreter path with a space or over 127 bytes: ``#!/bin/sh``, then
``'''exec' "<python>" "$0" "$@"``, then ``' '''`` (a no-op string to python)."""


def container_script(script: bytes, venv: pathlib.Path) -> bytes | None:
    r"""A virtualenv console script with its interpreter moved to :data:`CONTAINER_VENV`; None for other files.

    pip (distlib's ScriptMaker) writes ``#!<venv>/bin/python`` as the first line, or the ``/bin/sh`` trampoline
    of :data:`_SH_TRAMPOLINE` when that path holds a space or is long; both become one
    ``#!/opt/rlightning/venv/bin/<interpreter>`` line.

    Args:
        script (bytes): The file's content.
        venv (pathlib.Path): The virtualenv's host folder, as its scripts name it (``sys.prefix``).

    Returns:
        bytes | None: The relocated script; None when the file does not run the virtualenv's python.

    Examples:
        >>> container_script(b"#!/w/.venv/bin/python\nimport sys\n", pathlib.Path("/w/.venv"))
        b'#!/opt/rlightning/venv/bin/python\nimport sys\n'
    """
    lines = script.split(b"\n")
    shell, exec_prefix, closing = _SH_TRAMPOLINE
    if len(lines) > 3 and lines[0] == shell and lines[1].startswith(exec_prefix) and lines[2] == closing:
        interpreter, rest = lines[1][len(exec_prefix) :].split(b' "$0"', 1)[0].strip(b'"'), lines[3:]
    elif lines[0].startswith(b"#!"):
        interpreter, rest = lines[0][2:].strip(), lines[1:]
    else:
        return None
    prefix = str(venv).encode() + b"/bin/"
    name = interpreter[len(prefix) :]
    if not interpreter.startswith(prefix) or not name.startswith(b"python") or b"/" in name:
        return None
    return b"\n".join([b"#!" + str(CONTAINER_VENV / "bin").encode() + b"/" + name, *rest])
