"""A running dev cluster: start the components in order, wait until usable, act on it, stop every process.

Start order: credentials, etcd (``/health``), kube-apiserver (``/readyz``), then kube-controller-manager,
kube-scheduler and kwok together; the fake nodes are created as soon as the API answers. The cluster counts as
ready when the controller-manager and scheduler answer ``/healthz``, every fake node is Ready and has its Lease
(kwok renews it, so the node lifecycle controller never marks the node Unknown) and the ``default``
ServiceAccount exists in ``default`` (the ServiceAccount controller made it; pods need it).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import pathlib
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable

import yaml

from devcluster import _build
from devcluster import _components
from devcluster import _http
from devcluster import _kubeconfig
from devcluster import _nodes
from devcluster import _pki
from devcluster import _ports
from devcluster import _process

START_TIMEOUT_SECONDS = 180.0
"""Upper bound for :meth:`Cluster.start` (a cold start takes ~15 s on 2 cores; slack for a loaded machine)."""

KUBECTL_TIMEOUT_SECONDS = 120.0
"""Upper bound for one :meth:`Cluster.kubectl` call."""

TOKEN_SECONDS = 3600
"""Lifetime of ServiceAccount tokens from :meth:`Cluster.service_account_kubeconfig`."""

STATE_FILE = "state.json"
"""File in the work folder recording pids, ports and paths (read by ``devcluster down``/``status``)."""

DATA_DIRS = ("etcd-data", "pki", "kwok-home")
"""Sub-folders of a work folder removed when its cluster stops (the logs and kubeconfigs stay)."""

TEMP_PREFIX = "rlightning-devcluster-"
"""Prefix of the temporary work folders of test clusters."""

COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok")
"""Processes of a cluster, in start order (stopped in reverse)."""


class ClusterError(RuntimeError):
    """Raised when the cluster cannot start, a component dies, or a command against it fails."""


class Cluster(_process.Supervisor):
    """A control plane of real Kubernetes components with fake kwok nodes, on loopback.

    Args:
        workdir (pathlib.Path): Folder for data, credentials, kubeconfigs and logs (created).
        build (_build.BuildResult): Where the binaries and kwok stages are.
        ports (_ports.Ports): Fixed ports (see :mod:`devcluster._ports`).
        detach (bool, optional): True when the processes must outlive this Python process (``devcluster up``);
            False ties them to it (they get SIGKILL when it dies) and stops them at interpreter exit.
            Defaults to False.
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Example:
        >>> with Cluster(workdir, _build.build(), _ports.for_slot(0)) as cluster:  # doctest: +SKIP
        ...     cluster.kubectl("get", "nodes")
    """

    error = ClusterError

    def __init__(
        self,
        workdir: pathlib.Path,
        build: _build.BuildResult,
        ports: _ports.Ports,
        detach: bool = False,
        log: Callable[[str], None] = print,
    ) -> None:
        self.workdir = workdir
        self.ports = ports
        self._build = build
        self._detach = detach
        self._log = log
        self.processes: list[_process.Managed] = []
        self._pki: _pki.PKI | None = None
        self._stopped = False

    # -- public attributes -------------------------------------------------------------------------------

    @property
    def server(self) -> str:
        """API server URL (``https://127.0.0.1:<port>``)."""
        return f"https://{_ports.HOST}:{self.ports.apiserver}"

    @property
    def kubeconfig(self) -> pathlib.Path:
        """Admin kubeconfig (bearer token in ``system:masters``)."""
        return self.workdir / "admin.kubeconfig"

    @property
    def log_dir(self) -> pathlib.Path:
        """Folder with ``<component>.log`` for each process."""
        return self.workdir / "logs"

    @property
    def detached(self) -> bool:
        """True when the processes outlive this Python process (``devcluster up``)."""
        return self._detach

    @property
    def pki_dir(self) -> pathlib.Path:
        """Folder of the cluster's keys and certificates (the CA signs node certificates there); removed at stop."""
        return self.workdir / "pki"

    @property
    def ca_cert(self) -> pathlib.Path:
        """CA certificate (PEM) that signed the API server's serving certificate."""
        return self.workdir / "ca.crt"

    @property
    def admin_token(self) -> str:
        """Bearer token of the admin user."""
        return yaml.safe_load(self.kubeconfig.read_text())["users"][0]["user"]["token"]

    def bin(self, name: str) -> pathlib.Path:
        """Return the path of a built binary.

        Args:
            name (str): ``kubectl``, ``helm``, ``kube-apiserver``, ``etcd``, ``kwok`` ...

        Raises:
            ClusterError: When no such binary was built.
        """
        path = self._build.bin_dir / name
        if not os.access(path, os.X_OK):
            raise ClusterError(f"no binary {name!r} in {self._build.bin_dir}")
        return path

    # -- lifecycle ---------------------------------------------------------------------------------------

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> Cluster:
        """Start every component and wait until the cluster is ready; on any failure stop what was started.

        Args:
            timeout (float, optional): Seconds for the whole start. Defaults to :data:`START_TIMEOUT_SECONDS`.

        Returns:
            Cluster: ``self``.

        Raises:
            _ports.PortInUseError: When a port of the block is taken.
            ClusterError: When a component exits early or readiness is not reached in time (with log tails).
        """
        _ports.check_free(self.ports)
        if not self._detach:
            atexit.register(self.stop)
        self._start_or_stop(self._start, timeout)
        return self

    def _start(self, deadline: float) -> None:
        began = time.monotonic()
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.log_dir.mkdir(exist_ok=True)
        self._pki = _pki.generate(self.pki_dir)
        shutil.copyfile(self._pki.ca_cert, self.ca_cert)
        _kubeconfig.write(self.kubeconfig, self.server, self.ca_cert, _pki.ADMIN_USER, self._pki.admin_token)
        layout = _components.Layout(
            self.workdir, self._build.bin_dir, self._build.stages_file, self._pki, self.kubeconfig
        )
        layout.scheduler_config.write_text(yaml.safe_dump(_components.scheduler_config(layout)))
        kwok_home = self.workdir / "kwok-home"  # kwok also loads ~/.kwok/kwok.yaml; isolate it
        kwok_home.mkdir(exist_ok=True)

        self._spawn("etcd", _components.etcd(layout, self.ports))
        etcd_health = f"http://{_ports.HOST}:{self.ports.etcd_client}/health"
        self._wait("etcd /health", deadline, lambda: _http.healthy(etcd_health))
        self._spawn("kube-apiserver", _components.kube_apiserver(layout, self.ports))
        api = _http.ApiServer(self.server, self._pki.ca_cert, self._pki.admin_token)
        self._wait("kube-apiserver /readyz", deadline, lambda: api.request("GET", "/readyz")[0] == 200)
        self._log(f"devcluster: API server ready after {time.monotonic() - began:.1f}s")
        self._spawn("kube-controller-manager", _components.kube_controller_manager(layout, self.ports))
        self._spawn("kube-scheduler", _components.kube_scheduler(layout, self.ports))
        self._spawn("kwok", _components.kwok(layout, self.ports), env={**os.environ, "HOME": str(kwok_home)})
        for node in _nodes.all_nodes():
            status, text = api.request("POST", "/api/v1/nodes", node)
            if status not in (201, 409):
                raise ClusterError(f"creating node {node['metadata']['name']} failed: HTTP {status}: {text[:500]}")
        for name, port in (
            ("kube-controller-manager", self.ports.controller_manager),
            ("kube-scheduler", self.ports.scheduler),
        ):
            url = f"https://{_ports.HOST}:{port}/healthz"
            self._wait(f"{name} /healthz", deadline, functools.partial(_http.healthy, url, verify=False))
        self._wait(f"{_nodes.NODE_COUNT} nodes Ready", deadline, lambda: self._ready_nodes(api) >= _nodes.NODE_COUNT)
        self._wait(f"{_nodes.NODE_COUNT} node Leases", deadline, lambda: self._node_leases(api) >= _nodes.NODE_COUNT)
        self._wait(
            "ServiceAccount default/default",
            deadline,
            lambda: api.get_json("/api/v1/namespaces/default/serviceaccounts/default") is not None,
        )
        self._log(f"devcluster: ready after {time.monotonic() - began:.1f}s; logs in {self.log_dir}")

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> None:
        proc = _process.start(name, argv, self.log_dir / f"{name}.log", detach=self._detach, env=env)
        self.processes.append(proc)
        self._write_state()

    @staticmethod
    def _ready_nodes(api: _http.ApiServer) -> int:
        listing = api.get_json("/api/v1/nodes?labelSelector=type%3Dkwok")
        if listing is None:
            return 0
        return sum(
            any(
                c.get("type") == "Ready" and c.get("status") == "True"
                for c in item.get("status", {}).get("conditions", [])
            )
            for item in listing.get("items", [])
        )

    @staticmethod
    def _node_leases(api: _http.ApiServer) -> int:
        listing = api.get_json("/apis/coordination.k8s.io/v1/namespaces/kube-node-lease/leases")
        return len(listing.get("items", [])) if listing else 0

    def stop(self) -> None:
        """Stop every process (reverse start order, SIGTERM then SIGKILL, by process group); idempotent.

        The etcd data and credentials are removed; the logs stay in :attr:`log_dir`.
        """
        if self._stopped:
            return
        self._stopped = True
        atexit.unregister(self.stop)
        for proc in reversed(self.processes):
            _process.stop(proc)
        for sub in DATA_DIRS:
            shutil.rmtree(self.workdir / sub, ignore_errors=True)
        (self.workdir / STATE_FILE).unlink(missing_ok=True)

    def restart_api_server(self, timeout: float = START_TIMEOUT_SECONDS) -> float:
        """SIGKILL the API server (a crash: connections reset, no graceful shutdown), start it again with the same
        command line and wait until ``/readyz`` answers; then restart the controller-manager and the scheduler.

        Those two are restarted as a control-plane node's kubelet restarts them once the API server was gone past
        their leader election's renew deadline: kept running, their client-go reflectors retry a lost watch after a
        backoff that doubles from 0.8 s to 30 s, with up to as much again of jitter, and resets only after 2 min
        without a failure (k8s.io/client-go tools/cache/reflector.go), so after a few restarts in a row their Jobs,
        StatefulSets and pods moved up to a minute late, and a drill measured them instead of what it drills. kwok keeps
        running: a new one would hold none of the nodes' Leases, and run their pods only once those expired.

        Args:
            timeout (float, optional): Seconds for the API server to be ready. Defaults to
                :data:`START_TIMEOUT_SECONDS`.

        Returns:
            float: ``time.monotonic()`` when ``/readyz`` answered 200 again.

        Raises:
            ClusterError: When a component was not started here, exits early, or the API server is not ready in time.
        """
        assert self._pki is not None, "set by start"
        self._respawn("kube-apiserver")
        api = _http.ApiServer(self.server, self._pki.ca_cert, self._pki.admin_token)
        self._wait("kube-apiserver /readyz", time.monotonic() + timeout,
                   lambda: api.request("GET", "/readyz")[0] == 200)
        answered = time.monotonic()
        for name in ("kube-controller-manager", "kube-scheduler"):
            self._respawn(name)
        return answered

    def _respawn(self, name: str) -> None:
        """SIGKILL a component started here and start it again with the same command line and environment."""
        old = next((proc for proc in self.processes if proc.name == name and proc.popen is not None), None)
        if old is None:
            raise ClusterError(f"no component {name!r} was started here")
        _process.kill(old)
        new = _process.start(name, old.argv, old.log_path, detach=self._detach, env=old.env)
        self.processes[self.processes.index(old)] = new
        self._write_state()

    def __enter__(self) -> Cluster:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    # -- state file for `up` / `down` ---------------------------------------------------------------------

    def _write_state(self) -> None:
        state = {
            "pids": {proc.name: proc.pid for proc in self.processes},
            "ports": self.ports.named(),
            "kubeconfig": str(self.kubeconfig),
            "log_dir": str(self.log_dir),
            "bin_dir": str(self._build.bin_dir),
        }
        (self.workdir / STATE_FILE).write_text(json.dumps(state, indent=2))

    # -- acting on the cluster ----------------------------------------------------------------------------

    def kubectl(self, *args: str, check: bool = True, input: str | None = None) -> subprocess.CompletedProcess:  # noqa: A002 (subprocess's name)
        """Run kubectl as the admin.

        Args:
            *args (str): kubectl arguments, e.g. ``("get", "pods", "-n", "x", "-o", "json")``.
            check (bool, optional): Raise when kubectl exits non-zero. Defaults to True.
            input (str | None, optional): Text for standard input (``apply -f -``). Defaults to None.

        Returns:
            subprocess.CompletedProcess: With text ``stdout`` and ``stderr``.

        Raises:
            ClusterError: When ``check`` and kubectl fails (message has the command and its stderr).
        """
        cmd = [str(self.bin("kubectl")), f"--kubeconfig={self.kubeconfig}", *args]
        proc = subprocess.run(
            cmd,
            input=input,
            capture_output=True,
            text=True,
            timeout=KUBECTL_TIMEOUT_SECONDS,
            env={**os.environ, "KUBECONFIG": str(self.kubeconfig)},
        )
        if check and proc.returncode != 0:
            raise ClusterError(f"kubectl {' '.join(args)} failed (exit {proc.returncode}): {proc.stderr.strip()}")
        return proc

    def api_client(self):
        """Return a ``kubernetes.client.ApiClient`` authenticated as the admin.

        Returns:
            kubernetes.client.ApiClient: A new client; close it when done.
        """
        import kubernetes  # imported here: the launcher itself does not need the client library

        return kubernetes.config.new_client_from_config(config_file=str(self.kubeconfig))

    def service_account_kubeconfig(self, namespace: str, name: str) -> pathlib.Path:
        """Write a kubeconfig that acts as a ServiceAccount (token from the TokenRequest API via kubectl).

        Args:
            namespace (str): Namespace of the ServiceAccount (it must exist).
            name (str): ServiceAccount name.

        Returns:
            pathlib.Path: ``<workdir>/kubeconfigs/<namespace>.<name>.kubeconfig``, token valid for
            :data:`TOKEN_SECONDS` seconds.

        Raises:
            ClusterError: When the ServiceAccount does not exist or the token request fails.
        """
        token = self.kubectl("create", "token", name, "-n", namespace, f"--duration={TOKEN_SECONDS}s").stdout.strip()
        path = self.workdir / "kubeconfigs" / f"{namespace}.{name}.kubeconfig"
        return _kubeconfig.write(
            path, self.server, self.ca_cert, f"system:serviceaccount:{namespace}:{name}", token, namespace
        )

    def log_paths(self) -> list[pathlib.Path]:
        """Every component's log, in start order (an attached cluster's too: its processes were started elsewhere)."""
        return [self.log_dir / f"{name}.log" for name in COMPONENTS]


def stop_from_state(workdir: pathlib.Path, log: Callable[[str], None] = print) -> bool:
    """Stop a cluster that ``devcluster up`` left running, using its state file.

    Args:
        workdir (pathlib.Path): The cluster's work folder.
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Returns:
        bool: True when a state file was found (and its processes were stopped), False otherwise.
    """
    state_path = workdir / STATE_FILE
    if not state_path.is_file():
        return False
    state = json.loads(state_path.read_text())
    for name, pid in reversed(list(state["pids"].items())):
        was_alive = _process.alive(pid)
        _process.stop(_process.Managed(name=name, pid=pid, log_path=workdir / "logs" / f"{name}.log"))
        log(f"devcluster: {name} (pid {pid}) {'stopped' if was_alive else 'was not running'}")
    for sub in DATA_DIRS:
        shutil.rmtree(workdir / sub, ignore_errors=True)
    state_path.unlink(missing_ok=True)
    return True


def sweep_stale(parent: pathlib.Path, log: Callable[[str], None] = print) -> None:
    """Free the data of test clusters whose launcher died without stopping them (SIGKILL, crash).

    A temporary work folder still holding a state file whose processes are all gone gets the same cleanup as
    :func:`stop_from_state` (etcd data, credentials; about 130 MB each). Logs stay.

    Args:
        parent (pathlib.Path): Folder holding ``rlightning-devcluster-*`` work folders (the temp dir).
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.
    """
    for state_path in parent.glob(f"{TEMP_PREFIX}*/{STATE_FILE}"):
        try:
            state = read_state(state_path.parent)
        except (OSError, ValueError):
            continue
        if state is not None and not any(state["alive"].values()):
            log(f"devcluster: removing the data of a dead cluster in {state_path.parent}")
            stop_from_state(state_path.parent, log=lambda _message: None)


def read_state(workdir: pathlib.Path) -> dict | None:
    """Return the state file of a cluster left running by ``up`` with each pid's liveness, or None.

    Args:
        workdir (pathlib.Path): The cluster's work folder.

    Returns:
        dict | None: The state plus ``"alive": {name: bool}``.
    """
    state_path = workdir / STATE_FILE
    if not state_path.is_file():
        return None
    state = json.loads(state_path.read_text())
    state["alive"] = {name: _process.alive(pid) for name, pid in state["pids"].items()}
    return state


def run_dir(slot: int) -> pathlib.Path:
    """Return the work folder of the long-lived cluster of a slot (``devcluster up``/``down``)."""
    return _build.cache_root() / "run" / f"slot-{slot}"


def launch(
    workdir: pathlib.Path | None = None,
    slot: int | None = None,
    detach: bool = False,
    log: Callable[[str], None] = print,
) -> Cluster:
    """Build (or reuse) the binaries and start a ready cluster.

    Args:
        workdir (pathlib.Path | None, optional): Work folder; a new temporary folder when None. Defaults to None.
        slot (int | None, optional): Port block; ``RLIGHTNING_DEVCLUSTER_SLOT`` (default 0) when None.
            Defaults to None.
        detach (bool, optional): See :class:`Cluster`. Defaults to False.
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Returns:
        Cluster: A started cluster; call :meth:`Cluster.stop` (or use it as a context manager).

    Raises:
        _ports.PortInUseError: When a port of the block is taken.
        ClusterError: When it does not become ready.
        _build.BuildError: When the binaries do not build.
    """
    build = _build.build(log=log)
    ports = _ports.for_slot(_ports.slot_from_env() if slot is None else slot)
    if workdir is None:
        sweep_stale(pathlib.Path(tempfile.gettempdir()), log=log)
        workdir = pathlib.Path(tempfile.mkdtemp(prefix=TEMP_PREFIX))
    return Cluster(workdir, build, ports, detach=detach, log=log).start()
