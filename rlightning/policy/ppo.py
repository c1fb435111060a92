"""PPO with a clipped surrogate objective and GAE, for Discrete and Box action spaces.

Algorithm: Schulman et al. 2017, "Proximal Policy Optimization Algorithms" (arXiv:1707.06347); advantages:
Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized Advantage Estimation"
(arXiv:1506.02438). Network shape, orthogonal initialisation (gain sqrt(2) hidden, 0.01 policy head, 1.0 value
head), per-minibatch advantage normalisation, clipped value loss and linear learning-rate annealing follow
CleanRL's ppo.py and ppo_continuous_action.py (https://github.com/vwxyzjn/cleanrl). Continuous actions use a
Gaussian with a state-independent log standard deviation (an `nn.Parameter` on the network itself).

Optional, as in CleanRL's ppo_continuous_action.py and Stable-Baselines3: observation normalisation
(`normalizeObservations`: running mean and variance, `_normalize.RunningObservationNorm`, buffers of the network,
so evaluators receive them with the weights and checkpoints hold them; updated after each update from its batch,
so a batch is trained with the statistics it was collected with), and an early stop of the epochs once the mean
approximate KL divergence of an epoch exceeds `targetKl` (averaged over the DDP ranks, so every rank stops alike).

Experience batches are TensorDicts of shape `[T, N]` (time first, N vector-env copies) with the keys of
`PPOPolicy.experience_fields()`: the env keys every collector writes (`rlightning.policy.env_fields`) and the
rollout outputs PPO declares in `rollout_fields()`:

    observation       [T, N, *O] float32   what the policy saw
    next_observation  [T, N, *O] float32   the true next state (the final observation when the episode ended)
    reward            [T, N] float32
    terminated        [T, N] bool          the episode ended in a terminal state (no bootstrap)
    truncated         [T, N] bool          the episode was cut (time limit); bootstrapped from next_observation
    action            [T, N] int64 (Discrete) or [T, N, A] float32 (Box; unclipped sample)
    log_prob          [T, N] float32       log-probability of `action` when it was taken

`train` computes the value estimates itself, once per update and before its epochs: `value` of `observation`
and `next_value` of `next_observation`, with the critic it is about to update.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import gymnasium
import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from pydantic.alias_generators import to_camel
from tensordict import TensorDict
from torch import nn

from rlightning.config import PolicyConfig
from rlightning.policy import _ddp, _experience, _normalize, base_policy
from rlightning.policy._env_meta import EnvMeta


class PPOKwargs(BaseModel):
    """`spec.policy.policyKwargs` of `PPOPolicy` (camelCase keys; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    hidden_sizes: list[PositiveInt] = Field(
        default_factory=lambda: [64, 64], min_length=1, description="Widths of the hidden layers of both MLPs."
    )
    activation: Literal["tanh", "relu"] = Field(default="tanh", description="Hidden-layer activation.")
    clip_coef: float = Field(default=0.2, gt=0, description="Surrogate clipping range epsilon.")
    anneal_clip_coef: bool = Field(
        default=False,
        description="Decay clipCoef linearly to 0 over train.totalEnvSteps, as the learning rate (SB3's lin_0.2).",
    )
    gamma: float = Field(default=0.99, ge=0, le=1, description="Discount factor.")
    gae_lambda: float = Field(default=0.95, ge=0, le=1, description="GAE lambda.")
    update_epochs: int = Field(default=4, ge=1, description="Passes over each batch.")
    num_minibatches: int = Field(default=4, ge=1, description="Minibatches per pass.")
    entropy_coef: float = Field(default=0.01, ge=0, description="Weight of the entropy bonus.")
    value_coef: float = Field(default=0.5, ge=0, description="Weight of the value loss.")
    normalize_advantages: bool = Field(default=True, description="Normalise advantages per minibatch.")
    clip_value_loss: bool = Field(default=True, description="Clip the value update like the policy update.")
    init_log_std: float = Field(default=0.0, description="Initial log standard deviation (Box actions).")
    normalize_observations: bool = Field(
        default=False, description="Normalise observations by running statistics (synced and checkpointed)."
    )
    observation_clip: float = Field(default=10.0, gt=0, description="Bound of the normalised observations.")
    normalize_rewards: bool = Field(
        default=False,
        description="Scale rewards by the running std of the discounted return (synced and checkpointed).",
    )
    reward_clip: float = Field(default=10.0, gt=0, description="Bound of the scaled rewards.")
    target_kl: float | None = Field(
        default=None, gt=0, description="Stop an update's epochs once an epoch's mean approximate KL exceeds this."
    )


def _layer(inputs: int, outputs: int, gain: float) -> nn.Linear:
    layer = nn.Linear(inputs, outputs)
    nn.init.orthogonal_(layer.weight, gain)
    nn.init.zeros_(layer.bias)
    return layer


def _mlp(inputs: int, hidden: list[int], outputs: int, activation: str, out_gain: float) -> nn.Sequential:
    act = nn.Tanh if activation == "tanh" else nn.ReLU
    layers: list[nn.Module] = []
    for width in hidden:
        layers += [_layer(inputs, width, math.sqrt(2)), act()]
        inputs = width
    layers.append(_layer(inputs, outputs, out_gain))
    return nn.Sequential(*layers)


class PPONetwork(nn.Module):
    """Separate actor and critic MLPs; a Gaussian log-std parameter for Box actions.

    Args:
        observation_space (gymnasium.spaces.Box): Observations `[*O]`, flattened to `prod(O)` inputs.
        action_space (gymnasium.spaces.Discrete | gymnasium.spaces.Box): Actions; Box must be 1-D `[A]`.
        kwargs (PPOKwargs): Layer sizes, activation, initial log-std.

    Raises:
        ValueError: On an unsupported space.
    """

    def __init__(self, observation_space: gymnasium.Space, action_space: gymnasium.Space, kwargs: PPOKwargs):
        super().__init__()
        if not isinstance(observation_space, gymnasium.spaces.Box):
            raise ValueError(f"PPOPolicy needs a Box observation space, got {observation_space}")
        obs_dim = math.prod(observation_space.shape)
        self.critic = _mlp(obs_dim, kwargs.hidden_sizes, 1, kwargs.activation, 1.0)
        if isinstance(action_space, gymnasium.spaces.Discrete):
            self.continuous = False
            self.actor = _mlp(obs_dim, kwargs.hidden_sizes, int(action_space.n), kwargs.activation, 0.01)
        elif isinstance(action_space, gymnasium.spaces.Box) and len(action_space.shape) == 1:
            self.continuous = True
            act_dim = action_space.shape[0]
            self.actor = _mlp(obs_dim, kwargs.hidden_sizes, act_dim, kwargs.activation, 0.01)
            self.log_std = nn.Parameter(torch.full((act_dim,), kwargs.init_log_std))
        else:
            raise ValueError(f"PPOPolicy needs a Discrete or 1-D Box action space, got {action_space}")
        self.obs_norm: _normalize.RunningObservationNorm | None = None
        if kwargs.normalize_observations:
            self.obs_norm = _normalize.RunningObservationNorm(obs_dim, kwargs.observation_clip)
        self.reward_norm: _normalize.RunningRewardNorm | None = None
        if kwargs.normalize_rewards:
            self.reward_norm = _normalize.RunningRewardNorm(kwargs.gamma, kwargs.reward_clip)

    def normalize(self, obs: torch.Tensor) -> torch.Tensor:
        """Observations `[B, obs_dim]` as the MLPs take them: normalised when `obs_norm` is set, else unchanged."""
        return obs if self.obs_norm is None else self.obs_norm(obs)

    def value(self, obs: torch.Tensor, normalized: bool = False) -> torch.Tensor:
        """State values `[B]` of observations `[B, obs_dim]` float32 (already `normalize`d when `normalized`)."""
        return self.critic(obs if normalized else self.normalize(obs)).squeeze(-1)

    def distribution(self, obs: torch.Tensor, normalized: bool = False) -> torch.distributions.Distribution:
        """The action distribution for observations `[B, obs_dim]` float32 (already `normalize`d when
        `normalized`).
        """
        out = self.actor(obs if normalized else self.normalize(obs))
        # validate_args=False: the arguments are the network's own outputs, and the checks cost about as much as
        # the small MLP's forward on every rollout step.
        if self.continuous:
            return torch.distributions.Normal(out, self.log_std.exp(), validate_args=False)
        return torch.distributions.Categorical(logits=out, validate_args=False)

    def forward(
        self,
        obs: torch.Tensor,
        action: torch.Tensor | None = None,
        deterministic: bool = False,
        normalized: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """Act (or score a given action) and estimate the value.

        Args:
            obs (torch.Tensor): `[B, obs_dim]` float32.
            action (torch.Tensor | None, optional): Actions to score, `[B]` int64 or `[B, A]` float32; None
                samples (or takes the mode when `deterministic`). Defaults to None.
            deterministic (bool, optional): Take the distribution's mode instead of sampling. Defaults to False.
            normalized (bool, optional): `obs` is already `normalize`d (a training update normalises its batch
                once, with statistics that do not change during the update). Defaults to False.

        Returns:
            tuple[torch.Tensor, ...]: action, log_prob `[B]`, entropy `[B]`, value `[B]`.
        """
        if not normalized:
            obs, normalized = self.normalize(obs), True
        dist = self.distribution(obs, normalized)
        if action is None:
            action = dist.mode if deterministic else dist.sample()  # mode: the mean, or the likeliest class
        log_prob = dist.log_prob(action)
        entropy = dist.entropy()
        if self.continuous:
            log_prob, entropy = log_prob.sum(-1), entropy.sum(-1)
        return action, log_prob, entropy, self.value(obs, normalized)

    def act(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (or take the mode of) actions, without running the critic.

        Args:
            obs (torch.Tensor): `[B, obs_dim]` float32.
            deterministic (bool, optional): Take the distribution's mode instead of sampling. Defaults to False.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: action `[B]` int64 or `[B, A]` float32, log_prob `[B]` float32.
        """
        dist = self.distribution(obs)
        action = dist.mode if deterministic else dist.sample()
        log_prob = dist.log_prob(action)
        return action, log_prob.sum(-1) if self.continuous else log_prob


def compute_gae(data: TensorDict, gamma: float, gae_lambda: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimates (arXiv:1506.02438, eq. 16) over a `[T, N]` batch.

    `delta_t = r_t + gamma * next_value_t * (1 - terminated_t) - value_t` and
    `A_t = delta_t + gamma * lambda * (1 - done_t) * A_{t+1}`, where `done = terminated | truncated`, so a
    truncated episode is bootstrapped from the value of its final observation and never from the next
    episode's first one.

    Args:
        data (TensorDict): `[T, N]` with `reward`, `value`, `next_value`, `terminated`, `truncated`.
        gamma (float): Discount.
        gae_lambda (float): GAE lambda.

    Returns:
        tuple[torch.Tensor, torch.Tensor]: advantages and returns (`advantages + value`), `[T, N]` float32.
    """
    reward, value = data["reward"].float(), data["value"].float()
    not_terminated = (~data["terminated"]).float()
    not_done = (~(data["terminated"] | data["truncated"])).float()
    delta = reward + gamma * data["next_value"].float() * not_terminated - value
    advantages = torch.zeros_like(reward)
    running = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        running = delta[t] + gamma * gae_lambda * not_done[t] * running
        advantages[t] = running
    return advantages, advantages + value


class PPOPolicy(base_policy.BasePolicy):
    """PPO-clip actor-critic (see the module docstring for the algorithm and the batch layout).

    Args:
        config (PolicyConfig): `spec.policy`; `policy_kwargs` is validated by `PPOKwargs`.
        role_type (PolicyRole | str): `train` or `eval`.

    Raises:
        pydantic.ValidationError: When `policy_kwargs` is invalid (a ValueError).
    """

    kwargs_model: ClassVar[type[PPOKwargs]] = PPOKwargs
    observation_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Box,)
    action_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Discrete, gymnasium.spaces.Box)
    algorithm: ClassVar[str] = "PPO"

    def __init__(self, config: PolicyConfig, role_type: base_policy.PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self.kwargs = self.kwargs_model.model_validate(config.policy_kwargs)  # a subclass may extend the model
        self._dataset: TensorDict | None = None

    @property
    def network(self) -> PPONetwork:
        """PPONetwork: The network without its DDP wrapper (used for rollouts, which must not sync)."""
        agent = self.agent
        return agent.module if isinstance(agent, nn.parallel.DistributedDataParallel) else agent

    @classmethod
    def space_problems(cls, env_meta: EnvMeta) -> list[str]:
        """Box observations; Discrete actions or a 1-D Box of them."""
        problems = super().space_problems(env_meta)
        space = env_meta.action_space
        if not problems and isinstance(space, gymnasium.spaces.Box) and len(space.shape) != 1:
            problems.append(f"{cls.__name__} needs a Discrete or 1-D Box action space, got {space}")
        return problems

    def construct_network(self, env_meta: EnvMeta) -> None:
        """Create `self.agent`, a PPONetwork for the env's spaces."""
        self.agent = PPONetwork(env_meta.observation_space, env_meta.action_space, self.kwargs)

    def _observation(self, raw: Any) -> torch.Tensor:
        obs = torch.as_tensor(raw, device=self.device, dtype=torch.float32)
        return obs.reshape(obs.shape[0], -1)

    def rollout_step(self, env_ret: Mapping[str, Any]) -> tuple[torch.Tensor, torch.Tensor]:
        """Sample (or, with `env_ret["deterministic"]`, take the mode of) actions for `env_ret["observation"]`.

        Args:
            env_ret (Mapping[str, Any]): `observation` `[N, *O]` (array or tensor); optional `deterministic`.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: action `[N]` or `[N, A]`, log_prob `[N]`.
        """
        obs = self._observation(env_ret["observation"])
        return self.network.act(obs, deterministic=bool(env_ret.get("deterministic", False)))

    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: Any) -> TensorDict:
        """Pack the response as a TensorDict `[N]`: `action`, `log_prob` (on the policy's device)."""
        action, log_prob = policy_resp
        return TensorDict({"action": action, "log_prob": log_prob}, batch_size=[action.shape[0]])

    def rollout_fields(self) -> dict[str, _experience.ExperienceField]:
        """`action` (`[]` int64 for Discrete, `[A]` float32 for Box) and `log_prob` (`[]` float32).

        Raises:
            RuntimeError: When the policy is not initialised (the action space is unknown).
        """
        space = self._require_env_meta().action_space
        if isinstance(space, gymnasium.spaces.Box):
            action = _experience.ExperienceField(tuple(space.shape), torch.float32)
        else:
            action = _experience.ExperienceField((), torch.int64)
        return {"action": action, "log_prob": _experience.ExperienceField((), torch.float32)}

    def update_dataset(self, dataset: TensorDict) -> None:
        """Keep a `[T, N]` batch for the next `train` call; keys beyond `experience_fields()` are ignored.

        Args:
            dataset (TensorDict): `[T, N]` with the keys, per-step shapes and dtypes of `experience_fields()`
                (see the module docstring).

        Raises:
            ValueError: When the batch is not 2-D, or a key is missing or has the wrong shape or dtype.
        """
        self._dataset = self.checked_dataset(dataset).to(self.device)

    def _state_values(self, observation: torch.Tensor) -> torch.Tensor:
        # [T, N, *O] -> [T, N], with the unwrapped critic (a forward without gradients needs no DDP sync).
        steps, envs = observation.shape[:2]
        return self.network.value(observation.reshape(steps * envs, -1).float()).reshape(steps, envs)

    def train(self) -> dict[str, float]:  # type: ignore[override]  # the seed's train() takes no arguments
        """One PPO update on the batch from `update_dataset`: `update_epochs` passes of `num_minibatches`.

        Under DDP every rank must call this with a batch of the same shape (gradients are all-reduced). With
        `targetKl` the epochs stop after the first whose mean approximate KL (over the ranks) exceeds it; with
        `normalizeObservations` the statistics take in the batch's observations after the epochs.

        Returns:
            dict[str, float]: `policy_loss`, `value_loss`, `entropy`, `approx_kl`, `clip_fraction` (means over
                the minibatch steps), `explained_variance` (of the value estimates made before the epochs),
                `epochs` (run), `lr`, `clip_coef` (this update's, `current_clip_coef`).

        Raises:
            RuntimeError: Without `init_train` or without a dataset.
        """
        if self.optimizer is None or self._dataset is None:
            raise RuntimeError("PPOPolicy.train needs init_train and a batch from update_dataset")
        data, self._dataset = self._dataset, None
        kw, network = self.kwargs, self.network
        steps, envs = data.batch_size
        observation = data["observation"].reshape(steps * envs, -1).float()
        with torch.no_grad():  # the batch is our own selection (update_dataset), so adding keys is safe
            if network.reward_norm is not None:
                done = data["terminated"] | data["truncated"]
                data["reward"] = network.reward_norm.update_and_scale(data["reward"].float(), done)
            # Normalised once: the statistics do not change during the epochs.
            normalized = network.normalize(observation)
            data["normalized_observation"] = normalized.reshape(steps, envs, -1)
            data["value"] = network.value(normalized, normalized=True).reshape(steps, envs)
            data["next_value"] = self._state_values(data["next_observation"])
            advantages, returns = self.estimate_advantages(data)
        flat = data.select("normalized_observation", "action", "log_prob", "value").reshape(-1)
        flat["advantage"], flat["return"] = advantages.reshape(-1), returns.reshape(-1)
        lr, clip = self.current_lr(), self.current_clip_coef()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        clipped = [param for group in self.optimizer.param_groups for param in group["params"]]

        sums = {"policy_loss": 0.0, "value_loss": 0.0, "entropy": 0.0, "approx_kl": 0.0, "clip_fraction": 0.0}
        updates = epochs = 0
        while epochs < kw.update_epochs:
            order = torch.randperm(flat.shape[0], device="cpu").to(self.device)
            epoch_kl, epoch_updates = 0.0, 0
            for index in torch.tensor_split(order, kw.num_minibatches):
                if index.numel() == 0:
                    continue
                stats = self._minibatch_step(flat[index], self.optimizer, clip, clipped)
                for key, value in stats.items():
                    sums[key] += value
                epoch_kl += stats["approx_kl"]
                epoch_updates += 1
            updates += epoch_updates
            epochs += 1
            if kw.target_kl is not None and _ddp.mean_over_ranks(epoch_kl / max(epoch_updates, 1)) > kw.target_kl:
                break
        if network.obs_norm is not None:  # after the epochs: this batch was collected with the old statistics
            network.obs_norm.update(observation)

        values, target = data["value"].reshape(-1).float(), returns.reshape(-1)
        var_target = target.var(unbiased=False)
        explained = float("nan") if var_target == 0 else float(1 - (target - values).var(unbiased=False) / var_target)
        self.iteration += 1
        self.env_steps += steps * envs * self.dp_world_size
        metrics = {key: total / max(updates, 1) for key, total in sums.items()}
        metrics.update(explained_variance=explained, epochs=float(epochs), lr=lr, clip_coef=clip)
        return metrics

    def estimate_advantages(self, data: TensorDict) -> tuple[torch.Tensor, torch.Tensor]:
        """The advantages and value targets of a batch: GAE (`compute_gae`). A policy that corrects for policy lag
        overrides this.

        Args:
            data (TensorDict): `[T, N]`, the batch with (scaled, under `normalizeRewards`) `reward`, `value`,
                `next_value`, `normalized_observation` `[T, N, D]` (what the network takes with
                `normalized=True`) and the keys of `experience_fields()`.

        Returns:
            tuple[torch.Tensor, torch.Tensor]: advantages and value targets, `[T, N]` float32.
        """
        return compute_gae(data, self.kwargs.gamma, self.kwargs.gae_lambda)

    def current_clip_coef(self) -> float:
        """The clipping range of the next update: `clipCoef`, linearly annealed to 0 over `train.totalEnvSteps` with
        `annealClipCoef` (SB3's `clip_range: lin_0.2`, as RL Baselines3 Zoo's CartPole-v1 PPO sets it). It clips
        both the surrogate and, with `clipValueLoss`, the value update.

        Returns:
            float: The clipping range epsilon (0 once the run's env steps are spent).
        """
        kw = self.kwargs
        return kw.clip_coef * self.remaining_fraction() if kw.anneal_clip_coef else kw.clip_coef

    def _minibatch_step(
        self, mb: TensorDict, optimizer: torch.optim.Optimizer, clip: float, parameters: list[torch.Tensor]
    ) -> dict[str, float]:
        kw = self.kwargs
        _, log_prob, entropy, value = self.agent(mb["normalized_observation"], mb["action"], normalized=True)
        log_ratio = log_prob - mb["log_prob"]
        ratio = log_ratio.exp()
        advantage = mb["advantage"]
        if kw.normalize_advantages and advantage.numel() > 1:
            advantage = (advantage - advantage.mean()) / (advantage.std() + 1e-8)
        policy_loss = torch.max(
            -advantage * ratio, -advantage * ratio.clamp(1 - clip, 1 + clip)
        ).mean()
        value_error = (value - mb["return"]) ** 2
        if kw.clip_value_loss:
            clipped = mb["value"] + (value - mb["value"]).clamp(-clip, clip)
            value_error = torch.max(value_error, (clipped - mb["return"]) ** 2)
        value_loss = 0.5 * value_error.mean()
        entropy_mean = entropy.mean()
        loss = policy_loss - kw.entropy_coef * entropy_mean + kw.value_coef * value_loss

        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if self.config.optim.max_grad_norm is not None:
            nn.utils.clip_grad_norm_(parameters, self.config.optim.max_grad_norm, foreach=True)
        optimizer.step()
        with torch.no_grad():
            approx_kl = ((ratio - 1) - log_ratio).mean()  # http://joschu.net/blog/kl-approx.html (k3)
            clip_fraction = ((ratio - 1).abs() > clip).float().mean()
        return {
            "policy_loss": float(policy_loss.detach()),
            "value_loss": float(value_loss.detach()),
            "entropy": float(entropy_mean.detach()),
            "approx_kl": float(approx_kl),
            "clip_fraction": float(clip_fraction),
        }
