"""One real node joined to a running dev cluster: containerd, CoreDNS and a kubelet, and a teardown that undoes it all.

Start order: Debian packages (installed when missing), a snapshot of the host, the bridge with its
``route_localnet`` and the DNAT rule to the API server, containerd (socket answers), the local pause and runtime
images (``ctr images import``), CoreDNS, the kubelet; ready when the Node is Ready. Stop: cordon, delete the
node's pods and wait for their containers to go, stop the kubelet and CoreDNS, remove what containers remain,
stop containerd, then remove mounts, cgroups, the rule, the bridge, the Node object and new default-path entries, and
write back host-wide sysctls the CNI plugins changed (`ip_forward`);
:attr:`RealNode.leftovers` lists whatever still differs from the snapshot. The configuration itself is built
in :mod:`devcluster._nodeconfig`.
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable

import yaml

from devcluster import _cluster
from devcluster import _hostpackages
from devcluster import _hostrecord
from devcluster import _hoststate
from devcluster import _http
from devcluster import _images
from devcluster import _kubeconfig
from devcluster import _nodeconfig as cfg
from devcluster import _pki
from devcluster import _process

START_TIMEOUT_SECONDS = 180.0
"""Bound for :meth:`RealNode.start` after the packages are present (4-6 s seen on 2 busy cores)."""

DRAIN_TIMEOUT_SECONDS = 60.0
"""Bound for the node's containers to stop after its pods are deleted, at teardown."""

COMMAND_TIMEOUT_SECONDS = 60.0
"""Bound for one ``ctr``, ``ip`` or ``iptables`` command."""

STATE_FILE = "realnode.json"
"""File in the cluster's work folder recording the node's pids, root and API server port (for ``down``)."""

COMPONENTS = ("containerd", "coredns", "kubelet")
"""Processes of the node, in start order (stopped in reverse)."""

BANDWIDTH_IFB_PREFIX = "bwp"
"""Name prefix of the ifb devices the CNI bandwidth plugin makes on the host for pods with an egress cap."""

NODE_CGROUPS = {"kubepods", "k8s.io"}
"""Top-level cgroups the kubelet (cgroupfs driver) and containerd create; :meth:`RealNode.start` refuses to run
where one already exists (a kubelet of the host), so teardown removes only its own."""


class RealNodeError(RuntimeError):
    """Raised when the real node cannot start (a component exits, readiness times out, host setup fails)."""


def repository_root() -> pathlib.Path:
    """Return the checkout this package was imported from (mounted read-only into every container)."""
    return pathlib.Path(__file__).resolve().parent.parent


def read_only_binds() -> list[cfg.Bind]:
    """Return what every container sees: ``/usr`` and the Python install at their host paths (the virtualenv's
    ``python`` links to the install by its host path), the repository at ``CONTAINER_SOURCE`` and its virtualenv at
    ``CONTAINER_VENV``.

    A host folder below another one bound at the same path is left out (runc would bind it twice).
    """
    same_path: list[pathlib.Path] = []
    for path in (pathlib.Path("/usr"), pathlib.Path(sys.base_prefix).resolve()):
        if not any(path == other or other in path.parents for other in same_path):
            same_path.append(path)
    return [
        *(cfg.Bind(path, pathlib.PurePosixPath(path)) for path in same_path),
        cfg.Bind(repository_root(), cfg.CONTAINER_SOURCE),
        cfg.Bind(pathlib.Path(sys.prefix).resolve(), cfg.CONTAINER_VENV),
    ]


def container_scripts(venv: pathlib.Path = pathlib.Path(sys.prefix)) -> dict[str, bytes]:
    """Return the virtualenv's console scripts relocated for the runtime image (``_nodeconfig.container_script``).

    Args:
        venv (pathlib.Path, optional): The virtualenv, as its scripts name it. Defaults to ``sys.prefix``.

    Returns:
        dict[str, bytes]: Relocated scripts by file name.
    """
    scripts = {}
    for path in sorted((venv / "bin").iterdir()):
        if path.is_file() and not path.is_symlink():
            relocated = cfg.container_script(path.read_bytes(), venv)
            if relocated is not None:
                scripts[path.name] = relocated
    return scripts


def _run(argv: list[str], what: str, check: bool = True) -> subprocess.CompletedProcess:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_SECONDS, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RealNodeError(f"{what}: `{' '.join(argv)}` timed out after {COMMAND_TIMEOUT_SECONDS:.0f}s") from exc
    if check and proc.returncode != 0:
        raise RealNodeError(f"{what}: `{' '.join(argv)}` failed (exit {proc.returncode}): {proc.stderr.strip()}")
    return proc


class RealNode(_process.Supervisor):
    """A kubelet node on this host, joined to a started :class:`devcluster.Cluster` (root required).

    Args:
        cluster (_cluster.Cluster): The running control plane (its API server, CA and binaries).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with RealNode(cluster) as node:  # doctest: +SKIP
        ...     cluster.kubectl("get", "node", node.name)
    """

    name = cfg.NODE_NAME
    error = RealNodeError

    def __init__(self, cluster: _cluster.Cluster, log: Callable[[str], None] = print) -> None:
        self.cluster = cluster
        self.layout = cfg.NodeLayout(cluster.workdir / "realnode")
        self.processes: list[_process.Managed] = []
        self.baseline: _hoststate.HostState | None = None
        self.leftovers: list[str] = []
        self.start_seconds = 0.0
        self._log = log
        self._api = _http.ApiServer(cluster.server, cluster.ca_cert, cluster.admin_token)
        self._running = False

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> RealNode:
        """Set up the host, start containerd, CoreDNS and the kubelet, and wait until the Node is Ready.

        On any failure everything started is stopped and the host is cleaned before the error propagates.

        Args:
            timeout (float, optional): Seconds for the start after the packages are present. Defaults to
                :data:`START_TIMEOUT_SECONDS`.

        Returns:
            RealNode: ``self``.

        Raises:
            RealNodeError: When not root, another run's node is live on this host (or a bridge no record names
                exists), a component exits or readiness times out. What a dead run's node left is removed first.
            _hostpackages.PackageError: When a Debian package is missing and cannot be installed.
        """
        if os.geteuid() != 0:
            raise RealNodeError("a real node needs root (kubelet, containerd, bridge, iptables)")
        _hostpackages.ensure(log=self._log)
        self._remove_dead_node()
        if pathlib.Path(f"/sys/class/net/{cfg.BRIDGE}").exists():
            raise RealNodeError(
                f"bridge {cfg.BRIDGE} exists and no real node's record ({_hostrecord.HOST_RECORD}) names it: "
                "something else made it (`ip link delete " + cfg.BRIDGE + "` if it is a node's of an older version)"
            )
        taken = sorted(str(p) for name in NODE_CGROUPS for p in _hoststate.CGROUP_ROOT.glob(f"*/{name}"))
        if taken:
            raise RealNodeError(f"cgroups {', '.join(taken)} exist: another kubelet or containerd uses this host")
        self.processes = []
        self.leftovers = []
        self.baseline = _hoststate.snapshot()
        self._running = True
        self.start_seconds = self._start_or_stop(self._start, timeout)
        self._log(f"devcluster: real node {self.name} Ready after {self.start_seconds:.1f}s")
        return self

    def _remove_dead_node(self) -> None:
        """Remove what the real node of a dead run left on this host; refuse while another run's node lives."""
        record = _hostrecord.read()
        if record is None:
            return
        live = _hostrecord.live(record)
        if live:
            raise RealNodeError(
                f"a real node of another run is live on this host: {', '.join(live)}, work folder "
                f"{record['workdir']}; stop it (`python -m devcluster down` or end that run) first"
            )
        removed = remove_node(record)
        self._log(
            f"devcluster: removed what the real node of a dead run (work folder {record['workdir']}) left on this "
            f"host: {', '.join(removed) or 'its record only'}"
        )

    def _start(self, deadline: float) -> None:
        layout = self.layout
        for folder in (layout.root, layout.containerd_root, layout.containerd_state, layout.cni_conf_dir,
                       layout.kubelet_root, layout.pod_logs, layout.images):  # fmt: skip
            folder.mkdir(parents=True, exist_ok=True)
        self._write_configs()
        self._network_up()
        self._spawn("containerd", cfg.containerd(layout))
        self._wait("containerd", deadline, lambda: self._ctr("version", check=False).returncode == 0)
        self._import_images()
        self._spawn("coredns", cfg.coredns(layout, self.cluster.bin("coredns").parent))
        self._spawn("kubelet", cfg.kubelet(layout, self.cluster.bin("kubelet").parent))
        self._wait(f"node {self.name} Ready", deadline, self.ready)

    def _write_configs(self) -> None:
        layout, cluster = self.layout, self.cluster
        layout.containerd_config.write_text(cfg.containerd_config(layout))
        default_spec = json.loads(_run([str(cfg.CTR), "oci", "spec"], "containerd's default spec").stdout)
        layout.base_runtime_spec.write_text(json.dumps(cfg.base_runtime_spec(default_spec, read_only_binds())))
        (layout.cni_conf_dir / "10-devcluster.conflist").write_text(json.dumps(cfg.cni_conflist(layout), indent=2))
        layout.kubelet_config.write_text(yaml.safe_dump(cfg.kubelet_config(layout, cluster.ca_cert)))
        layout.resolv_conf.write_text(cfg.resolv_conf())
        layout.corefile.write_text(cfg.corefile(cluster.kubeconfig))
        user = f"system:node:{self.name}"
        cert, key = _pki.client_certificate(cluster.pki_dir, "node", user, _pki.NODE_GROUP)
        _kubeconfig.write_client_certificate(
            layout.kubelet_kubeconfig, cluster.server, cluster.ca_cert, user, cert, key
        )
        self._write_state()

    def _network_up(self) -> None:
        _run(["ip", "link", "add", cfg.BRIDGE, "type", "bridge"], "creating the bridge")
        _run(["ip", "addr", "add", f"{cfg.BRIDGE_IP}/{cfg.BRIDGE_PREFIX}", "dev", cfg.BRIDGE], "addressing the bridge")
        _run(["ip", "link", "set", cfg.BRIDGE, "up"], "bringing the bridge up")
        pathlib.Path(f"/proc/sys/net/ipv4/conf/{cfg.BRIDGE}/route_localnet").write_text("1")
        rule = cfg.api_server_dnat(self.cluster.ports.apiserver)
        _run(["iptables", "-w", "5", "-t", "nat", "-A", "PREROUTING", *rule], "adding the API server DNAT rule")

    def _import_images(self) -> None:
        layout = self.layout
        pause = _images.build_pause(layout.images)
        for name, archive in (
            (cfg.PAUSE_IMAGE, _images.pause_archive(cfg.PAUSE_IMAGE, pause)),
            (cfg.IMAGE, _images.runtime_archive(cfg.IMAGE, cfg.image_env(), container_scripts())),
        ):
            path = layout.images / (name.rsplit("/", 1)[-1].replace(":", "-") + ".tar")
            path.write_bytes(archive)
            self._ctr("images", "import", str(path))

    def _ctr(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        argv = [str(cfg.CTR), "--address", str(self.layout.containerd_socket), "-n", cfg.CONTAINERD_NAMESPACE, *args]
        return _run(argv, "ctr", check=check)

    def _spawn(self, name: str, argv: list[str]) -> None:
        proc = _process.start(name, argv, self.cluster.log_dir / f"{name}.log", detach=self.cluster.detached)
        self.processes.append(proc)
        self._write_state()

    def ready(self) -> bool:
        """Return True when the Node object reports condition Ready=True."""
        node = self._api.get_json(f"/api/v1/nodes/{self.name}")
        conditions = (node or {}).get("status", {}).get("conditions", [])
        return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)

    def log_paths(self) -> list[pathlib.Path]:
        """The node's component logs (in the cluster's log folder), in start order."""
        return [self.cluster.log_dir / f"{name}.log" for name in COMPONENTS]

    def containers(self) -> list[str]:
        """Return the ids of the containers (sandboxes included) containerd holds for Kubernetes."""
        if not self.layout.containerd_socket.exists():
            return []
        return self._ctr("containers", "list", "-q", check=False).stdout.split()

    def tasks(self) -> list[str]:
        """Return the ids of the running container processes (tasks) of containerd's Kubernetes namespace."""
        if not self.layout.containerd_socket.exists():
            return []
        lines = self._ctr("tasks", "list", check=False).stdout.splitlines()[1:]
        return [line.split()[0] for line in lines if line.split() and line.split()[-1] == "RUNNING"]

    def tasks_of(self, pod_uids: set[str]) -> list[str]:
        """Return the running containers (sandboxes included) of the given pods, by the CRI's pod UID label.

        Args:
            pod_uids (set[str]): Pod UIDs (``metadata.uid``).

        Returns:
            list[str]: containerd container ids whose task is running.
        """
        running = set(self.tasks())
        found = []
        for uid in sorted(pod_uids):
            ids = self._ctr("containers", "list", "-q", f'labels."io.kubernetes.pod.uid"=={uid}', check=False).stdout
            found += [cid for cid in ids.split() if cid in running]
        return found

    def stop(self) -> None:
        """Drain and stop the node and undo every host change; idempotent. See the module docstring for the order.

        What still differs from the host snapshot taken at start is left in :attr:`leftovers` (and logged).
        """
        if not self._running:
            return
        self._running = False
        self._drain()
        by_name = {proc.name: proc for proc in self.processes}
        for name in ("kubelet", "coredns"):
            if name in by_name:
                _process.stop(by_name[name])
        self._remove_containers()
        if "containerd" in by_name:
            _process.stop(by_name["containerd"])
        kill_shims(self.layout)
        self._api.request("DELETE", f"/api/v1/nodes/{self.name}")
        baseline = self.baseline
        clean_host(
            self.layout, self.cluster.ports.apiserver, baseline.paths if baseline else None,
            baseline.sysctls if baseline else None,
        )
        (self.cluster.workdir / STATE_FILE).unlink(missing_ok=True)
        _hostrecord.remove(self.cluster.workdir)
        if baseline is not None:
            self.leftovers = _hoststate.difference(baseline, _hoststate.snapshot())
            if self.leftovers:
                self._log("devcluster: the real node left host state behind:\n  " + "\n  ".join(self.leftovers))

    def _drain(self) -> None:
        """Cordon, delete the node's pods now, and wait (bounded) until the kubelet has stopped their containers."""
        kubelet = next((p for p in self.processes if p.name == "kubelet"), None)
        if kubelet is None or kubelet.exit_code() is not None:
            return
        self.cluster.kubectl("cordon", self.name, check=False)
        self.cluster.kubectl(
            "delete", "pods", "--all-namespaces", f"--field-selector=spec.nodeName={self.name}",
            "--grace-period=0", "--force", "--wait=false", check=False,
        )  # fmt: skip
        deadline = time.monotonic() + DRAIN_TIMEOUT_SECONDS
        while self.tasks() and time.monotonic() < deadline:
            time.sleep(0.5)

    def _remove_containers(self) -> None:
        """Kill and delete what the kubelet left (its sandboxes; anything after a crash)."""
        if not self.layout.containerd_socket.exists():
            return
        for container in self.containers():
            self._ctr("tasks", "kill", "--signal", "SIGKILL", container, check=False)
        deadline = time.monotonic() + 10.0
        while self.tasks() and time.monotonic() < deadline:
            time.sleep(0.2)
        for container in self.containers():
            self._ctr("tasks", "delete", "--force", container, check=False)
            self._ctr("containers", "delete", container, check=False)

    def __enter__(self) -> RealNode:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def _write_state(self) -> None:
        state = {
            "root": str(self.layout.root),
            "workdir": str(self.cluster.workdir),
            "apiserver_port": self.cluster.ports.apiserver,
            "pids": {proc.name: proc.pid for proc in self.processes},
            "paths_before": sorted(self.baseline.paths) if self.baseline else None,
            "sysctls_before": self.baseline.sysctls if self.baseline else None,
            "links_before": sorted(self.baseline.links) if self.baseline else None,
            "owner": _hostrecord.process_id(os.getpid()),
            "detached": self.cluster.detached,
            "components": {proc.name: _hostrecord.process_id(proc.pid) for proc in self.processes},
        }
        (self.cluster.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))
        _hostrecord.write(state)


def kill_shims(layout: cfg.NodeLayout) -> int:
    """SIGKILL the runc shims of a node's containerd (they run detached from it; found by its socket path).

    Returns:
        int: How many were killed.
    """
    marker = str(layout.containerd_socket)
    killed = 0
    for pid in _hoststate.processes(("containerd-shim-runc-v2",)):
        try:
            if marker in pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace"):
                os.kill(pid, signal.SIGKILL)
                killed += 1
        except (OSError, ProcessLookupError):
            pass
    return killed


def clean_host(
    layout: cfg.NodeLayout,
    apiserver_port: int,
    paths_before: frozenset[str] | None,
    sysctls_before: tuple[tuple[str, str], ...] | None = None,
) -> None:
    """Undo the node's host changes once its processes are gone (also after a crash; each step is idempotent).

    Args:
        layout (cfg.NodeLayout): The node's folders (removed at the end).
        apiserver_port (int): Port in the DNAT rule.
        paths_before (frozenset[str] | None): Default-path entries present before start
            (:attr:`_hoststate.HostState.paths`); newer ones are removed. None leaves default paths alone.
        sysctls_before (tuple[tuple[str, str], ...] | None, optional): Host-wide sysctls before start
            (:attr:`_hoststate.HostState.sysctls`), written back where they changed. None leaves them alone.
    """
    _hoststate.unmount_under(layout.root)
    _hoststate.remove_cgroups(NODE_CGROUPS)
    rule = cfg.api_server_dnat(apiserver_port)
    while _dnat_present(apiserver_port):
        _run(["iptables", "-w", "5", "-t", "nat", "-D", "PREROUTING", *rule], "removing the API server DNAT rule")
    if pathlib.Path(f"/sys/class/net/{cfg.BRIDGE}").exists():
        _run(["ip", "link", "delete", cfg.BRIDGE], "removing the bridge")
    if paths_before is not None:
        _hoststate.remove_new_paths(paths_before)
    if sysctls_before is not None:
        _hoststate.restore_sysctls(sysctls_before)
    shutil.rmtree(layout.root, ignore_errors=True)


def remove_node(state: dict, log: Callable[[str], None] | None = None) -> list[str]:
    """Stop a recorded node's processes and undo its host changes, without its control plane (which may be gone).

    Pods are not drained: the processes are stopped, the leftover containers' processes die with their cgroups, the
    bandwidth plugin's devices of its pods are deleted (:func:`remove_pod_links`), and :func:`clean_host` runs with
    the default paths and sysctls recorded at start. The record is removed last.

    Args:
        state (dict): The node's record (:data:`STATE_FILE`, :data:`_hostrecord.HOST_RECORD`).
        log (Callable[[str], None] | None, optional): Progress sink. Defaults to None (quiet).

    Returns:
        list[str]: What was found and removed, for people (e.g. ``["kubelet (pid 12)", "bridge rlnode0"]``).
    """
    workdir = pathlib.Path(state["workdir"])
    found = []
    for name, pid in reversed(list(state["pids"].items())):
        entry = state.get("components", {}).get(name)
        if not (_hostrecord.runs(entry) if entry else _process.alive(pid)):
            continue  # gone, or its pid is another process's now
        found.append(f"{name} (pid {pid})")
        _process.stop(_process.Managed(name=name, pid=pid, log_path=workdir / "logs" / f"{name}.log"))
        if log is not None:
            log(f"devcluster: {name} (pid {pid}) stopped")
    layout = cfg.NodeLayout(pathlib.Path(state["root"]))
    shims = kill_shims(layout)
    mounts = _hoststate.mounts_under(layout.root)
    found += [f"{shims} containerd shim(s)"] if shims else []
    found += [f"cgroup {name}" for name in _hoststate.cgroups_named(NODE_CGROUPS)]
    found += [f"{len(mounts)} mount(s)"] if mounts else []
    found += [f"bridge {cfg.BRIDGE}"] if pathlib.Path(f"/sys/class/net/{cfg.BRIDGE}").exists() else []
    found += [f"NAT rule to 127.0.0.1:{state['apiserver_port']}"] if _dnat_present(state["apiserver_port"]) else []
    before, sysctls = state.get("paths_before"), state.get("sysctls_before")
    clean_host(
        layout, state["apiserver_port"], frozenset(before) if before is not None else None,
        tuple((name, value) for name, value in sysctls) if sysctls is not None else None,
    )  # fmt: skip
    if state.get("links_before") is not None:
        found += [f"link {link}" for link in remove_pod_links(frozenset(state["links_before"]))]
    (workdir / STATE_FILE).unlink(missing_ok=True)
    _hostrecord.remove(workdir)
    return found


def remove_pod_links(links_before: frozenset[str]) -> list[str]:
    """Delete the CNI bandwidth plugin's ifb devices (``bwp*``) that appeared since an observation.

    The plugin makes one in the host's namespace per pod with an egress cap and deletes it only on the pod's CNI
    DEL, which a killed node never runs; the pods' veths go with their network namespaces. Source: the bandwidth
    plugin (containernetworking/plugins, plugins/meta/bandwidth: ``getIfbDeviceName``).

    Args:
        links_before (frozenset[str]): :attr:`_hoststate.HostState.links` before the node started.

    Returns:
        list[str]: The links deleted.
    """
    now = {entry.name for entry in pathlib.Path("/sys/class/net").iterdir()}
    removed = sorted(link for link in now - links_before if link.startswith(BANDWIDTH_IFB_PREFIX))
    for link in removed:
        _run(["ip", "link", "delete", link], "removing a pod's ifb device", check=False)
    return removed


def _dnat_present(apiserver_port: int) -> bool:
    probe = ["iptables", "-w", "5", "-t", "nat", "-C", "PREROUTING", *cfg.api_server_dnat(apiserver_port)]
    return _run(probe, "checking", check=False).returncode == 0


def stop_from_state(workdir: pathlib.Path, log: Callable[[str], None] = print) -> bool:
    """Stop a real node that ``devcluster up --real-node`` left running and clean the host (:func:`remove_node`).

    Args:
        workdir (pathlib.Path): The cluster's work folder.
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Returns:
        bool: True when a state file was found.
    """
    state_path = workdir / STATE_FILE
    if not state_path.is_file():
        return False
    remove_node({"workdir": str(workdir), **json.loads(state_path.read_text())}, log)
    return True
