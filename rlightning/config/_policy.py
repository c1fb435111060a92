"""The policy and its environment: which class runs, with which settings, on which gymnasium env."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from rlightning.config._base import SpecModel


class EnvConfig(SpecModel):
    """The gymnasium environment both roles run."""

    id: str = Field(description="A registered gymnasium environment id, for example CartPole-v1.", min_length=1)
    num_envs: int = Field(
        default=8, ge=1, le=4096, description="Vector-environment copies per trainer rank (synchronous vector env)."
    )
    kwargs: dict[str, Any] = Field(
        default_factory=dict, description="Keyword arguments passed to gymnasium.make."
    )
    max_episode_steps: int | None = Field(
        default=None, ge=1, description="Truncate episodes after this many steps; defaults to the env's own limit."
    )


class OptimConfig(SpecModel):
    """Optimizer settings read by `BasePolicy.setup_optimizer`."""

    name: Literal["adam", "adamw", "sgd"] = Field(default="adam", description="torch.optim optimizer.")
    lr: float = Field(default=3e-4, gt=0, description="Learning rate.")
    eps: float = Field(default=1e-5, gt=0, description="Adam epsilon (ignored by sgd).")
    weight_decay: float = Field(default=0.0, ge=0, description="L2 weight decay.")
    max_grad_norm: float | None = Field(
        default=0.5, gt=0, description="Clip the global gradient norm to this value; null disables clipping."
    )
    anneal_lr: bool = Field(default=True, description="Decay the learning rate linearly to 0 over the run.")


class WeightBufferConfig(SpecModel):
    """How an evaluator stages received weights before applying them."""

    buffer_strategy: Literal["none", "single"] = Field(
        default="single",
        description=(
            "single: weights are received into one staging buffer by a background thread and applied between "
            "rollouts, which never pause (memory: a second copy of the model during a sync); none: no buffer, an "
            "evaluator receives each version straight into the policy's tensors with rollouts paused for the "
            "receive (memory: the model plus two transfers of at most 32 MiB), and in-process callers apply "
            "updates themselves."
        ),
    )


class PolicyConfig(SpecModel):
    """The policy class and its settings (the seed's PolicyConfig)."""

    policy_class: str = Field(
        default="rlightning.policy.ppo:PPOPolicy",
        pattern=r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$",
        description="Import path 'package.module:ClassName' of a BasePolicy subclass.",
    )
    policy_kwargs: dict[str, Any] = Field(
        default_factory=dict,
        description="Free-form settings the policy class validates itself (network sizes, algorithm coefficients).",
    )
    rollout_mode: Literal["sync", "async"] = Field(
        default="sync",
        description=(
            "sync: one rollout at a time, callers served in arrival order; async: concurrent rollouts (threads or "
            "an asyncio loop), and an evaluator steps eval.rolloutWorkers env shards concurrently."
        ),
    )
    weight_buffer: WeightBufferConfig = Field(
        default_factory=WeightBufferConfig, description="Staging of received weights on evaluators."
    )
    optim: OptimConfig = Field(default_factory=OptimConfig, description="Optimizer settings.")
    device: Literal["auto", "cpu", "cuda"] = Field(
        default="auto", description="auto: the local CUDA device when the pod has one, else cpu."
    )

    @property
    def optim_cfg(self) -> OptimConfig:
        """The seed's name for `optim`."""
        return self.optim
