"""`BasePolicy`: the seed's policy API (an `nn.Module` that rolls out, trains and receives weights), defects fixed.

A subclass builds its network in `construct_network`, acts in `rollout_step`/`postprocess`, declares which rollout
outputs it learns from in `rollout_fields` (the dataset layout is `experience_fields`: those plus the env keys of
`_experience`) and learns in `update_dataset`/`train`. The base class keeps the seed's API: it builds the
network (the device and DDP wrapping: `_ddp`; the optimizer: `_optim`) and checks datasets, and mixes in the
parts with one job each: `ActorMixin` (`_actor`: rollouts admitted in arrival order by `_gate`, never during a
weight update, a pending update first, and their accounting), `WeightUpdateMixin` (`_weight_mixin`: update
requests counted by generation so none is lost, applied between rollouts by `_weight_updates`' thread;
fingerprints and digests) and `CheckpointMixin` (`_checkpoint`: what a resume needs, via `_training_state` and
`_rng`). Phase durations are bounded running aggregates (`_timing`). Weights are named by
`rlightning.weights.named_state`, so bare parameters and buffers are synced, fingerprinted and checkpointed like
any other tensor.
"""

from __future__ import annotations

import abc
import gc
from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium
import torch
from pydantic import BaseModel
from tensordict import TensorDict
from torch import nn

from rlightning import weights
from rlightning.config import OptimConfig, PolicyConfig, TrainConfig
from rlightning.contract import PolicyRole
from rlightning.policy import _ddp, _experience, _gate, _optim, _rng, _timing, _weight_updates
from rlightning.policy._actor import ActorMixin
from rlightning.policy._checkpoint import CheckpointMixin
from rlightning.policy._env_meta import EnvMeta
from rlightning.policy._weight_mixin import WeightUpdateMixin

# The seed's module functions keep their import path here (`from rlightning.policy.base_policy import ...`).
from rlightning.policy._ddp import infer_train_dp_world_size, set_nested_attr
from rlightning.policy._training_state import clone_checkpoint_value

__all__ = ["BasePolicy", "PolicyRole", "clone_checkpoint_value", "infer_train_dp_world_size", "set_nested_attr"]


class BasePolicy(nn.Module, ActorMixin, WeightUpdateMixin, CheckpointMixin, abc.ABC):
    """A policy that rolls out, trains and receives weights; subclass it for an algorithm.

    Note that `train(...)` is the algorithm's update step (the seed's API), not `nn.Module.train(mode)`:
    the base class switches modes with `nn.Module.train(self, mode)` and overrides `eval()` accordingly.

    Args:
        config (PolicyConfig): `spec.policy`.
        role_type (PolicyRole | str): `train` or `eval`.

    Raises:
        TypeError: When `config` is not a PolicyConfig.
        ValueError: When `role_type` is not a PolicyRole value.

    Attributes:
        kwargs_model (type[BaseModel] | None): Strict pydantic model of `policy_kwargs`; None accepts anything.
        observation_spaces (tuple[type[gymnasium.Space], ...] | None): The observation space types the class can
            build a network for; None: any. `space_problems` checks them against the env's.
        action_spaces (tuple[type[gymnasium.Space], ...] | None): The action space types it can act in; None:
            any. A continuous-control algorithm declares `(gymnasium.spaces.Box,)`.
        algorithm (str): The algorithm's short name in messages (`"PPO"`). Defaults to `"policy"`.
        corrects_policy_lag (bool): Whether `train` corrects for data acted with older weights (V-trace,
            `rlightning.policy.appo`), so evaluators free-run instead of pacing themselves to the trainer's reads
            (`rlightning.runtime.eval.BatchPacing`). Defaults to False.
        device (torch.device): Where the network lives.
        model_list (list[tuple[str, nn.Module]]): Child modules with trainable parameters, by attribute name.
        iteration (int): Completed `train` calls.
        env_steps (int): Environment steps consumed by training, summed over all data-parallel ranks.
        timings (_timing.PhaseTimings): Running count, total and maximum of the durations by phase (`rollout`,
            `update_weights`); bounded memory however long the policy runs.
    """

    kwargs_model: ClassVar[type[BaseModel] | None] = None
    observation_spaces: ClassVar[tuple[type[gymnasium.Space], ...] | None] = None
    action_spaces: ClassVar[tuple[type[gymnasium.Space], ...] | None] = None
    algorithm: ClassVar[str] = "policy"
    corrects_policy_lag: ClassVar[bool] = False

    def __init__(self, config: PolicyConfig, role_type: PolicyRole | str) -> None:
        nn.Module.__init__(self)
        if not isinstance(config, PolicyConfig):
            raise TypeError(f"config must be a PolicyConfig, got {type(config).__name__}")
        self.config = config
        self.role_type = self._sanity_check(role_type)
        self._initialized = False
        self.device = _ddp.resolve_device(config.device)
        self.model_list: list[tuple[str, nn.Module]] = []
        self.rollout_mode = config.rollout_mode
        self.env_meta: EnvMeta | None = None
        self.train_config: TrainConfig | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.dp_world_size = 1
        self.iteration = 0
        self.env_steps = 0
        self.timings = _timing.PhaseTimings()
        self._gate = _gate.RolloutGate(1 if self.rollout_mode == "sync" else None)
        self.__init_weight_buffer_mixin__(config.weight_buffer.buffer_strategy)
        self._update_thread = _weight_updates.WeightUpdateThread(
            self, self._gate, self.timings, f"{type(self).__name__}-weight-update"
        )

    @staticmethod
    def _sanity_check(role_type: PolicyRole | str) -> PolicyRole:
        try:
            return PolicyRole(role_type)
        except ValueError:
            allowed = ", ".join(repr(role.value) for role in PolicyRole)
            raise ValueError(f"role_type must be one of {allowed}, got {role_type!r}") from None

    # -- abstract: the algorithm -------------------------------------------------------------------------------

    @abc.abstractmethod
    def construct_network(self, env_meta: EnvMeta) -> None:
        """Create the network modules as attributes of `self` (on the CPU; the base class moves them).

        Args:
            env_meta (EnvMeta): The environment's spaces.
        """

    def setup_optimizer(self, optim_cfg: OptimConfig) -> torch.optim.Optimizer:
        """Create the optimizer over the (possibly DDP-wrapped) trainable parameters.

        By default Adam, AdamW or SGD over every parameter, as `optim_cfg.name` says (`_optim.make_optimizer`);
        a subclass that wants parameter groups overrides this and passes them to `make_optimizer`.

        Args:
            optim_cfg (OptimConfig): `spec.policy.optim`.

        Returns:
            torch.optim.Optimizer: The optimizer; the base class stores it as `self.optimizer`.
        """
        return _optim.make_optimizer(self.parameters(), optim_cfg)

    def current_lr(self) -> float:
        """The learning rate of the next update: linearly annealed to 0 over `train.total_env_steps` when
        `optim.anneal_lr` is set and a train config was given (CleanRL's schedule), else `optim.lr`.

        Returns:
            float: The learning rate; an algorithm's `train` writes it into its optimizer's parameter groups.
        """
        optim = self.config.optim
        return optim.lr * self.remaining_fraction() if optim.anneal_lr else optim.lr

    def remaining_fraction(self) -> float:
        """The share of `train.total_env_steps` still to train on, for linear schedules (SB3's
        `progress_remaining`, CleanRL's `frac`).

        Returns:
            float: `1 - env_steps / total_env_steps`, at least 0; 1.0 without a train config.
        """
        if self.train_config is None:
            return 1.0
        return max(0.0, 1.0 - self.env_steps / self.train_config.total_env_steps)

    def rollout_fields(self) -> dict[str, _experience.ExperienceField]:
        """The keys of the rollout output that collectors keep per step, with their shapes and dtypes.

        A subclass declares them (after init, when the spaces are known). Collectors read the env action from
        the rollout output's `action` (`[N, *A]`) whether or not it is declared, and store exactly these keys
        beside the env keys of `env_fields`; nothing else of the output is kept.

        Returns:
            dict[str, ExperienceField]: Per-step fields by key, for example PPO's `action` and `log_prob`.

        Raises:
            NotImplementedError: In the base class: a policy that learns from collected experience must say
                which of its outputs it needs (`{}` for none), rather than have a collector guess.
        """
        raise NotImplementedError(
            f"{type(self).__name__} does not declare rollout_fields(): return the keys of its rollout output to "
            "keep per step ({} for none)"
        )

    @classmethod
    def space_problems(cls, env_meta: EnvMeta) -> list[str]:
        """Why this class cannot build its network for an env's spaces, one line each; empty when it can.

        `rlightning validate`, `rlightning run` and every pod on start call it with the spaces of `spec.env`
        (`rlightning.runtime.validate`), so a policy meant for other spaces is refused before anything runs,
        and `init_train`/`init_eval` raise its first line. The default checks the declared
        `observation_spaces` and `action_spaces`; a subclass with finer needs (a 1-D Box with finite bounds)
        extends it, starting from `super().space_problems(env_meta)`.

        Args:
            env_meta (EnvMeta): The spaces of one env copy.

        Returns:
            list[str]: Problems, for example `SACPolicy supports action spaces Box, got Discrete(2) (CartPole-v1)`.
        """
        where = f" ({env_meta.env_id})" if env_meta.env_id else ""
        problems = []
        for kind, declared, space in (
            ("observation", cls.observation_spaces, env_meta.observation_space),
            ("action", cls.action_spaces, env_meta.action_space),
        ):
            if declared is not None and not isinstance(space, declared):
                names = " or ".join(space_type.__name__ for space_type in declared)
                problems.append(f"{cls.__name__} supports {kind} spaces {names}, got {space}{where}")
        return problems

    def _require_env_meta(self) -> EnvMeta:
        """The env's spaces the network was built for, for subclass methods that need them.

        Returns:
            EnvMeta: `env_meta`.

        Raises:
            RuntimeError: When the policy is not initialised.
        """
        if self.env_meta is None:
            raise RuntimeError(f"{type(self).__name__} is not initialised: call init_eval or init_train first")
        return self.env_meta

    def experience_fields(self) -> dict[str, _experience.ExperienceField]:
        """The full layout of this policy's `[T, N]` dataset: `env_fields` plus `rollout_fields()`.

        Returns:
            dict[str, ExperienceField]: Per-step fields by key.

        Raises:
            RuntimeError: When the policy is not initialised (the spaces are unknown).
            ValueError: When `rollout_fields()` redeclares an env key.
            NotImplementedError: When the subclass does not declare `rollout_fields`.
        """
        fields = _experience.env_fields(self._require_env_meta())
        rollout = self.rollout_fields()
        clash = sorted(set(fields) & set(rollout))
        if clash:
            raise ValueError(f"{type(self).__name__}.rollout_fields() redeclares env keys {clash}")
        return {**fields, **rollout}

    def checked_dataset(self, dataset: TensorDict) -> TensorDict:
        """The keys of `experience_fields()` of a batch, checked against their layout: what `update_dataset`
        implementations start with.

        Args:
            dataset (TensorDict): `[T, N]` experience; keys beyond `experience_fields()` are dropped.

        Returns:
            TensorDict: `[T, N]` with exactly the keys of `experience_fields()` (not copied).

        Raises:
            RuntimeError: When the policy is not initialised.
            ValueError: `"<algorithm> dataset: <rule>"` when the batch is not 2-D, or a key is missing or has the
                wrong shape or dtype.
        """
        fields = self.experience_fields()
        if dataset.batch_dims != 2:
            raise ValueError(f"{self.algorithm} dataset: batch_size {list(dataset.batch_size)} is not [T, N]")
        steps, envs = dataset.batch_size
        dataset = dataset.select(*fields, strict=False)
        reason = _experience.check_batch(dataset, fields, (steps, envs))
        if reason is not None:
            raise ValueError(f"{self.algorithm} dataset: {reason}")
        return dataset

    @abc.abstractmethod
    def update_dataset(self, dataset: TensorDict) -> None:
        """Hand a batch of collected experience to the next `train` call (`checked_dataset` checks it).

        Args:
            dataset (TensorDict): Experience of shape `[T, N]` (time first).
        """

    @abc.abstractmethod
    def train(self, *args: Any, **kwargs: Any) -> dict[str, float]:  # type: ignore[override]  # seed's API: an update
        """Run one update on the dataset given to `update_dataset`; increments `iteration` and `env_steps`.

        Returns:
            dict[str, float]: Training metrics (losses, learning rate, ...).
        """

    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        """The state of each trainable module (`model_list`), by attribute name, with clean keys (no DDP or
        torch.compile prefixes): every parameter and persistent buffer, as `weights.named_state` names them.

        Returns:
            dict[str, dict[str, torch.Tensor]]: `{module name: {name: tensor}}`, sharing storage with the policy (no
            copy); PPO's is `{"agent": {...}}`, a trainer's SAC's also has `critic`.
        """
        return {name: weights.named_state(module) for name, module in self.model_list}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:  # type: ignore[override]  # seed's API
        """Load a whole-policy state dict, also one saved from a DDP-wrapped or torch.compile'd policy.

        Args:
            state_dict (Mapping[str, Any]): Tensors by (possibly prefixed) name: `state_dict()` or `named_state`
                of a policy of the same class.
            strict (bool, optional): Every name must match; otherwise only the names present in both are copied
                and the others keep their values (an evaluator of an actor-critic loading a trainer's checkpoint
                takes what it has). Shapes and dtypes must match either way. Defaults to True.

        Raises:
            KeyError: When strict and the names differ.
            ValueError: When a shape or dtype differs.
        """
        clean = self.clean_state_dict(state_dict)
        if not strict:
            own = weights.named_state(self)
            clean = {name: tensor for name, tensor in clean.items() if name in own}
            clean.update({name: tensor for name, tensor in own.items() if name not in clean})
        weights.load_named_state(self, clean)

    def clean_state_dict(self, state_dict: Mapping[str, Any]) -> dict[str, Any]:
        """Remove wrapper prefixes from a whole-policy state dict, for `load_state_dict` implementations.

        Besides what `weights.clean_state_dict_keys` strips (a leading `module.` or `_orig_mod.`, any
        `_orig_mod` segment), a `module.` right after a child's name is dropped when every key of that child
        has it: that is a child wrapped in DDP by `init_train` (`agent.module.fc.weight` -> `agent.fc.weight`).

        Args:
            state_dict (Mapping[str, Any]): Keys of a possibly wrapped policy.

        Returns:
            dict[str, Any]: The same values under clean keys.
        """
        clean = weights.clean_state_dict_keys(state_dict)
        for child in {key.split(".", 1)[0] for key in clean}:
            keys = [key for key in clean if key.startswith(f"{child}.")]
            wrapped = f"{child}.module."
            if keys and all(key.startswith(wrapped) for key in keys):
                clean = {
                    (f"{child}.{key[len(wrapped):]}" if key.startswith(wrapped) else key): value
                    for key, value in clean.items()
                }
        return clean

    # -- building ------------------------------------------------------------------------------------------------

    def eval(self) -> BasePolicy:
        """Put the network in evaluation mode (`nn.Module.eval`; `train` here is the algorithm's update).

        Returns:
            BasePolicy: self.
        """
        return nn.Module.train(self, False)

    def _find_model(self) -> list[tuple[str, nn.Module]]:
        return [
            (name, module)
            for name, module in self.named_children()
            if any(param.requires_grad for param in module.parameters())
        ]

    def _build(self, env_meta: EnvMeta, seed: int | None) -> None:
        if seed is not None:
            _rng.seed_everything(seed)
        problems = self.space_problems(env_meta)
        if problems:
            raise ValueError(problems[0])
        self.construct_network(env_meta)
        self.to(self.device)
        self.env_meta = env_meta
        self.model_list = self._find_model()

    def init_eval(self, env_meta: EnvMeta, seed: int | None = None) -> None:
        """Build the network for serving: evaluation mode, and the weight-update thread unless the buffer
        strategy is `none`.

        Args:
            env_meta (EnvMeta): The environment's spaces.
            seed (int | None, optional): Seed the global RNGs first. Defaults to None.
        """
        self._build(env_meta, seed)
        nn.Module.train(self, False)
        if self.weight_buffer_strategy != "none":
            self._update_thread.start()
        self._initialized = True

    def init_train(self, env_meta: EnvMeta, train_config: TrainConfig | None = None, seed: int | None = None) -> None:
        """Build the network for training: train mode, DDP (see below), the optimizer, counters at zero. The
        weight version is kept (it only grows).

        DDP wraps the model when the data-parallel world size is above 1, and also at world size 1 when
        `train_config.parallel` is `ddp` (then the default process group must be initialised, as the trainer
        entrypoint always does); `parallel` unset means DDP exactly when the world size is above 1.

        Args:
            env_meta (EnvMeta): The environment's spaces.
            train_config (TrainConfig | None, optional): `spec.train` (learning-rate annealing reads
                `total_env_steps`). Defaults to None.
            seed (int | None, optional): Seed the global RNGs before building. Defaults to None.

        Raises:
            RuntimeError: When DDP is needed but the default process group is not initialised.
            ValueError: With DDP, when a trainable parameter lies outside every child module (DDP could not
                all-reduce its gradient).
        """
        self._build(env_meta, seed)
        nn.Module.train(self, True)
        self.dp_world_size = _ddp.infer_train_dp_world_size()
        forced = train_config is not None and train_config.parallel == "ddp"
        if self.dp_world_size > 1 or forced:
            self.model_list = _ddp.wrap_children_in_ddp(self, self.model_list, self.device, self.dp_world_size)
        self.optimizer = self.setup_optimizer(self.config.optim)
        self.train_config = train_config
        self.iteration = 0
        self.env_steps = 0
        self._initialized = True

    def is_initialized(self) -> bool:
        """Whether `init_train` or `init_eval` has run.

        Returns:
            bool: True once initialised.
        """
        return self._initialized

    def reset_training_state(self, train_config: TrainConfig, env_meta: EnvMeta, seed: int) -> None:
        """Start training afresh: seed, rebuild the network and optimizer, zero the counters.

        Args:
            train_config (TrainConfig): `spec.train`.
            env_meta (EnvMeta): The environment's spaces.
            seed (int): Seed of the global RNGs.

        Raises:
            RuntimeError: When the policy's role is not train.
        """
        if self.role_type is not PolicyRole.TRAIN:
            raise RuntimeError(f"reset_training_state needs role 'train', this policy has {self.role_type.value!r}")
        self.init_train(env_meta, train_config, seed)

    def close(self, timeout: float = 5.0) -> None:
        """Stop the update thread and release the DDP wrappers (idempotent); call it before
        `torch.distributed.destroy_process_group`, so that the group is freed there and not at interpreter teardown.

        The policy keeps its modules and weights (unwrapped) but no longer trains across ranks.

        Args:
            timeout (float, optional): Seconds to wait for the thread to finish its current update.
                Defaults to 5.0.
        """
        self._update_thread.close(timeout)
        if any(isinstance(module, nn.parallel.DistributedDataParallel) for _, module in self.model_list):
            self.model_list = _ddp.unwrap_ddp_children(self, self.model_list)
            gc.collect()  # a wrapper caught in a reference cycle would otherwise keep the group until teardown
