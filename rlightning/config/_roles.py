"""Settings of the two roles: trainers (DDP under torchrun) and the evaluation fleet."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StringConstraints, model_validator

from rlightning.config._base import SpecModel
from rlightning.config._pod import DNS_SUBDOMAIN_PATTERN, GPU_RESOURCE, PodConfig, parse_quantity
from rlightning.config._template import PodTemplate
from rlightning.config._timings import SyncTimings

PERCENT_PATTERN = r"^(100|[1-9]?[0-9])%$"
"""A percentage of pods, as a PodDisruptionBudget's int-or-string fields take it: `0%` to `100%`."""
PodCount = Annotated[int, Field(ge=0)] | Annotated[str, StringConstraints(pattern=PERCENT_PATTERN)]
"""A number of pods or a percentage of the desired pods (Kubernetes IntOrString)."""
TEMPLATE_DESCRIPTION = (
    "A Kubernetes PodTemplateSpec merged into this role's pods (Kubeflow and KubeRay take one): volumes, extra "
    "containers, env and envFrom of the runtime container (named after the role), imagePullSecrets, "
    "serviceAccountName, labels, annotations, securityContext, ... Fields the operator owns are refused, and so are "
    "the scheduling fields of the pod shorthand (nodeSelector, tolerations, affinity, priorityClassName: set them "
    "there). `rlightning run` ignores it."
)


class CheckpointConfig(SpecModel):
    """When trainers write checkpoints and whether a restarted trainer resumes from the newest."""

    interval_iterations: int = Field(
        default=10, ge=1, description="Write a checkpoint every this many training iterations, and at the end."
    )
    keep: int = Field(default=3, ge=1, description="Number of newest checkpoints kept; older ones are deleted.")
    resume: bool = Field(
        default=True, description="On start, resume from the newest checkpoint in the run directory if any."
    )
    persistent_volume_claim: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "Name of a PersistentVolumeClaim in the group's namespace that the operator mounts as the trainer's run "
            "directory instead of an emptyDir, so a replaced trainer pod resumes weights, optimizer and weight "
            "version. The claim must exist and be mountable by the trainer pods (ReadWriteMany when nodes > 1)."
        ),
    )


TRAIN_UNREACHABLE_TOLERATION_SECONDS = 30
"""Default seconds a trainer pod tolerates a silent node: with the node lifecycle controller's 50 s grace period
(``--node-monitor-grace-period``) a run re-forms within about a minute and a half of the node's last heartbeat,
where Kubernetes' default toleration (300 s, admission plugin DefaultTolerationSeconds) idles the gang for five
minutes more. Long enough that a kubelet restart or a short network blip does not restart the gang. Sources:
Kubernetes docs, "Taints and Tolerations" (taint-based evictions) and the kube-controller-manager reference."""

EVAL_UNREACHABLE_TOLERATION_SECONDS = 60
"""Default seconds an evaluator pod tolerates a silent node (see :data:`TRAIN_UNREACHABLE_TOLERATION_SECONDS`)."""

class TrainConfig(SpecModel):
    """The trainers: `nodes` pods, each running torchrun with `procs_per_node` DDP ranks."""

    nodes: int = Field(default=1, ge=1, le=1024, description="Trainer pods (torchrun nodes).")
    procs_per_node: int = Field(
        default=1, ge=1, le=64, description="DDP ranks per trainer pod (torchrun --nproc-per-node)."
    )
    parallel: Literal["ddp"] | None = Field(
        default=None,
        description=(
            "Data-parallel mode. Unset: DDP whenever the world size is above 1. `ddp`: DDP always, also with a "
            "world size of 1 (same code path as a multi-rank run)."
        ),
    )
    total_env_steps: int = Field(
        default=500_000, ge=1, description="Stop after this many environment steps, summed over all ranks."
    )
    rollout_steps: int = Field(
        default=128,
        ge=1,
        description=(
            "Steps per vector-env copy in one batch of experience: what each rank collects per iteration without "
            "evaluators, the length of every batch the evaluators send."
        ),
    )
    data_source: Literal["fleet", "trainers"] | None = Field(
        default=None,
        description=(
            "Where the trainers' experience comes from: `fleet` (the evaluators produce it; with none, training "
            "pauses), `trainers` (each rank steps its own env.numEnvs copies). Unset: `fleet` when eval.replicas >= 1, "
            "else `trainers`; in a cluster, scaling the fleet between 0 and more then rebuilds the trainer Job (it "
            "resumes from its checkpoint), so set it for fleets that scale to zero."
        ),
    )
    batches_per_update: int = Field(
        default=1,
        ge=1,
        description=(
            "Evaluator batches (rolloutSteps x env.numEnvs steps each) every rank trains on per update when the "
            "evaluators produce the data (eval.replicas >= 1)."
        ),
    )
    max_policy_lag: int = Field(
        default=0,
        ge=0,
        description=(
            "Oldest data trained on, in weight versions behind the newest published: 0 is strictly on-policy (every "
            "sample of an update comes from the version published just before it); 1 or more lets evaluators "
            "collect while trainers learn. Older batches are dropped and counted."
        ),
    )
    target_eval_return: float | None = Field(
        default=None, description="Stop early once the evaluators' mean return reaches this value."
    )
    seed: int = Field(default=0, ge=0, description="Base seed; rank r seeds its RNGs and envs with seed + r.")
    max_restarts: int = Field(
        default=3,
        ge=0,
        description=(
            "Restarts of the whole trainer gang (a new attempt, resumed from the newest checkpoint) caused by a failed "
            "trainer pod before the PolicyGroup fails; disruptions (a pod deleted, evicted, preempted, its node lost) "
            "restart it without counting. A trainer that rejects the spec (exit code 2) fails it at once."
        ),
    )
    checkpoint: CheckpointConfig = Field(default_factory=CheckpointConfig, description="Checkpointing.")
    unreachable_toleration_seconds: int = Field(
        default=TRAIN_UNREACHABLE_TOLERATION_SECONDS,
        ge=0,
        description=(
            "Seconds a trainer pod stays bound to a node that stopped answering (tolerationSeconds of the NoExecute "
            "taints node.kubernetes.io/unreachable and not-ready) before it is evicted; the operator then removes "
            "it at once, so the next attempt forms on nodes that answer. Kubernetes' default is 300 s, all of which "
            "a DDP gang would idle. A toleration of either taint in pod.tolerations wins."
        ),
    )
    pod: PodConfig = Field(default_factory=PodConfig, description="Scheduling of trainer pods.")
    template: PodTemplate | None = Field(default=None, description=TEMPLATE_DESCRIPTION)

    @model_validator(mode="after")
    def _one_rank_per_gpu(self) -> TrainConfig:
        # torchrun starts procsPerNode ranks per pod and rank r takes cuda:LOCAL_RANK: one GPU each.
        gpus = self.pod.resources.limits.get(GPU_RESOURCE)
        if gpus is not None and parse_quantity(gpus) != self.procs_per_node:
            raise ValueError(
                f"procsPerNode: must equal pod.resources.limits.{GPU_RESOURCE} (one DDP rank per GPU), got "
                f"procsPerNode={self.procs_per_node}, {GPU_RESOURCE}={gpus!r}"
            )
        return self

    @property
    def world_size(self) -> int:
        """DDP world size: nodes * procs_per_node."""
        return self.nodes * self.procs_per_node


class DisruptionBudgetConfig(SpecModel):
    """The evaluators' PodDisruptionBudget (policy/v1): how many may be evicted at once by a node drain or a node
    autoscaler's consolidation. Exactly one of the two fields is set.

    See https://kubernetes.io/docs/tasks/run-application/configure-pdb/ (a StatefulSet's pods accept both
    fields, as numbers or percentages).
    """

    max_unavailable: PodCount | None = Field(
        default=None,
        description="Evaluators that may be unavailable during voluntary disruptions: a number or a percentage.",
    )
    min_available: PodCount | None = Field(
        default=None,
        description="Evaluators that must stay available during voluntary disruptions: a number or a percentage.",
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> DisruptionBudgetConfig:
        if (self.max_unavailable is None) == (self.min_available is None):
            raise ValueError(
                f"set exactly one of maxUnavailable and minAvailable, got maxUnavailable={self.max_unavailable!r}, "
                f"minAvailable={self.min_available!r}"
            )
        return self


class EvalConfig(SpecModel):
    """The evaluation fleet: replicas that roll out the newest weights they received."""

    replicas: int = Field(
        default=1, ge=0, description="Evaluator pods; the scale subresource (kubectl scale, HPA) sets this field."
    )
    min_replicas: int = Field(default=0, ge=0, description="Lower bound accepted for replicas.")
    max_replicas: int = Field(default=1000, ge=0, description="Upper bound accepted for replicas.")
    episodes_per_report: int = Field(
        default=5,
        ge=1,
        description=(
            "Episodes an evaluator averages before it reports a mean return. A reached train.targetEvalReturn is "
            "confirmed on at least this many episodes of the final weights, split over the live evaluators."
        ),
    )
    deterministic: bool = Field(default=True, description="Act greedily (mode of the action distribution).")
    evaluation_interval_seconds: float = Field(
        default=10.0,
        ge=0,
        description=(
            "When evaluators produce the training data: the longest an evaluator collects before it plays "
            "`episodesPerReport` evaluation episodes of the newest version it holds (it also plays them whenever "
            "the trainers take no data). 0 evaluates every version."
        ),
    )
    rollout_workers: int | None = Field(
        default=None,
        ge=1,
        description=(
            "With policy.rolloutMode async: env shards an evaluator steps concurrently when it produces training "
            "data, one thread each, every request routed to the least-loaded policy replica. Unset: one per env "
            "copy (env.numEnvs) in async mode, 1 in sync mode. At most env.numEnvs."
        ),
    )
    unreachable_toleration_seconds: int = Field(
        default=EVAL_UNREACHABLE_TOLERATION_SECONDS,
        ge=0,
        description=(
            "Seconds an evaluator pod stays bound to a node that stopped answering (as "
            "train.unreachableTolerationSeconds) before it is evicted, removed by the operator and replaced. Longer "
            "than the trainers': a lost evaluator only slows the fleet, and its replacement starts without weights."
        ),
    )
    pod: PodConfig = Field(default_factory=PodConfig, description="Scheduling of evaluator pods.")
    template: PodTemplate | None = Field(default=None, description=TEMPLATE_DESCRIPTION)
    disruption_budget: DisruptionBudgetConfig = Field(
        default_factory=lambda: DisruptionBudgetConfig(max_unavailable="100%"),
        # No default in the CRD (a null one is dropped): a stored maxUnavailable the user never wrote would stay
        # beside a minAvailable applied later (kubectl apply removes only what it applied), which the exactly-one
        # rule refuses.
        json_schema_extra={"default": None},
        description=(
            "The evaluators' PodDisruptionBudget; unset: maxUnavailable 100%, every evaluator may be evicted (an "
            "evaluator that leaves drops its batch and is never counted as a failure). Set it to keep a share of "
            "the fleet through node drains and consolidation."
        ),
    )
    after_training: Literal["Stop", "Serve"] = Field(
        default="Stop",
        description=(
            "What the evaluators do once training has ended (Succeeded or Failed): `Stop` scales them to zero so "
            "their nodes can go; `Serve` keeps them up, holding the final weights."
        ),
    )

    @model_validator(mode="after")
    def _replicas_within_bounds(self) -> EvalConfig:
        if not self.min_replicas <= self.replicas <= self.max_replicas:
            raise ValueError(
                f"replicas: must satisfy minReplicas <= replicas <= maxReplicas, "
                f"got {self.min_replicas} <= {self.replicas} <= {self.max_replicas}"
            )
        return self


class WeightSyncConfig(SpecModel):
    """How weights travel from trainers to evaluators over torch.distributed broadcast groups."""

    backend: Literal["auto", "gloo", "nccl"] = Field(
        default="auto", description="auto: nccl when trainers and evaluators have CUDA, else gloo."
    )
    bucket_size_bytes: int = Field(
        default=64 * 1024 * 1024,
        ge=1024,
        le=4 * 1024**3,
        description="Upper bound of one flat bucket in bytes; a tensor larger than this gets a bucket of its own.",
    )
    group_size: int = Field(
        default=16,
        ge=1,
        le=1024,
        description=(
            "Most receivers per relay tree (by ordinal); the trainer sends one copy of the weights per tree, "
            "and a membership change re-forms only its tree."
        ),
    )
    relay_fanout: int = Field(
        default=2,
        ge=1,
        le=64,
        description=(
            "Receivers each evaluator forwards the buckets to as they arrive (a relay tree per group); a slow or "
            "dead evaluator affects only its subtree."
        ),
    )
    relay_trees: int = Field(
        default=1,
        ge=1,
        le=2,
        description=(
            "1: one relay tree per group, every relay uploads relayFanout copies of the weights. 2: NCCL's double "
            "binary tree, the transfers split in halves down two trees whose interior evaluators differ, so at "
            "fan-out 2 each evaluator uploads one copy at most (for links capped both ways); a dead evaluator "
            "affects its subtree in each tree."
        ),
    )
    dtype: Literal["bfloat16", "float16", "float32", "float64"] | None = Field(
        default=None,
        description=(
            "Floating tensors are cast to this dtype before they travel (bfloat16 halves a float32 model's bytes); "
            "evaluators hold the cast values in their own dtypes and digests compare in this one. Default: the "
            "trainer's dtypes."
        ),
    )
    timeout_seconds: float = Field(
        default=60.0, gt=0, le=3600, description="Bound on forming a relay edge, one transfer and waiting for acks."
    )
    interval_iterations: int = Field(
        default=1,
        ge=1,
        description=(
            "Publish weights every this many training iterations when the trainers collect their own data; when "
            "the evaluators produce it, every update is published (each version produces the next data)."
        ),
    )

    @property
    def timings(self) -> SyncTimings:
        """Every bound of the protocol, derived from `timeout_seconds` (`SyncTimings`)."""
        return SyncTimings.from_timeout(self.timeout_seconds)
