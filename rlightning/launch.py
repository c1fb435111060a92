"""The launch plan: how the process of a trainer or an evaluator starts, in a pod or under `rlightning run`.

`plan` gives, per role, the argv, the environment (names from `rlightning.contract`) and the termination
grace period. The operator's builders put it into pod templates; the local launcher starts processes from it.
What differs between a pod and a local process is a `LaunchSite`. Pure: no I/O, no reading of the process
environment or the clock, and no torch or kopf, so the operator can import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from rlightning import contract
from rlightning.config import PolicyGroupManifest, PolicyGroupSpec

TRAIN_MODULE = "rlightning.runtime.train"
TORCHRUN_MODULE = "torch.distributed.run"
"""torchrun, run by the interpreter of every other process (pods)."""
LOOPBACK_TORCHRUN_MODULE = "rlightning.runtime.torchrun"
"""torchrun whose rendezvous store binds `ENV_BIND_HOST` only (torch's own binds all interfaces), and whose
`--start-method=fork` forks the ranks of a module from the agent (`FORK_RANKS`): local runs."""
FORK_RANKS = "--start-method=fork"
"""A local run's ranks are forks of torchrun's agent, itself a fork of `rlightning run`: they begin with its imports
(torch, tensordict, the policy class) instead of importing them again. Pods start fresh ranks (torchrun's default):
their agent imported only torch."""
LOOPBACK_INTERFACE = "lo"
"""The loopback interface, where gloo and NCCL bind their rank-to-rank sockets in a local run."""
SOCKET_IFNAME_ENV = ("GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
"""The variables that name the interface gloo's and NCCL's sockets bind (set to `LOOPBACK_INTERFACE` locally)."""
EVAL_MODULE = "rlightning.runtime.eval"
TORCHRUN_MONITOR_INTERVAL_SECONDS = 0.5
"""How often torchrun polls its workers; its default (0.1 s) costs CPU for nothing at these time scales."""
GRACE_MARGIN_SECONDS = 15
"""Added to spec.weightSync.timeoutSeconds for the grace after SIGTERM: an evaluator leaves its group cleanly
(bounded by the weight-sync timeout), a trainer finishes the publish in flight (same bound) and writes its final
checkpoint and summary.json (the margin)."""
THREADS_ENV = "OMP_NUM_THREADS"
"""Threads of OpenMP and of torch's intra-op pool (torch reads it at start; torchrun sets 1 only when it starts
several ranks, so a lone rank would otherwise take one thread per core of the whole node)."""
RESOLVER_ENV = "RES_OPTIONS"
"""glibc's resolver options from the environment, as resolv.conf(5)'s `options` line."""
LOCAL_RESOLVER_OPTIONS = "timeout:1"
"""`RES_OPTIONS` of `rlightning run`'s children (and of the tests' processes) unless set: glibc then asks again after
1 s, not resolv.conf(5)'s default 5 s, when a DNS reply is lost. c10d names both ends of every weight-sync store
connection with a reverse lookup, locally of `::ffff:127.0.0.1`, which no /etc/hosts names (docs/weight-sync.md,
"The store and DNS")."""
RUNTIME_ENV = (
    contract.ENV_BIND_HOST,
    contract.ENV_EVAL_ORDINAL,
    contract.ENV_EXPECTED_EVALUATORS,
    contract.ENV_ERROR_FILE,
    contract.ENV_FLEET_DATA,
    contract.ENV_GROUP_NAME,
    contract.ENV_HEALTH_FILE,
    contract.ENV_LAUNCH_TIME,
    contract.ENV_METRICS_PORT,
    contract.ENV_NAMESPACE,
    contract.ENV_POD_NAME,
    contract.ENV_REPORT_STATUS,
    contract.ENV_ROLE,
    contract.ENV_RUN_DIR,
    contract.ENV_SPEC_PATH,
    contract.ENV_TRAIN_MASTER_ADDR,
    contract.ENV_TRAJECTORY_ENDPOINTS,
    contract.ENV_WEIGHT_SYNC_PORT,
)
"""Every variable the runtime reads (`rlightning.runtime.settings`); a launcher drops inherited ones."""


@dataclass(frozen=True)
class LaunchSite:
    """Where the processes of a PolicyGroup run: what differs between its pods and `rlightning run`.

    Attributes:
        python (str): Interpreter of every process: `python` in the image, `sys.executable` locally.
        master_addr (str): Host of trainer node rank 0 (torchrun's rendezvous, the weight-sync store): pod 0's
            DNS name, or `127.0.0.1`.
        trainer_hosts (tuple[str, ...]): Host of each trainer node, in node rank order (pods' stable DNS names);
            with `node_rank` None, one host that runs every rank.
        spec_path (str): The manifest the processes read.
        run_dir (str): Directory for metrics, checkpoints and the summary.
        node_rank (str | None): torchrun's `--node-rank`; in a pod `$(JOB_COMPLETION_INDEX)`, which Kubernetes
            expands from the Indexed Job's environment. None runs all `train.world_size` ranks as one node.
        metrics (bool): Serve Prometheus metrics on `spec.ports.metrics` (pods: each has its own address);
            False sets port 0, no endpoint (local processes would share one port).
        expected_evaluators (int | None): Evaluators the launcher starts, told to the trainer; None when the
            fleet size is dynamic (pods: the trainer counts the evaluators that register).
        in_pod (bool): The processes run in Kubernetes pods: their namespace and pod name (hence an evaluator's
            ordinal) come from the downward API (`LaunchPlan.env_from_pod`), and trainer rank 0 reports to the
            PolicyGroup's status. False: an evaluator gets its ordinal in the environment.
        bind_host (str | None): The address every listening port binds (`contract.ENV_BIND_HOST`):
            `contract.LOOPBACK_HOST` for `rlightning run`, whose gloo and NCCL sockets then bind the loopback
            interface too and whose torchrun is `LOOPBACK_TORCHRUN_MODULE`; None (pods): all interfaces.
    """

    python: str
    master_addr: str
    trainer_hosts: tuple[str, ...]
    spec_path: str
    run_dir: str
    node_rank: str | None
    metrics: bool
    expected_evaluators: int | None
    in_pod: bool
    bind_host: str | None = None


PROBE_PERIOD_SECONDS = 10
LIVENESS_MARGIN_SECONDS = 60
"""Added to 3 x weightSync.timeoutSeconds for the longest a trainer's loop may go without a heartbeat: a publish, a
target confirmation and a checkpoint each wait at most about one timeout."""
STATUS_REPORT_SECONDS = 5.0
"""Least time between two status.training patches of trainer rank 0 (`rlightning.runtime._status_reporter`): a fast
loop does not load the API server (12 patches a minute per PolicyGroup at most)."""


def liveness_seconds(spec: PolicyGroupSpec) -> int:
    """The longest a healthy trainer loop goes without a heartbeat, in s: `SyncTimings.trainer_waits` (3 x
    weightSync.timeoutSeconds, rounded up) + `LIVENESS_MARGIN_SECONDS` (240 s with the defaults).

    Args:
        spec (PolicyGroupSpec): The validated spec.

    Returns:
        int: Seconds.
    """
    return spec.weight_sync.timings.trainer_waits + LIVENESS_MARGIN_SECONDS


def stall_seconds(spec: PolicyGroupSpec) -> float:
    """How long ready trainers may go without reporting an iteration before they count as not training, in s.

    A healthy loop moves within `liveness_seconds` (each bounded wait of an iteration is one weight-sync timeout),
    and its start after the rendezvous (the fleet's rejoin, 12 s; a pull of the fleet's weights, at most 60 s; the
    first publish, one timeout) fits in it too; a report trails its iteration by up to `STATUS_REPORT_SECONDS`.

    Args:
        spec (PolicyGroupSpec): The validated spec.

    Returns:
        float: `liveness_seconds` + `STATUS_REPORT_SECONDS` (245 s with the defaults).
    """
    return liveness_seconds(spec) + STATUS_REPORT_SECONDS


@dataclass(frozen=True)
class Probe:
    """A pod's probe of its process, an exec of `argv` in the container (exit 0: healthy).

    Attributes:
        kind (str): `readiness` (evaluators: holds weights) or `liveness` (trainers: the loop moves).
        argv (tuple[str, ...]): The command.
        period_seconds (int): Seconds between probes.
        failure_threshold (int): Consecutive failures that count.
    """

    kind: str
    argv: tuple[str, ...]
    period_seconds: int = PROBE_PERIOD_SECONDS
    failure_threshold: int = 3


def probe(spec: PolicyGroupSpec, role: contract.PolicyRole, python: str) -> Probe:
    """The probe of a role's pods, on `contract.HEALTH_FILE_IN_POD`.

    An evaluator is ready once it holds weights (it creates the file after its first apply; before that it does no
    work). A trainer is alive while its local rank 0 touched the file within 3 x weightSync.timeoutSeconds +
    `LIVENESS_MARGIN_SECONDS` (a missing file, before the loop starts, counts as alive).

    Args:
        spec (PolicyGroupSpec): The validated spec.
        role (contract.PolicyRole): The role.
        python (str): The interpreter in the image.

    Returns:
        Probe: The readiness (eval) or liveness (train) probe.
    """
    path = contract.HEALTH_FILE_IN_POD
    if role == contract.PolicyRole.EVAL:
        return Probe("readiness", (python, "-c", f"import os, sys; sys.exit(not os.path.exists({path!r}))"))
    stale = liveness_seconds(spec)
    check = (
        f"import os, sys, time; p = {path!r}; "
        f"sys.exit(os.path.exists(p) and time.time() - os.path.getmtime(p) > {stale})"
    )
    return Probe("liveness", (python, "-c", check))


@dataclass(frozen=True)
class LaunchPlan:
    """How one process of a role starts.

    Attributes:
        role (contract.PolicyRole): The role.
        argv (tuple[str, ...]): The command line.
        env (dict[str, str]): Environment variables with their values, sorted by name.
        env_from_pod (tuple[str, ...]): Names of variables the platform fills when the pod starts (the pod's
            namespace and name, from the downward API), sorted; empty outside pods.
        grace_seconds (int): Grace after SIGTERM before SIGKILL (a pod's terminationGracePeriodSeconds), in s.
        probe (Probe | None): The pod's probe of the process; None outside pods.
    """

    role: contract.PolicyRole
    argv: tuple[str, ...]
    env: dict[str, str]
    env_from_pod: tuple[str, ...]
    grace_seconds: int
    probe: Probe | None = None


def grace_seconds(spec: PolicyGroupSpec) -> int:
    """Grace after SIGTERM of trainers and evaluators (Kubernetes' default, 30 s, is too short).

    Args:
        spec (PolicyGroupSpec): The validated spec.

    Returns:
        int: `SyncTimings.drain` (ceil(spec.weightSync.timeoutSeconds)) + `GRACE_MARGIN_SECONDS`, in seconds.
    """
    return spec.weight_sync.timings.drain + GRACE_MARGIN_SECONDS


def threads_per_process(spec: PolicyGroupSpec, role: contract.PolicyRole) -> int | None:
    """Threads each process of a `role` pod should use: the pod's CPU shared by the processes it runs.

    Without it a pod's torch sizes its thread pools by the node's cores, not the pod's CPU, and the ranks and
    evaluators sharing a node oversubscribe it (PyTorch docs, "CPU threading and TorchScript inference":
    set OMP_NUM_THREADS to the cores a process may use).

    Args:
        spec (PolicyGroupSpec): The validated spec.
        role (contract.PolicyRole): `train` (procsPerNode ranks per pod) or `eval` (one process per pod).

    Returns:
        int | None: floor(CPU limit, else request, in cores / processes), at least 1; without a CPU figure, 1
            for several processes per pod (torchrun's own choice) and None (the runtime's default) for one.
    """
    processes = spec.train.procs_per_node if role == contract.PolicyRole.TRAIN else 1
    pod = spec.train.pod if role == contract.PolicyRole.TRAIN else spec.eval.pod
    cores = pod.resources.cpu_cores()
    if cores is None:
        return 1 if processes > 1 else None
    return max(1, math.floor(cores / processes))


def fleet_collects(spec: PolicyGroupSpec) -> bool:
    """Whether the evaluators produce the training data: `train.dataSource`, else `eval.replicas` >= 1.

    Args:
        spec (PolicyGroupSpec): The validated spec, with its `eval.replicas` (not the operator's mounted copy).

    Returns:
        bool: True for fleet data.
    """
    if spec.train.data_source is not None:
        return spec.train.data_source == "fleet"
    return spec.eval.replicas >= 1


def trajectory_endpoints(spec: PolicyGroupSpec, site: LaunchSite) -> tuple[str, ...]:
    """`host:port` of every trainer rank's trajectory intake, in global rank order (torchrun numbers ranks node by
    node: rank = node rank * procsPerNode + local rank, and local rank r listens on `ports.trajectories` + r).

    Args:
        spec (PolicyGroupSpec): The validated spec.
        site (LaunchSite): Pods or local processes.

    Returns:
        tuple[str, ...]: `train.world_size` endpoints.
    """
    per_host = spec.train.world_size if site.node_rank is None else spec.train.procs_per_node
    return tuple(f"{host}:{spec.ports.trajectories + r}" for host in site.trainer_hosts for r in range(per_host))


def _argv(spec: PolicyGroupSpec, role: contract.PolicyRole, site: LaunchSite) -> tuple[str, ...]:
    if role == contract.PolicyRole.EVAL:
        return (site.python, "-m", EVAL_MODULE)
    if site.node_rank is None:
        nodes = ["--nnodes=1", f"--nproc-per-node={spec.train.world_size}"]
    else:
        nodes = [f"--nnodes={spec.train.nodes}", f"--nproc-per-node={spec.train.procs_per_node}"]
        nodes.append(f"--node-rank={site.node_rank}")
    if site.bind_host is None:
        torchrun: tuple[str, ...] = (TORCHRUN_MODULE,)
    else:
        torchrun = (LOOPBACK_TORCHRUN_MODULE, FORK_RANKS)
    return (
        site.python, "-m", *torchrun,
        *nodes,
        f"--master-addr={site.master_addr}",
        f"--master-port={spec.ports.torchrun}",
        "--max-restarts=0",  # a failed rank fails the process; the Job or the launcher decides what follows
        f"--monitor-interval={TORCHRUN_MONITOR_INTERVAL_SECONDS}",
        "-m", TRAIN_MODULE,
    )  # fmt: skip


def plan(
    manifest: PolicyGroupManifest, role: contract.PolicyRole | str, site: LaunchSite, ordinal: int | None = None
) -> LaunchPlan:
    """The launch plan of one role's process of a PolicyGroup at `site`.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        role (contract.PolicyRole | str): `train` or `eval`.
        site (LaunchSite): Pods or local processes.
        ordinal (int | None, optional): An evaluator's ordinal; None in pods, where it comes from the pod's
            name. Defaults to None.

    Returns:
        LaunchPlan: argv, environment, grace period and (in pods) the probe.

    Raises:
        ValueError: `role` is not a role; `ordinal` is given to a trainer, negative, or missing for an evaluator
            outside a pod.
    """
    role = contract.PolicyRole(role)
    spec = manifest.spec
    if ordinal is not None and (role == contract.PolicyRole.TRAIN or ordinal < 0):
        raise ValueError(f"ordinal: only an evaluator has one, and it is >= 0; got {ordinal} for role {role}")
    if role == contract.PolicyRole.EVAL and ordinal is None and not site.in_pod:
        raise ValueError("ordinal: an evaluator outside a pod needs one (a pod's comes from its name)")
    env = {
        contract.ENV_GROUP_NAME: manifest.metadata.name,
        contract.ENV_ROLE: role.value,
        contract.ENV_SPEC_PATH: site.spec_path,
        contract.ENV_RUN_DIR: site.run_dir,
        contract.ENV_TRAIN_MASTER_ADDR: site.master_addr,
        contract.ENV_WEIGHT_SYNC_PORT: str(spec.ports.weight_sync),
        contract.ENV_METRICS_PORT: str(spec.ports.metrics if site.metrics else 0),
        contract.ENV_FLEET_DATA: "1" if fleet_collects(spec) else "0",
    }
    env.update(spec.nccl)  # before the loopback interface of a local run, which must win
    if site.bind_host is not None:
        env[contract.ENV_BIND_HOST] = site.bind_host
        if site.bind_host == contract.LOOPBACK_HOST:  # DDP's and weight sync's gloo/NCCL sockets on loopback too
            env.update(dict.fromkeys(SOCKET_IFNAME_ENV, LOOPBACK_INTERFACE))
    if ordinal is not None:
        env[contract.ENV_EVAL_ORDINAL] = str(ordinal)
    if role == contract.PolicyRole.EVAL:
        env[contract.ENV_TRAJECTORY_ENDPOINTS] = ",".join(trajectory_endpoints(spec, site))
    if role == contract.PolicyRole.TRAIN and site.expected_evaluators is not None:
        env[contract.ENV_EXPECTED_EVALUATORS] = str(site.expected_evaluators)
    if site.in_pod:  # both roles: the container's termination message, which the PolicyGroup's status shows
        env[contract.ENV_ERROR_FILE] = contract.TERMINATION_LOG_IN_POD
    elif role == contract.PolicyRole.TRAIN:
        env[contract.ENV_ERROR_FILE] = f"{site.run_dir.rstrip('/')}/{contract.ERROR_FILE_NAME}"
    if role == contract.PolicyRole.TRAIN and site.in_pod:
        env[contract.ENV_REPORT_STATUS] = "1"
    if site.in_pod:
        env[contract.ENV_HEALTH_FILE] = contract.HEALTH_FILE_IN_POD
    threads = threads_per_process(spec, role)
    if site.in_pod and threads is not None:  # local children share this machine: `rlightning run` sets 1
        env[THREADS_ENV] = str(threads)
    return LaunchPlan(
        role=role,
        argv=_argv(spec, role, site),
        env=dict(sorted(env.items())),
        env_from_pod=(contract.ENV_NAMESPACE, contract.ENV_POD_NAME) if site.in_pod else (),
        grace_seconds=grace_seconds(spec),
        probe=probe(spec, role, site.python) if site.in_pod else None,
    )
