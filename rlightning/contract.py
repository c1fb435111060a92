"""Names shared by the pod runtime, the local launcher and the operator.

Every API coordinate, role, label, annotation, environment variable and default port lives here and nowhere
else, with the one reader of torchrun's variables (`TorchrunEnv`). Pure constants and parsing: this module imports
neither torch nor kopf, so the operator can import it and stay small.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Mapping

# -- API coordinates of the PolicyGroup custom resource ------------------------------------------------
API_GROUP = "rlightning.io"
API_VERSION = "v1alpha1"
GROUP_VERSION = f"{API_GROUP}/{API_VERSION}"
KIND = "PolicyGroup"
PLURAL = "policygroups"
SINGULAR = "policygroup"
SHORT_NAMES = ("pg",)
CATEGORIES = ("rlightning",)
CRD_NAME = f"{PLURAL}.{API_GROUP}"

# -- Version and image ------------------------------------------------------------------------------------
VERSION = "0.1.0"
"""The release: the one source of the version. `rlightning.__version__` and pyproject.toml's (dynamic) version read
it, and it is the default image's tag; the chart's `version`/`appVersion` and the tags in README.md and the
Dockerfiles must equal it (tests/helm/test_version.py)."""
DEFAULT_IMAGE = f"ghcr.io/rlightning/rlightning:{VERSION}"

# -- Default ports (a PolicyGroup may override each in spec.ports) -----------------------------------------
TORCHRUN_PORT = 29500
"""torchrun's c10d rendezvous and the DDP default group's store, on trainer node rank 0."""
WEIGHT_SYNC_PORT = 29600
"""The weight-sync rendezvous store, hosted by trainer rank 0; never the DDP store."""
TRAJECTORY_PORT = 29700
"""First port of the trainers' trajectory intake: local rank r of a trainer pod receives the fleet's batches on
TRAJECTORY_PORT + r."""
METRICS_PORT = 9400
"""Prometheus metrics of a trainer or evaluator process."""
OPERATOR_HEALTH_PORT = 8080
"""The operator's liveness endpoint (kopf's /healthz)."""
OPERATOR_METRICS_PORT = 9090
"""The operator's Prometheus metrics."""

# -- Port names, as they appear in Services and containers -------------------------------------------------
TORCHRUN_PORT_NAME = "torchrun"
WEIGHT_SYNC_PORT_NAME = "weight-sync"
METRICS_PORT_NAME = "metrics"


def trajectory_port_name(local_rank: int) -> str:
    """Name of a trainer container's trajectory port for `local_rank` (at most 15 characters, as Kubernetes
    requires of port names): `trajectories`, then `trajectories-1`, ...
    """
    return "trajectories" if local_rank == 0 else f"trajectories-{local_rank}"

# -- Roles (values of LABEL_ROLE and of ENV_ROLE) ---------------------------------------------------------
class PolicyRole(enum.StrEnum):
    """What a policy process does; the seed's `rlightning.policy.PolicyRole`, defined here once so that the
    operator and the launch plan use the same values without importing torch.
    """

    TRAIN = "train"
    """A trainer: a DDP rank under torchrun, in the trainers' Job."""
    EVAL = "eval"
    """An evaluator: a member of the evaluation fleet, in the evaluators' StatefulSet."""


# -- Exit codes of the pod runtime ---------------------------------------------------------------------
EXIT_BAD_MANIFEST = 2
"""Exit code of `rlightning validate`, `rlightning run` and the pod entrypoints for a manifest they reject
(retrying cannot help); the trainers' Job fails at once on it (its pod failure policy)."""

# -- Labels and annotations --------------------------------------------------------------------------------
LABEL_PREFIX = API_GROUP
LABEL_GROUP = f"{LABEL_PREFIX}/policy-group"
"""The PolicyGroup a child object belongs to (its metadata.name)."""
LABEL_ROLE = f"{LABEL_PREFIX}/role"
"""A `PolicyRole` value."""
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
MANAGED_BY_VALUE = "rlightning-operator"
ANNOTATION_SPEC_HASH = f"{LABEL_PREFIX}/spec-hash"
"""Hash of the part of the spec a child's template depends on; replicas are excluded."""
ANNOTATION_KARPENTER_DO_NOT_DISRUPT = "karpenter.sh/do-not-disrupt"
"""Pod annotation: `"true"` keeps Karpenter from voluntarily disrupting (consolidating, drifting) the pod's node
(https://karpenter.sh/docs/concepts/disruption/#pod-level-controls). Trainer pods carry it."""
ANNOTATION_CLUSTER_AUTOSCALER_SAFE_TO_EVICT = "cluster-autoscaler.kubernetes.io/safe-to-evict"
"""Pod annotation: `"false"` keeps the Cluster Autoscaler from removing the pod's node (its FAQ, "What types of
pods can prevent CA from removing a node?"). Trainer pods carry it."""
ANNOTATION_CHECKPOINT_REQUEST = f"{LABEL_PREFIX}/checkpoint-request"
"""PolicyGroup annotation: a request for one checkpoint now, its value naming the request (a time and why; a new value
is a new request). The operator sets it when a node that trainers run on is marked for disruption; a user may set
it too (`kubectl annotate --overwrite`). Trainer rank 0 reads it from the answers to its status reports and
writes the checkpoint after the iteration it sees it in (docs/operator.md, "Preemption")."""
LABEL_KUEUE_QUEUE = "kueue.x-k8s.io/queue-name"
"""Kueue's LocalQueue label: on a PolicyGroup, the operator passes it to the trainer Job, created suspended so that
Kueue admits the trainers as one unit (https://kueue.sigs.k8s.io/docs/tasks/run/jobs/)."""
LABEL_ATTEMPT = f"{LABEL_PREFIX}/attempt"
"""The trainer gang's attempt (0, 1, ...) on the trainers' Job and its pods: the operator replaces the whole gang
under attempt N+1 when a pod of attempt N fails or goes, so pods of two attempts never meet."""

# -- Environment variables read by the pod runtime ----------------------------------------------------------
ENV_GROUP_NAME = "RLIGHTNING_GROUP_NAME"
"""metadata.name of the PolicyGroup."""
ENV_NAMESPACE = "RLIGHTNING_NAMESPACE"
"""Namespace of the PolicyGroup; unset when running locally."""
ENV_ROLE = "RLIGHTNING_ROLE"
"""A `PolicyRole` value."""
ENV_SPEC_PATH = "RLIGHTNING_SPEC_PATH"
"""Path of the validated manifest (YAML) the process runs."""
ENV_RUN_DIR = "RLIGHTNING_RUN_DIR"
"""Directory for metrics.jsonl, checkpoints and summary.json."""
ENV_EVAL_ORDINAL = "RLIGHTNING_EVAL_ORDINAL"
"""An evaluator's ordinal (0-based, stable: the StatefulSet ordinal in a cluster)."""
ENV_POD_NAME = "RLIGHTNING_POD_NAME"
"""The pod's name (downward API); an evaluator derives its ordinal from it when ENV_EVAL_ORDINAL is unset."""
ENV_TRAIN_MASTER_ADDR = "RLIGHTNING_TRAIN_MASTER_ADDR"
"""Host of trainer node rank 0: torchrun's rendezvous and the weight-sync store."""
ENV_WEIGHT_SYNC_PORT = "RLIGHTNING_WEIGHT_SYNC_PORT"
"""Port of the weight-sync store on ENV_TRAIN_MASTER_ADDR."""
ENV_TRAJECTORY_ENDPOINTS = "RLIGHTNING_TRAJECTORY_ENDPOINTS"
"""Comma-separated `host:port` of every trainer rank's trajectory intake, given to evaluators."""
ENV_METRICS_PORT = "RLIGHTNING_METRICS_PORT"
"""Port for the process's Prometheus metrics; 0 disables the endpoint."""
ENV_EXPECTED_EVALUATORS = "RLIGHTNING_EXPECTED_EVALUATORS"
"""Local launcher only (`rlightning run`): how many evaluator processes it started, so trainer rank 0 knows
how many to wait for and to require on the final weights. Pods leave it unset: the operator keeps
eval.replicas out of the mounted spec (scaling touches only the StatefulSet), so there the trainer counts the
evaluators registered with its weight sender (`rlightning.runtime.train`)."""
ENV_FLEET_DATA = "RLIGHTNING_FLEET_DATA"
"""`1` when the evaluators produce the training data (`rlightning.launch.fleet_collects`), else `0`: trainers and
evaluators of one PolicyGroup agree on it through their launch plans."""
ENV_HEALTH_FILE = "RLIGHTNING_HEALTH_FILE"
"""Pods only: the file a process keeps for its probe: an evaluator creates it once it holds weights (readiness), a
trainer pod's local rank 0 touches it as its loop goes on (liveness)."""
ENV_REPORT_STATUS = "RLIGHTNING_REPORT_STATUS"
"""`1` when trainer rank 0 should patch the PolicyGroup's status.training (in a cluster)."""
ENV_BIND_HOST = "RLIGHTNING_BIND_HOST"
"""The address every listening port of the process binds (weight-sync store, trajectory intakes, metrics, and
torchrun's rendezvous): `127.0.0.1` under `rlightning run`, so nothing on the network reaches a local run; unset in
pods, which bind all interfaces (their peers are other pods)."""
LOOPBACK_HOST = "127.0.0.1"
"""The bind and master address of a local run."""
ENV_LAUNCH_TIME = "RLIGHTNING_LAUNCH_TIME"
"""Epoch seconds when `rlightning run` started, set for its children: trainer rank 0 measures its start-up phases
from it (summary.json `startup_seconds`); unset in pods, which measure from rank 0's own process start."""
ENV_TRAIN_ATTEMPT = "RLIGHTNING_TRAIN_ATTEMPT"
"""Trainer pods only: the gang's attempt (LABEL_ATTEMPT), for the runtime's logs and records; unset (0) locally."""
ENV_TRAIN_EPOCH = "RLIGHTNING_TRAIN_EPOCH"
"""Trainer pods only: the epoch (`train_epoch`) that fences an older attempt's pods (weight publishes, checkpoints,
trajectory batches; docs/operator.md); unset locally, where the attempt (0) is the epoch."""
EPOCH_ATTEMPTS = 1_000_000
"""Attempts one PolicyGroup may use within its epochs (`train_epoch`)."""


def train_epoch(created_seconds: int, attempt: int) -> int:
    """The fencing epoch of one trainer attempt: `created_seconds * EPOCH_ATTEMPTS + attempt`.

    The attempt alone starts again at 0 when a PolicyGroup is deleted and applied again, and its first trainer
    would be fenced off a claim where an earlier group of the same name restarted; the PolicyGroup's creation time
    (`metadata.creationTimestamp`, set by the API server, whole seconds) puts every later incarnation's epochs above
    every earlier one's. Two groups created within the same second on one claim are not told apart.

    Args:
        created_seconds (int): The PolicyGroup's creation time, Unix seconds (0 when unknown).
        attempt (int): The gang's attempt, 0 first.

    Returns:
        int: The epoch (below 2**63 until the year 294,000); attempts past `EPOCH_ATTEMPTS - 1` share its epoch.

    Examples:
        >>> train_epoch(1764748800, 2)
        1764748800000002
    """
    return max(0, created_seconds) * EPOCH_ATTEMPTS + min(max(0, attempt), EPOCH_ATTEMPTS - 1)
ENV_ERROR_FILE = "RLIGHTNING_ERROR_FILE"
"""Where a failing process writes its own exception (type, message, where; `rlightning.runtime._errors`): the first
failing trainer rank, or an evaluator. `TERMINATION_LOG_IN_POD` in pods (both roles), `ERROR_FILE_NAME` in the run
directory for a local trainer; unset for a local evaluator (its log has the traceback)."""

# -- Environment variables torchrun sets for each rank (read only through `TorchrunEnv`) ---------------------
TORCHRUN_RANK = "RANK"
TORCHRUN_LOCAL_RANK = "LOCAL_RANK"
TORCHRUN_WORLD_SIZE = "WORLD_SIZE"
TORCHRUN_RUN_ID = "TORCHELASTIC_RUN_ID"


@dataclasses.dataclass(frozen=True)
class TorchrunEnv:
    """torchrun's variables of one rank, parsed: the one reader of them for the runtime and the policies.

    Attributes:
        rank (int): Global rank (`RANK`); 0 when unset (a process started by hand).
        local_rank (int): Rank within the node (`LOCAL_RANK`); 0 when unset.
        world_size (int | None): Ranks in the job (`WORLD_SIZE`); None when unset.
        under_torchrun (bool): Whether torchrun started the process (`TORCHELASTIC_RUN_ID` set).
    """

    rank: int = 0
    local_rank: int = 0
    world_size: int | None = None
    under_torchrun: bool = False

    @classmethod
    def from_env(cls, environ: Mapping[str, str]) -> TorchrunEnv:
        """Parse torchrun's variables out of `environ` (`os.environ` in a process).

        Args:
            environ (Mapping[str, str]): The process environment.

        Returns:
            TorchrunEnv: The parsed variables, defaults for those unset.

        Raises:
            ValueError: `RANK` or `LOCAL_RANK` is not a non-negative integer, or `WORLD_SIZE` not a positive one;
                the message names the variable.
        """
        world = environ.get(TORCHRUN_WORLD_SIZE)
        return cls(
            rank=_count(environ, TORCHRUN_RANK, least=0),
            local_rank=_count(environ, TORCHRUN_LOCAL_RANK, least=0),
            world_size=None if world is None else _count(environ, TORCHRUN_WORLD_SIZE, least=1),
            under_torchrun=bool(environ.get(TORCHRUN_RUN_ID)),
        )


def _count(environ: Mapping[str, str], name: str, least: int) -> int:
    raw = environ.get(name, "0")
    try:
        value = int(raw)
    except ValueError:
        value = least - 1
    if value < least:
        kind = "positive" if least == 1 else "non-negative"
        raise ValueError(f"environment variable {name} must be a {kind} integer, got {raw!r}")
    return value


# -- Files -------------------------------------------------------------------------------------------------
SPEC_MOUNT_DIR = "/etc/rlightning"
SPEC_FILE_NAME = "policygroup.yaml"
DEFAULT_RUN_DIR_IN_POD = "/var/run/rlightning"
HEALTH_FILE_IN_POD = "/tmp/rlightning-health"
"""ENV_HEALTH_FILE in every pod (the container's own /tmp)."""
TERMINATION_LOG_IN_POD = "/dev/termination-log"
"""The trainer and evaluator containers' `terminationMessagePath` (Kubernetes' default path): the kubelet puts its
content, at most 4096 bytes, in the container's `state.terminated.message`."""
ERROR_FILE_NAME = "trainer-error.txt"
"""ENV_ERROR_FILE of a local run, in its run directory: `rlightning run` shows it first when the trainer fails."""
SHM_MOUNT_PATH = "/dev/shm"
"""Where every trainer and evaluator container gets a memory-backed emptyDir (torch's shared memory, NCCL)."""

# -- Names in pods that the operator owns (a pod template must not set them) -------------------------------
RUN_DIR_VOLUME = "run"
"""The volume of the run directory (DEFAULT_RUN_DIR_IN_POD)."""
SPEC_VOLUME = "spec"
"""The volume of the mounted manifest (SPEC_MOUNT_DIR)."""
SHM_VOLUME = "dshm"
"""The memory-backed volume at SHM_MOUNT_PATH."""
VALIDATE_CONTAINER = "validate"
"""The trainers' init container: `rlightning validate` of the mounted spec (structural and deep checks)."""

# -- Names of children for a PolicyGroup ------------------------------------------------------------------
MAX_GROUP_NAME_LENGTH = 40
"""Longest PolicyGroup name: child names add suffixes and pod names must fit 63-character labels."""


def train_name(group: str) -> str:
    """Name of the trainers' Job and headless Service for PolicyGroup `group`."""
    return f"{group}-train"


def eval_name(group: str) -> str:
    """Name of the evaluators' StatefulSet and Service for PolicyGroup `group`."""
    return f"{group}-eval"


def config_name(group: str) -> str:
    """Name of the ConfigMap holding the validated spec of PolicyGroup `group`."""
    return f"{group}-spec"


def service_account_name(group: str) -> str:
    """Name of the per-group ServiceAccount, Role and RoleBinding of PolicyGroup `group`."""
    return f"{group}-runtime"
