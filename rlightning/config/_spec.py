"""The PolicyGroup manifest: `PolicyGroupSpec` is the single source of truth for the CRD and the pods."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from rlightning import contract
from rlightning.config._base import SpecModel
from rlightning.config._pod import DNS_SUBDOMAIN_PATTERN
from rlightning.config._policy import EnvConfig, PolicyConfig
from rlightning.config._roles import EvalConfig, TrainConfig, WeightSyncConfig
from rlightning.config._template import template_problem

LABEL_NAME_PATTERN = r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$"
"""The name part of a label or annotation key, and a label's value (Kubernetes' qualified name)."""
NCCL_NAME_PATTERN = r"^NCCL_[A-Z0-9_]{1,64}$"
"""An NCCL environment variable (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html)."""
MAX_NCCL_SETTINGS = 64
# RFC 1035 label: children's names and DNS names derive from it.
NAME_PATTERN = r"^[a-z]([-a-z0-9]*[a-z0-9])?$"


class PortsConfig(SpecModel):
    """Ports of trainer and evaluator processes."""

    torchrun: int = Field(default=contract.TORCHRUN_PORT, ge=1, le=65535, description="torchrun rendezvous port.")
    weight_sync: int = Field(
        default=contract.WEIGHT_SYNC_PORT, ge=1, le=65535, description="Weight-sync store port on trainer rank 0."
    )
    trajectories: int = Field(
        default=contract.TRAJECTORY_PORT,
        ge=1,
        le=65535,
        description="First port of the trainers' trajectory intake: local rank r of a trainer pod listens on this + r.",
    )
    metrics: int = Field(
        default=contract.METRICS_PORT, ge=0, le=65535, description="Prometheus metrics port; 0 disables it."
    )

    @model_validator(mode="after")
    def _distinct(self) -> PortsConfig:
        # Trainer rank 0 binds torchrun, weightSync and metrics in one pod: they must differ.
        ports = [self.torchrun, self.weight_sync] + ([self.metrics] if self.metrics else [])
        if len(set(ports)) != len(ports):
            raise ValueError(
                f"torchrun, weightSync and metrics (unless 0) must be distinct ports, got "
                f"torchrun={self.torchrun}, weightSync={self.weight_sync}, metrics={self.metrics}"
            )
        return self


class PolicyGroupSpec(SpecModel):
    """spec of a PolicyGroup: what to train, on what, and how the evaluation fleet follows."""

    image: str = Field(default=contract.DEFAULT_IMAGE, min_length=1, description="Container image of both roles.")
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = Field(
        default="IfNotPresent", description="Kubernetes imagePullPolicy of both roles."
    )
    env: EnvConfig = Field(description="The gymnasium environment.")
    policy: PolicyConfig = Field(default_factory=PolicyConfig, description="The policy class and its settings.")
    train: TrainConfig = Field(default_factory=TrainConfig, description="The trainers.")
    eval: EvalConfig = Field(default_factory=EvalConfig, description="The evaluation fleet.")
    weight_sync: WeightSyncConfig = Field(
        default_factory=WeightSyncConfig, description="Weight sync from trainers to evaluators."
    )
    ports: PortsConfig = Field(default_factory=PortsConfig, description="Ports of trainer and evaluator processes.")
    nccl: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_NCCL_SETTINGS,
        description=(
            "NCCL settings (environment variables NCCL_*, for example NCCL_SOCKET_IFNAME, NCCL_DEBUG, "
            "NCCL_IB_DISABLE) given to every trainer and evaluator container; other names are refused. "
            "`rlightning run` keeps NCCL_SOCKET_IFNAME on the loopback interface."
        ),
    )

    @field_validator("nccl")
    @classmethod
    def _nccl_names(cls, value: dict[str, str]) -> dict[str, str]:
        for name in value:
            if re.fullmatch(NCCL_NAME_PATTERN, name) is None:
                raise ValueError(f"{name}: only NCCL settings (names matching {NCCL_NAME_PATTERN}) belong here")
        return value

    @model_validator(mode="after")
    def _trajectory_ports_free(self) -> PolicyGroupSpec:
        # A trainer pod binds trajectories + r for each of its local ranks r, next to its other ports.
        ports = self.ports
        taken = range(ports.trajectories, ports.trajectories + self.train.procs_per_node)
        clashes = sorted({ports.torchrun, ports.weight_sync, ports.metrics} & set(taken))
        if taken.stop - 1 > 65535 or clashes:
            raise ValueError(
                f"ports.trajectories: ports {taken.start}..{taken.stop - 1} (one per rank of a trainer pod, "
                f"train.procsPerNode={self.train.procs_per_node}) must be <= 65535 and not include torchrun, "
                f"weightSync or metrics, got clashes {clashes}"
            )
        return self

    @model_validator(mode="after")
    def _templates_fit(self) -> PolicyGroupSpec:
        # Fields of a pod template the operator owns (or the pod shorthand sets) are refused, never overwritten.
        for role, config in ((contract.PolicyRole.TRAIN, self.train), (contract.PolicyRole.EVAL, self.eval)):
            problem = None if config.template is None else template_problem(config.template, role)
            if problem is not None:
                raise ValueError(f"{role}.{problem}")
        return self

    @model_validator(mode="after")
    def _rollout_workers_fit(self) -> PolicyGroupSpec:
        workers = self.eval.rollout_workers
        if workers is None:
            return self
        if workers > 1 and self.policy.rollout_mode != "async":
            raise ValueError(
                f"eval.rolloutWorkers: more than 1 needs policy.rolloutMode async, got {workers} with "
                f"{self.policy.rollout_mode!r}"
            )
        if workers > self.env.num_envs:
            raise ValueError(
                f"eval.rolloutWorkers: at most env.numEnvs ({self.env.num_envs}; each worker steps its own env "
                f"copies), got {workers}"
            )
        return self

    def eval_rollout_workers(self) -> int:
        """Env shards an evaluator steps concurrently (`eval.rolloutWorkers`, or its default).

        Returns:
            int: `eval.rolloutWorkers` when set; else `env.numEnvs` in async rollout mode, 1 in sync mode.
        """
        if self.eval.rollout_workers is not None:
            return self.eval.rollout_workers
        return self.env.num_envs if self.policy.rollout_mode == "async" else 1


class ObjectMeta(SpecModel):
    """The part of Kubernetes object metadata a manifest file may carry."""

    model_config = SpecModel.model_config | {"extra": "ignore"}

    name: str = Field(
        min_length=1,
        max_length=contract.MAX_GROUP_NAME_LENGTH,
        pattern=NAME_PATTERN,
        description="PolicyGroup name: lower-case letters, digits and '-', starting with a letter.",
    )
    namespace: str | None = Field(default=None, description="Namespace; the CLI ignores it.")
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)

    @field_validator("labels", "annotations")
    @classmethod
    def _qualified_keys(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        # What the API server checks of every object's labels and annotations (apimachinery's validation).
        for key, text in value.items():
            prefix, _, name = key.rpartition("/")
            if not (
                re.fullmatch(LABEL_NAME_PATTERN, name)
                and len(name) <= 63
                and (not prefix or (re.fullmatch(DNS_SUBDOMAIN_PATTERN, prefix) and len(prefix) <= 253))
            ):
                raise ValueError(
                    f"{key}: not a qualified name (an optional DNS-subdomain prefix and '/', then at most 63 "
                    "letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
                )
            value_ok = text == "" or (re.fullmatch(LABEL_NAME_PATTERN, text) and len(text) <= 63)
            if info.field_name == "labels" and not value_ok:
                raise ValueError(
                    f"{key}: label value {text!r} must be empty or at most 63 letters, digits, '-', '_' or '.', "
                    "starting and ending with a letter or digit"
                )
        return value


class PolicyGroupManifest(SpecModel):
    """A whole PolicyGroup object as written in a file or read from the API server."""

    model_config = SpecModel.model_config | {"extra": "ignore"}  # status, and server-set fields

    api_version: Literal["rlightning.io/v1alpha1"] = Field(description="Must be rlightning.io/v1alpha1.")
    kind: Literal["PolicyGroup"] = Field(description="Must be PolicyGroup.")
    metadata: ObjectMeta
    spec: PolicyGroupSpec
