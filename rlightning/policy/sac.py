"""Soft Actor-Critic for Box action spaces: off-policy, learning from a replay buffer of the fleet's experience.

Algorithm: Haarnoja et al. 2018, "Soft Actor-Critic: Off-Policy Maximum Entropy Deep Reinforcement Learning with a
Stochastic Actor" (arXiv:1801.01290), with the changes of "Soft Actor-Critic Algorithms and Applications"
(arXiv:1812.05905): twin Q-networks (the minimum is the target), target Q-networks updated by Polyak averaging
(`tau`), and automatic entropy tuning towards a target entropy of `-dim(A)`. The squashed Gaussian actor (tanh,
log-probability corrected by `log(1 - tanh(u)^2)`, log-std clamped to [-5, 2]) and the hyperparameter defaults
follow CleanRL's sac_continuous_action.py (https://github.com/vwxyzjn/cleanrl) and Stable-Baselines3's SAC.

Experience batches are `[T, N]` TensorDicts with the env keys every collector writes
(`rlightning.policy.env_fields`) plus the one rollout output SAC declares:

    action            [T, N, A] float32   the action sent to the env, in the action space's bounds

`update_dataset` adds every step of a batch to a bounded replay buffer (`_replay.CircularReplayBuffer`, per rank;
checkpointed as `extra_training_state`: rank 0's transitions held, at most `bufferSize` of them, which a DDP resume
hands to every rank, so a resumed trainer goes on learning without refilling it);
`train` runs `gradientSteps` updates on minibatches drawn from it. A terminated step is not bootstrapped; a
truncated one is, from its `next_observation`. Under DDP each rank samples its own buffer and the gradients of
actor, critics and temperature are all-reduced, so the ranks stay identical (the target critics follow the
critics by the same arithmetic).

Evaluators hold only the actor: `get_eval_weights` is the actor's state, which is what the trainer publishes; the
critics, target critics and temperature stay with the trainer (and its checkpoints).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import gymnasium
import torch
import torch.nn.functional as F
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from pydantic.alias_generators import to_camel
from tensordict import TensorDict
from torch import nn

from rlightning import weights
from rlightning.config import OptimConfig, PolicyConfig, TrainConfig
from rlightning.policy import _experience, _optim, _replay, base_policy
from rlightning.policy._env_meta import EnvMeta

LOG_STD_MIN, LOG_STD_MAX = -5.0, 2.0
"""Bounds of the actor's log standard deviation (CleanRL's sac_continuous_action.py)."""


class SACKwargs(BaseModel):
    """`spec.policy.policyKwargs` of `SACPolicy` (camelCase keys; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    hidden_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [256, 256], min_length=1, description="Widths of the hidden layers of all MLPs."
    )
    gamma: float = Field(default=0.99, ge=0, le=1, description="Discount factor.")
    tau: float = Field(default=0.005, gt=0, le=1, description="Polyak coefficient of the target-critic update.")
    batch_size: PositiveInt = Field(default=256, description="Transitions per gradient step, per rank.")
    buffer_size: PositiveInt = Field(
        default=100_000, description="Replay buffer capacity in transitions, per rank (the oldest are overwritten)."
    )
    learning_starts: int = Field(
        default=1000, ge=0, description="Transitions a rank's buffer holds before its first gradient step."
    )
    gradient_steps: PositiveInt = Field(
        default=64,
        description=(
            "Gradient steps per `train` call (per update): with the fleet, the replay ratio is this over "
            "train.rolloutSteps * env.numEnvs * train.batchesPerUpdate transitions per rank."
        ),
    )
    auto_entropy: bool = Field(default=True, description="Tune the temperature alpha towards `targetEntropy`.")
    init_alpha: float = Field(default=1.0, gt=0, description="Initial (or, without autoEntropy, fixed) alpha.")
    target_entropy: float | None = Field(
        default=None, description="Target entropy of automatic tuning; null means -dim(A) (arXiv:1812.05905)."
    )


def _mlp(inputs: int, hidden: list[int], outputs: int) -> nn.Sequential:
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [nn.Linear(inputs, width), nn.ReLU()]
        inputs = width
    layers.append(nn.Linear(inputs, outputs))
    return nn.Sequential(*layers)


class SquashedGaussianActor(nn.Module):
    """A Gaussian over pre-squash actions `u`, squashed by tanh and scaled to the action space's bounds.

    Args:
        obs_dim (int): Flattened observation size.
        action_space (gymnasium.spaces.Box): 1-D, finite bounds `[A]`.
        hidden (list[int]): Hidden-layer widths.
    """

    action_scale: torch.Tensor
    action_bias: torch.Tensor

    def __init__(self, obs_dim: int, action_space: gymnasium.spaces.Box, hidden: list[int]) -> None:
        super().__init__()
        act_dim = action_space.shape[0]
        self.trunk = _mlp(obs_dim, hidden[:-1], hidden[-1])
        self.mean = nn.Linear(hidden[-1], act_dim)
        self.log_std = nn.Linear(hidden[-1], act_dim)
        low, high = (torch.as_tensor(bound, dtype=torch.float32) for bound in (action_space.low, action_space.high))
        self.register_buffer("action_scale", (high - low) / 2)
        self.register_buffer("action_bias", (high + low) / 2)

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample a squashed action (reparameterised) and its log-probability.

        Args:
            obs (torch.Tensor): `[B, obs_dim]` float32.
            deterministic (bool, optional): Take `tanh(mean)` instead of sampling. Defaults to False.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: action `[B, A]` in the space's bounds, log_prob `[B]` (of the
                squashed action in [-1, 1]^A, per arXiv:1801.01290 appendix C).
        """
        features = F.relu(self.trunk(obs))
        mean = self.mean(features)
        log_std = self.log_std(features).clamp(LOG_STD_MIN, LOG_STD_MAX)
        normal = torch.distributions.Normal(mean, log_std.exp())
        u = mean if deterministic else normal.rsample()
        squashed = torch.tanh(u)
        log_prob = (normal.log_prob(u) - torch.log1p(-squashed.pow(2) + 1e-6)).sum(-1)
        return squashed * self.action_scale + self.action_bias, log_prob

    def normalize(self, action: torch.Tensor) -> torch.Tensor:
        """Map env actions `[B, A]` back to [-1, 1]^A, the critics' action input."""
        return (action - self.action_bias) / self.action_scale


class TwinQCritic(nn.Module):
    """Two independent Q-networks over `[observation, action in [-1, 1]^A]` (arXiv:1812.05905, clipped double Q).

    Args:
        obs_dim (int): Flattened observation size.
        act_dim (int): Action size A.
        hidden (list[int]): Hidden-layer widths.
    """

    def __init__(self, obs_dim: int, act_dim: int, hidden: list[int]) -> None:
        super().__init__()
        self.q1 = _mlp(obs_dim + act_dim, hidden, 1)
        self.q2 = _mlp(obs_dim + act_dim, hidden, 1)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Q-values `[B]` of both networks for `obs` `[B, obs_dim]` and normalised `action` `[B, A]`."""
        x = torch.cat([obs, action], dim=-1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


class EntropyTemperature(nn.Module):
    """The temperature alpha as a learnable `log_alpha` (a child module, so DDP all-reduces its gradient).

    Args:
        init_alpha (float): Initial alpha (> 0).
    """

    def __init__(self, init_alpha: float) -> None:
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha), dtype=torch.float32))

    def forward(self) -> torch.Tensor:
        """`log_alpha`, a scalar (called through the DDP wrapper so its gradient is all-reduced)."""
        return self.log_alpha


M = TypeVar("M", bound=nn.Module)


def _unwrap(module: nn.Module, kind: type[M]) -> M:
    """`module` without its DDP wrapper, for forwards that must not take part in DDP's gradient sync."""
    inner = module.module if isinstance(module, nn.parallel.DistributedDataParallel) else module
    if not isinstance(inner, kind):
        raise TypeError(f"expected a {kind.__name__}, got {type(inner).__name__}")
    return inner


class SACPolicy(base_policy.BasePolicy):
    """SAC with twin critics and automatic entropy tuning (see the module docstring).

    The trainer holds `actor`, `critic`, `critic_target` (no gradients) and `temperature`; an evaluator holds the
    `actor` only. `spec.policy.optim` sets the optimizer and learning rate of all three losses (one optimizer,
    one parameter group each; each loss steps only its own parameters).

    Args:
        config (PolicyConfig): `spec.policy`; `policy_kwargs` is validated by `SACKwargs`.
        role_type (PolicyRole | str): `train` or `eval`.

    Raises:
        pydantic.ValidationError: When `policy_kwargs` is invalid (a ValueError).
    """

    kwargs_model: ClassVar[type[BaseModel]] = SACKwargs
    observation_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Box,)
    action_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Box,)
    algorithm: ClassVar[str] = "SAC"
    # Set by construct_network; under DDP the trainable ones are wrapped (`_unwrap` gives the module back).
    actor: nn.Module
    critic: nn.Module
    critic_target: TwinQCritic
    temperature: nn.Module

    def __init__(self, config: PolicyConfig, role_type: base_policy.PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self.kwargs = SACKwargs.model_validate(config.policy_kwargs)
        self.replay: _replay.CircularReplayBuffer | None = None
        self.target_entropy = 0.0
        self._pending_steps: int | None = None  # transitions added since the last `train`

    # -- building ------------------------------------------------------------------------------------------------

    @classmethod
    def space_problems(cls, env_meta: EnvMeta) -> list[str]:
        """Box observations, and a 1-D Box of actions with finite bounds (the squashed Gaussian's range)."""
        problems = super().space_problems(env_meta)
        space = env_meta.action_space
        if problems or not isinstance(space, gymnasium.spaces.Box):
            return problems
        if not (
            len(space.shape) == 1
            and bool(torch.isfinite(torch.as_tensor(space.low)).all())
            and bool(torch.isfinite(torch.as_tensor(space.high)).all())
        ):
            problems.append(f"{cls.__name__} needs a 1-D Box action space with finite bounds, got {space}")
        return problems

    def construct_network(self, env_meta: EnvMeta) -> None:
        """Create the actor; for the train role also the twin critic, its target copy and the temperature.

        Raises:
            ValueError: When the observation space is not a Box, or the action space not a 1-D Box with
                finite bounds.
        """
        obs_space, action_space = env_meta.observation_space, env_meta.action_space
        problems = self.space_problems(env_meta)
        if problems:
            raise ValueError(problems[0])
        assert isinstance(obs_space, gymnasium.spaces.Box) and isinstance(action_space, gymnasium.spaces.Box)
        obs_dim, act_dim, hidden = math.prod(obs_space.shape), action_space.shape[0], self.kwargs.hidden_sizes
        self.actor = SquashedGaussianActor(obs_dim, action_space, hidden)
        if self.role_type is base_policy.PolicyRole.TRAIN:
            self.critic = TwinQCritic(obs_dim, act_dim, hidden)
            self.critic_target = TwinQCritic(obs_dim, act_dim, hidden).requires_grad_(False)
            self.temperature = EntropyTemperature(self.kwargs.init_alpha)
            self.temperature.requires_grad_(self.kwargs.auto_entropy)
        target = self.kwargs.target_entropy
        self.target_entropy = float(-act_dim if target is None else target)

    def init_train(self, env_meta: EnvMeta, train_config: TrainConfig | None = None, seed: int | None = None) -> None:
        """`BasePolicy.init_train`, then the target critic copies the critic (after DDP broadcast rank 0's
        weights, so every rank starts from the same target) and an empty replay buffer.
        """
        super().init_train(env_meta, train_config, seed)
        self.critic_target.load_state_dict(_unwrap(self.critic, TwinQCritic).state_dict())
        self.replay = _replay.CircularReplayBuffer(self.kwargs.buffer_size, self.device)

    def setup_optimizer(self, optim_cfg: OptimConfig) -> torch.optim.Optimizer:
        """Adam, AdamW or SGD with a parameter group each for actor, critic and (when tuned) temperature."""
        groups = [{"params": list(self.actor.parameters())}, {"params": list(self.critic.parameters())}]
        if self.kwargs.auto_entropy:
            groups.append({"params": list(self.temperature.parameters())})
        return _optim.make_optimizer(groups, optim_cfg)

    # -- acting --------------------------------------------------------------------------------------------------

    def _observation(self, raw: Any) -> torch.Tensor:
        obs = torch.as_tensor(raw, device=self.device, dtype=torch.float32)
        return obs.reshape(obs.shape[0], -1)

    def rollout_step(self, env_ret: Mapping[str, Any]) -> torch.Tensor:
        """Sample (or, with `env_ret["deterministic"]`, take `tanh(mean)` of) actions `[N, A]` for
        `env_ret["observation"]` `[N, *O]`.
        """
        actor = _unwrap(self.actor, SquashedGaussianActor)
        action, _ = actor(self._observation(env_ret["observation"]), bool(env_ret.get("deterministic", False)))
        return action

    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: Any) -> TensorDict:
        """Pack the actions as a TensorDict `[N]` with key `action` (on the policy's device)."""
        return TensorDict({"action": policy_resp}, batch_size=[policy_resp.shape[0]])

    def rollout_fields(self) -> dict[str, _experience.ExperienceField]:
        """`action` `[A]` float32, the action sent to the env.

        Raises:
            RuntimeError: When the policy is not initialised (the action space is unknown).
        """
        space = self._require_env_meta().action_space
        return {"action": _experience.ExperienceField(tuple(space.shape or ()), torch.float32)}

    # -- learning ------------------------------------------------------------------------------------------------

    def update_dataset(self, dataset: TensorDict) -> None:
        """Add every step of a `[T, N]` batch to the replay buffer; keys beyond `experience_fields()` are ignored.

        Args:
            dataset (TensorDict): `[T, N]` with the keys, per-step shapes and dtypes of `experience_fields()`.

        Raises:
            RuntimeError: Without `init_train`.
            ValueError: When the batch is not 2-D, or a key is missing or has the wrong shape or dtype.
        """
        if self.replay is None:
            raise RuntimeError("SACPolicy.update_dataset needs init_train")
        flat = self.checked_dataset(dataset).reshape(-1)
        self.replay.extend(flat.select("observation", "next_observation", "action", "reward", "terminated"))
        self._pending_steps = flat.shape[0]

    def alpha(self) -> float:
        """The current temperature alpha."""
        return float(self._temperature().exp())

    def _temperature(self) -> torch.Tensor:
        return _unwrap(self.temperature, EntropyTemperature).log_alpha.detach()

    def train(self) -> dict[str, float]:  # type: ignore[override]  # the seed's train() takes no arguments
        """`gradientSteps` SAC updates on minibatches of the replay buffer (none before `learningStarts`).

        Under DDP every rank must call this at the same time with the same buffer fill state (the ranks receive
        equal batch shapes each iteration, so their buffers fill alike).

        Returns:
            dict[str, float]: `critic_loss`, `actor_loss`, `alpha_loss`, `q_value` (mean of the twin minimum),
                `entropy` (minus the mean log-probability), means over the steps (NaN with no step); `alpha`,
                `gradient_steps`, `replay_size`, `lr`.

        Raises:
            RuntimeError: Without `init_train` or without a batch from `update_dataset`.
        """
        steps = self._pending_steps
        if self.optimizer is None or self.replay is None or steps is None:
            raise RuntimeError("SACPolicy.train needs init_train and a batch from update_dataset")
        self._pending_steps = None
        lr = self.current_lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        names = ("critic_loss", "actor_loss", "alpha_loss", "q_value", "entropy")
        sums = dict.fromkeys(names, 0.0)
        done = 0
        if len(self.replay) >= max(self.kwargs.learning_starts, 1):
            for _ in range(self.kwargs.gradient_steps):
                for key, value in self._gradient_step(self.replay.sample(self.kwargs.batch_size)).items():
                    sums[key] += value
                done += 1
        self.iteration += 1
        self.env_steps += steps * self.dp_world_size
        metrics = {key: (total / done if done else math.nan) for key, total in sums.items()}
        metrics.update(alpha=self.alpha(), gradient_steps=float(done), replay_size=float(len(self.replay)), lr=lr)
        return metrics

    def _step(self, loss: torch.Tensor, params: list[nn.Parameter]) -> None:
        # Only `params` receive gradients (backward's `inputs`), so one optimizer steps exactly this loss's group.
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward(inputs=params)
        if self.config.optim.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(params, self.config.optim.max_grad_norm)
        self.optimizer.step()

    def _gradient_step(self, batch: TensorDict) -> dict[str, float]:
        kw = self.kwargs
        actor, critic = _unwrap(self.actor, SquashedGaussianActor), _unwrap(self.critic, TwinQCritic)
        obs = batch["observation"].reshape(batch.shape[0], -1)
        next_obs = batch["next_observation"].reshape(batch.shape[0], -1)
        action = actor.normalize(batch["action"])
        alpha = self._temperature().exp()

        with torch.no_grad():  # soft Bellman target from the target critics (arXiv:1812.05905, eq. 3)
            next_action, next_log_prob = actor(next_obs)
            target_q1, target_q2 = self.critic_target(next_obs, actor.normalize(next_action))
            next_value = torch.min(target_q1, target_q2) - alpha * next_log_prob
            target = batch["reward"] + kw.gamma * (~batch["terminated"]).float() * next_value
        q1, q2 = self.critic(obs, action)  # through DDP: the critic's gradients are all-reduced
        critic_loss = F.mse_loss(q1, target) + F.mse_loss(q2, target)
        self._step(critic_loss, list(self.critic.parameters()))

        new_action, log_prob = self.actor(obs)  # through DDP: the actor's gradients are all-reduced
        new_q1, new_q2 = critic(obs, actor.normalize(new_action))  # unwrapped: only the actor learns here
        q_value = torch.min(new_q1, new_q2)
        actor_loss = (alpha * log_prob - q_value).mean()
        self._step(actor_loss, list(self.actor.parameters()))

        alpha_loss = torch.zeros(())
        if kw.auto_entropy:  # arXiv:1812.05905, eq. 18, on log alpha
            alpha_loss = -(self.temperature() * (log_prob.detach() + self.target_entropy)).mean()
            self._step(alpha_loss, list(self.temperature.parameters()))

        with torch.no_grad():  # Polyak averaging of the target critics
            for target_param, param in zip(self.critic_target.parameters(), critic.parameters(), strict=True):
                target_param.lerp_(param, kw.tau)
        return {
            "critic_loss": float(critic_loss.detach()),
            "actor_loss": float(actor_loss.detach()),
            "alpha_loss": float(alpha_loss.detach()),
            "q_value": float(q_value.detach().mean()),
            "entropy": float(-log_prob.detach().mean()),
        }

    # -- weights -------------------------------------------------------------------------------------------------

    def get_eval_weights(self) -> dict[str, torch.Tensor]:
        """The actor's parameters and buffers under `actor.*`: all an evaluator holds and needs to act."""
        return {f"actor.{name}": tensor for name, tensor in weights.named_state(self.actor).items()}

    def extra_training_state(self) -> dict[str, Any]:
        """The replay buffer's transitions, oldest first (`CircularReplayBuffer.state_dict`); none on an evaluator.

        Bytes: the transitions held times one transition's (observation and next observation, action, reward,
        terminated): 33 for Pendulum-v1, so 3.3 MB for a full buffer of 100,000.
        """
        return {} if self.replay is None else {"replay": self.replay.state_dict()}

    def load_extra_training_state(self, state: Mapping[str, Any]) -> None:
        """Refill the replay buffer from `extra_training_state` (the newest `bufferSize` transitions of it)."""
        if self.replay is not None and "replay" in state:
            self.replay.load_state_dict(state["replay"])
