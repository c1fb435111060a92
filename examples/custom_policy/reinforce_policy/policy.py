"""REINFORCE with reward-to-go for Discrete action spaces: a `BasePolicy` subclass living outside rlightning.

Algorithm: Williams 1992, "Simple Statistical Gradient-Following Algorithms for Connectionist Reinforcement
Learning"; returns-to-go normalised per batch as a baseline (Sutton and Barto 2018, section 13.4). A return is
cut where its batch ends (no critic to bootstrap from), which biases it for episodes longer than
`train.rolloutSteps`; a truncated episode is treated the same way.

What a policy class must do for rlightning (see `rlightning.policy.BasePolicy`): build its network in
`construct_network`, act in `rollout_step`/`postprocess` (the output's `action` goes to the env), declare the
rollout outputs it learns from in `rollout_fields`, learn in `update_dataset` (`checked_dataset` checks the batch)
and `train`. The base class builds the optimizer that `spec.policy.optim` names (`setup_optimizer`), names the
trainable modules' weights (`get_trainable_parameters`) and loads state dicts (`load_state_dict`). Its
`policy_kwargs` are validated by `kwargs_model`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import gymnasium
import torch
from pydantic import BaseModel, ConfigDict, Field, PositiveInt
from pydantic.alias_generators import to_camel
from tensordict import TensorDict
from torch import nn

from rlightning.config import PolicyConfig
from rlightning.policy import BasePolicy, EnvMeta, ExperienceField, PolicyRole


class ReinforceKwargs(BaseModel):
    """`spec.policy.policyKwargs` of `ReinforcePolicy` (camelCase keys; unknown keys are errors)."""

    model_config = ConfigDict(extra="forbid", alias_generator=to_camel, populate_by_name=True)

    hidden_size: PositiveInt = Field(default=64, description="Width of the one hidden layer.")
    gamma: float = Field(default=0.99, ge=0, le=1, description="Discount factor.")


class PolicyNetwork(nn.Module):
    """Logits `[B, n]` of a categorical policy over `n` actions from flat observations `[B, obs_dim]`."""

    def __init__(self, obs_dim: int, actions: int, hidden: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """Logits for `obs` `[B, obs_dim]` float32."""
        return self.net(obs)


def returns_to_go(reward: torch.Tensor, done: torch.Tensor, gamma: float) -> torch.Tensor:
    """Discounted returns from each step to its episode's end (or the batch's), `[T, N]` float32.

    Args:
        reward (torch.Tensor): `[T, N]` float32.
        done (torch.Tensor): `[T, N]` bool, the episode ended at this step (terminated or truncated).
        gamma (float): Discount.

    Returns:
        torch.Tensor: `[T, N]` float32.
    """
    out = torch.zeros_like(reward)
    running = torch.zeros_like(reward[0])
    for t in reversed(range(reward.shape[0])):
        running = reward[t] + gamma * running * (~done[t]).float()
        out[t] = running
    return out


class ReinforcePolicy(BasePolicy):
    """REINFORCE (see the module docstring); Discrete actions, Box observations.

    Args:
        config (PolicyConfig): `spec.policy`; `policy_kwargs` is validated by `ReinforceKwargs`.
        role_type (PolicyRole | str): `train` or `eval`.
    """

    kwargs_model: ClassVar[type[BaseModel]] = ReinforceKwargs
    # The spaces it can build a network for: `rlightning validate` refuses an env with others.
    observation_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Box,)
    action_spaces: ClassVar[tuple[type[gymnasium.Space], ...]] = (gymnasium.spaces.Discrete,)
    algorithm: ClassVar[str] = "REINFORCE"
    agent: nn.Module

    def __init__(self, config: PolicyConfig, role_type: PolicyRole | str) -> None:
        super().__init__(config, role_type)
        self.kwargs = ReinforceKwargs.model_validate(config.policy_kwargs)
        self._dataset: TensorDict | None = None

    def construct_network(self, env_meta: EnvMeta) -> None:
        """Create `self.agent`, a PolicyNetwork for the env's spaces (the declared ones: the base class checks)."""
        assert isinstance(env_meta.action_space, gymnasium.spaces.Discrete)
        obs_dim = int(torch.tensor(env_meta.observation_space.shape).prod())
        self.agent = PolicyNetwork(obs_dim, int(env_meta.action_space.n), self.kwargs.hidden_size)

    def _logits(self, observation: Any) -> torch.Tensor:
        obs = torch.as_tensor(observation, dtype=torch.float32, device=self.device)
        agent = self.agent.module if isinstance(self.agent, nn.parallel.DistributedDataParallel) else self.agent
        return agent(obs.reshape(obs.shape[0], -1))

    def rollout_step(self, env_ret: Mapping[str, Any]) -> torch.Tensor:
        """Sample (or, with `env_ret["deterministic"]`, take the likeliest) actions `[N]` int64."""
        logits = self._logits(env_ret["observation"])
        if env_ret.get("deterministic", False):
            return logits.argmax(-1)
        return torch.distributions.Categorical(logits=logits).sample()

    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: Any) -> TensorDict:
        """`{"action": [N] int64}` as a TensorDict `[N]`."""
        return TensorDict({"action": policy_resp}, batch_size=[policy_resp.shape[0]])

    def rollout_fields(self) -> dict[str, ExperienceField]:
        """`action` `[]` int64: all REINFORCE keeps besides the env keys."""
        return {"action": ExperienceField((), torch.int64)}

    def update_dataset(self, dataset: TensorDict) -> None:
        """Keep a `[T, N]` batch with the keys of `experience_fields()` for the next `train`.

        Raises:
            ValueError: When the layout differs (names the rule).
        """
        self._dataset = self.checked_dataset(dataset).to(self.device)

    def train(self) -> dict[str, float]:  # type: ignore[override]  # the seed's API: one update, no arguments
        """One policy-gradient step on the batch from `update_dataset`.

        Returns:
            dict[str, float]: `policy_loss`, `entropy`.

        Raises:
            RuntimeError: Without `init_train` or a batch.
        """
        if self.optimizer is None or self._dataset is None:
            raise RuntimeError("ReinforcePolicy.train needs init_train and a batch from update_dataset")
        data, self._dataset = self._dataset, None
        steps, envs = data.batch_size
        returns = returns_to_go(data["reward"], data["terminated"] | data["truncated"], self.kwargs.gamma)
        advantage = (returns - returns.mean()) / (returns.std() + 1e-8)
        dist = torch.distributions.Categorical(logits=self.agent(data["observation"].reshape(steps * envs, -1)))
        loss = -(dist.log_prob(data["action"].reshape(-1)) * advantage.reshape(-1)).mean()
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        self.optimizer.step()
        self.iteration += 1
        self.env_steps += steps * envs * self.dp_world_size
        return {"policy_loss": float(loss.detach()), "entropy": float(dist.entropy().mean().detach())}
