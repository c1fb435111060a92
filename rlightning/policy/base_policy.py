"""`BasePolicy`: the seed's policy API (an `nn.Module` that rolls out, trains and receives weights), defects fixed.

A subclass builds its network in `construct_network`, acts in `rollout_step`/`postprocess`, declares which rollout
outputs it learns from in `rollout_fields` (the dataset layout is `experience_fields`: those plus the env keys of
`_experience`) and learns in `update_dataset`/`train`. The base class keeps the seed's API, mostly as short
delegations to private modules with one job each: rollouts and weight updates are mutually exclusive, rollouts
are admitted in arrival order and a pending update goes first (`_gate`; a rollout that raises still releases
it); update requests are counted by generation so none is lost (`_weight_updates`); the device and DDP wrapping
(`_ddp`); optimizer, counters and weight version in checkpoints and resumes (`_training_state`, `_rng`); phase
durations as bounded running aggregates (`_timing`). Weights are named by `rlightning.weights.named_state`, so
bare parameters and buffers are synced, fingerprinted and checkpointed like any other tensor.
"""

from __future__ import annotations

import abc
import asyncio
import gc
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar

import gymnasium
import torch
from pydantic import BaseModel
from tensordict import TensorDict
from torch import nn

from rlightning import weights
from rlightning.config import OptimConfig, PolicyConfig, TrainConfig
from rlightning.contract import PolicyRole
from rlightning.policy import _ddp, _experience, _gate, _optim, _rng, _timing, _training_state, _weight_updates
from rlightning.policy._env_meta import EnvMeta

# The seed's module functions keep their import path here (`from rlightning.policy.base_policy import ...`).
from rlightning.policy._ddp import infer_train_dp_world_size, set_nested_attr
from rlightning.policy._training_state import clone_checkpoint_value

__all__ = ["BasePolicy", "PolicyRole", "clone_checkpoint_value", "infer_train_dp_world_size", "set_nested_attr"]


class BasePolicy(nn.Module, weights.WeightBufferMixin, abc.ABC):
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

    @abc.abstractmethod
    def rollout_step(self, env_ret: Mapping[str, Any]) -> Any:
        """Act on a batch of observations; runs under `torch.inference_mode`, admitted by the gate.

        Args:
            env_ret (Mapping[str, Any]): What the environment returned, for example `{"observation": [N, *O]}`.

        Returns:
            Any: The raw policy response handed to `postprocess`.
        """

    @abc.abstractmethod
    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: Any) -> Any:
        """Turn the raw response into what the caller gets; runs under `torch.inference_mode`.

        Args:
            env_ret (Mapping[str, Any]): The input of `rollout_step`.
            policy_resp (Any): The output of `rollout_step`.

        Returns:
            Any: The rollout result.
        """

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

    @abc.abstractmethod
    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        """The state dicts of the trainable modules, by attribute name, with clean keys.

        Returns:
            dict[str, dict[str, torch.Tensor]]: `{module name: state dict}`.
        """

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

    # -- rollouts --------------------------------------------------------------------------------------------------

    def _forward_and_release(self, env_ret: Mapping[str, Any]) -> Any:
        # Runs with the gate entered; always releases it, also when the forward raises.
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                return self.postprocess(env_ret, self.rollout_step(env_ret))
        finally:
            self._gate.exit_rollout()
            self.timings.record("rollout", time.perf_counter() - start)

    def _require_init(self) -> None:
        if not self._initialized:
            raise RuntimeError(f"{type(self).__name__} is not initialised: call init_eval or init_train first")

    def rollout(self, env_ret: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Run `rollout_step` then `postprocess`, never while a weight update is applied.

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.
            timeout (float | None, optional): Seconds to wait for admission. Defaults to None (forever).

        Returns:
            Any: The output of `postprocess`.

        Raises:
            RuntimeError: When the policy is not initialised.
            TimeoutError: When not admitted within `timeout`.
        """
        self._require_init()
        if not self._gate.enter_rollout(timeout):
            raise TimeoutError(f"rollout not admitted within {timeout} s (a weight update holds the policy)")
        return self._forward_and_release(env_ret)

    async def rollout_async(self, env_ret: Mapping[str, Any]) -> Any:
        """Like `rollout`, from an asyncio task: admission waits without blocking the loop and the forward
        runs in the loop's default executor, so concurrent requests overlap (async mode).

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.

        Returns:
            Any: The output of `postprocess`.

        Raises:
            RuntimeError: When the policy is not initialised.
        """
        self._require_init()
        await self._gate.enter_rollout_async()
        try:
            future = asyncio.get_running_loop().run_in_executor(None, self._forward_and_release, env_ret)
        except BaseException:
            self._gate.exit_rollout()
            raise
        # Cancelling the caller does not cut the forward short: the worker releases the gate when done.
        return await future

    def check_idle(self, timeout: float | None = None) -> bool:
        """Wait until no rollout and no weight update is in flight.

        Args:
            timeout (float | None, optional): Seconds to wait. Defaults to None (forever).

        Returns:
            bool: True when idle, False on timeout.
        """
        return self._gate.wait_idle(timeout)

    def get_num_requests(self) -> int:
        """Rollout requests in flight or waiting for admission now: this policy's load, by which a router picks
        the least-loaded replica (`rlightning.policy.RolloutRouter`). At most 1 is in flight in sync mode.

        Returns:
            int: The count.
        """
        return self._gate.requests

    # -- weight updates --------------------------------------------------------------------------------------------

    @property
    def weight_update_error(self) -> BaseException | None:
        """BaseException | None: What the last weight update raised; None after one that succeeded."""
        return self._update_thread.error

    def notify_update_weights(self) -> int:
        """Ask for the staged weights to be applied; safe from any thread, never lost during an update.

        Returns:
            int: The request's generation; `wait_for_weight_update_done` waits for it.
        """
        return self._update_thread.notify()

    def push_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        """Hand received weights to the policy the way its buffer strategy wants, never during a rollout.

        With strategy `single` the state is staged and the update thread notified (applied between
        rollouts); with `none` it is applied now, after running rollouts drain.

        Args:
            version (int): The weight version (>= 1); a version not newer than the newest staged or applied
                one is ignored.
            state (Mapping[str, torch.Tensor]): Clean name -> tensor (`named_state` form); not copied, so the
                caller must not modify it afterwards.

        Returns:
            bool: True when staged or applied, False when ignored as not newer.
        """
        return self._update_thread.push(version, state)

    def wait_for_weight_update_done(self, timeout: float | None = None) -> bool:
        """Wait until every update requested so far has been applied.

        Args:
            timeout (float | None, optional): Seconds to wait. Defaults to None (forever).

        Returns:
            bool: True when applied without error, False on timeout or when the last update failed
                (see `weight_update_error`).
        """
        return self._update_thread.wait_done(timeout)

    def apply_staged_weights(self, timeout: float | None = None) -> int | None:
        """Apply the staged weights now, exclusive of rollouts; marks every request so far as handled.

        The update thread calls this; with buffer strategy `none` the caller does.

        Args:
            timeout (float | None, optional): Seconds to wait for running rollouts. Defaults to None (forever).

        Returns:
            int | None: The weight version applied, or None when nothing newer was staged.

        Raises:
            TimeoutError: When rollouts did not drain within `timeout` (nothing applied, request kept).
            Exception: Whatever applying raised (also kept in `weight_update_error`).
        """
        return self._update_thread.apply_staged(timeout)

    def receive_targets(self) -> dict[str, torch.Tensor]:
        """The tensors a version received in place is written into (`WeightReceiver.receive(into=...)`).

        Returns:
            dict[str, torch.Tensor]: Clean name -> this policy's own tensor (`named_state`, no copy).
        """
        return weights.named_state(self)

    def begin_weight_receive(self, timeout: float) -> bool:
        """Pause rollouts while a version is written straight into this policy's tensors (buffer strategy
        `none`, `rlightning.weights.WeightReceiver`): waits for running rollouts, keeps new ones out until
        `end_weight_receive`.

        Args:
            timeout (float): Seconds to wait for running rollouts.

        Returns:
            bool: True when paused (call `end_weight_receive` afterwards); False when rollouts did not drain in
            time (nothing may be written).
        """
        return self._gate.acquire_exclusive(timeout)

    def end_weight_receive(self, version: int | None) -> None:
        """Let rollouts in again after `begin_weight_receive`.

        Args:
            version (int | None): The version the tensors now hold completely; None when the receive stopped part
                way, so they hold no version: `weight_version` is 0 until the next complete one.

        Raises:
            RuntimeError: When no receive was begun.
        """
        with self._weight_apply_lock:
            self.weight_version = 0 if version is None else int(version)
        self._gate.release_exclusive()

    def update_weights(self) -> None:
        """The update thread's loop (`init_eval` starts it on a daemon thread): wait for a request, wait for
        rollouts to drain, apply, repeat.

        A request that arrives while an update runs has a newer generation and triggers another pass.
        Errors are logged and kept in `weight_update_error`; the loop continues. Returns after `close`.
        """
        self._update_thread.run()

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

    def get_eval_weights(self) -> dict[str, torch.Tensor]:
        """The tensors a trainer publishes to its evaluators: what an evaluator of this class holds, by clean name.

        By default every parameter and buffer (`weights.named_state(self)`). A policy whose evaluators need less
        than the trainer holds (SAC's critics stay with the trainer) returns that part, named as in the evaluator's
        own `named_state`, so received weights load into it and its digests compare with these.

        Returns:
            dict[str, torch.Tensor]: Clean name -> tensor, sharing storage with the policy (no copy).
        """
        return weights.named_state(self)

    # -- fingerprints -----------------------------------------------------------------------------------------------

    def get_param_fingerprint(self) -> dict[str, float]:
        """Per-tensor float32 L2 norms of every parameter and buffer, keyed `"<module>.<param>"`.

        Returns:
            dict[str, float]: Norms by clean name (no DDP/compile prefixes).
        """
        return weights.l2_fingerprint(weights.named_state(self))

    def get_param_digests(self) -> dict[str, str]:
        """Exact sha256 digests of every parameter and buffer.

        Returns:
            dict[str, str]: Hex digests by clean name.
        """
        return weights.tensor_digests(weights.named_state(self))

    # -- checkpoints ------------------------------------------------------------------------------------------------

    def checkpoint_state(self) -> dict[str, Any]:
        """Everything a resume needs, cloned to the CPU.

        Returns:
            dict[str, Any]: `format_version`, `policy_class`, `weights` (named_state), `optimizer` (state dict
                or None), `counters` (`iteration`, `env_steps`), `weight_version`, `extra`
                (`extra_training_state()`), `rng` (python, numpy, torch, cuda).
        """
        cls = type(self)
        return {
            "format_version": _training_state.CHECKPOINT_FORMAT_VERSION,
            "policy_class": f"{cls.__module__}:{cls.__qualname__}",
            "weights": _training_state.clone_checkpoint_value(dict(weights.named_state(self))),
            **_training_state.capture(self),
            "rng": _rng.capture_rng_state(),
        }

    def extra_training_state(self) -> dict[str, Any]:
        """What else a resume needs besides weights, optimizer, counters and RNG (an off-policy learner's replay
        buffer); checkpointed and, on a DDP resume, broadcast from rank 0 to every rank. None by default.

        Returns:
            dict[str, Any]: Tensors in plain containers (a checkpoint loads with `weights_only=True`).
        """
        return {}

    def load_extra_training_state(self, state: Mapping[str, Any]) -> None:
        """Restore what `extra_training_state` returned (the base class has none to restore).

        Args:
            state (Mapping[str, Any]): An `extra_training_state()` output, tensors on the CPU.
        """
        del state

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Write `checkpoint_state()` atomically (temporary file, then rename).

        Args:
            path (str | os.PathLike[str]): Destination file; parent directories are created.

        Returns:
            Path: The path written.
        """
        return _training_state.write_checkpoint(self.checkpoint_state(), path)

    def load_checkpoint(self, path: str | os.PathLike[str], restore_rng: bool = True) -> dict[str, Any]:
        """Resume from a checkpoint: weights, optimizer, counters, weight version, extra training state (a replay
        buffer) and (optionally) RNG states.

        Call after `init_train` (or `init_eval`, which ignores the optimizer state).

        Args:
            path (str | os.PathLike[str]): A file written by `save_checkpoint`.
            restore_rng (bool, optional): Also restore the global RNG states. Defaults to True.

        Returns:
            dict[str, Any]: The checkpoint as loaded.

        Raises:
            RuntimeError: When the policy is not initialised.
            ValueError: When the file's format version is unknown.
        """
        self._require_init()
        state = _training_state.read_checkpoint(path)
        with self._gate.exclusive():
            self.load_state_dict(state["weights"])
        _training_state.restore(self, state)
        if restore_rng:
            _rng.restore_rng_state(state["rng"])
        return state

    # -- timing ------------------------------------------------------------------------------------------------------

    def print_timing_summary(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """Print count, total, mean and maximum seconds per timed phase, since start or the last reset.

        Args:
            reset (bool, optional): Start the aggregates afresh afterwards. Defaults to False.

        Returns:
            dict[str, dict[str, float]]: `{phase: {"count", "total_s", "mean_s", "max_s"}}`, phases by name.
        """
        summary = {
            phase: {"count": stats.count, "total_s": stats.total_s, "mean_s": stats.mean_s, "max_s": stats.max_s}
            for phase, stats in self.timings.snapshot(reset).items()
        }
        for phase, row in summary.items():
            print(
                f"{phase:>16}: n={row['count']} total={row['total_s']:.3f}s mean={row['mean_s'] * 1e3:.3f}ms "
                f"max={row['max_s'] * 1e3:.3f}ms"
            )
        return summary
