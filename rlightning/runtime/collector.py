"""Rollout collection on a gymnasium vector env into `[T, N]` TensorDicts, and evaluation episodes.

Actions come from the policy's gated rollout path (`BasePolicy.rollout`), so a weight update never runs in
the middle of one. The vector env resets finished copies in the same step (gymnasium's
`AutoresetMode.SAME_STEP`): the step returns the new episode's first observation and the finished episode's
last one in `info["final_obs"]`, which is what a truncated episode is bootstrapped from.
"""

from __future__ import annotations

import collections
import functools
import math

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict

from rlightning.config import EnvConfig
from rlightning.policy import BasePolicy, make_env

RECENT_EPISODES = 100
"""Finished episodes remembered for `RolloutCollector.recent_returns` / `recent_lengths`."""


def to_env_action(action: torch.Tensor, space: gymnasium.Space) -> np.ndarray:
    """Convert policy actions to what `env.step` takes; Box actions are clipped to the space's bounds.

    Args:
        action (torch.Tensor): `[N]` int64 (Discrete) or `[N, A]` float32 (Box).
        space (gymnasium.Space): The action space of one env copy.

    Returns:
        np.ndarray: `[N]` or `[N, A]` numpy actions.
    """
    array = action.detach().cpu().numpy()
    if isinstance(space, gymnasium.spaces.Box):
        return np.clip(array, space.low, space.high).astype(space.dtype, copy=False)
    return array


class RolloutCollector:
    """Steps `env_config.num_envs` env copies with a policy and returns `[T, N]` experience.

    The TensorDict keys and dtypes are those of `rlightning.policy.ppo` (`observation`, `action`, `log_prob`,
    `value`, `reward`, `terminated`, `truncated`, `next_value`); the policy's rollout result must hold
    `action`, `log_prob` and `value` (`[N]` each, `action` `[N, *A]`).

    Args:
        env_config (EnvConfig): `spec.env`.
        policy (BasePolicy): An initialised policy.
        seed (int): Seeds the env copies (copy i gets seed + i) on the first reset.
        device (str | torch.device, optional): Where the returned TensorDicts live. Defaults to "cpu".

    Attributes:
        recent_returns (collections.deque[float]): Returns of the last finished episodes, newest last.
        recent_lengths (collections.deque[int]): Their lengths in steps.
        episodes_finished (int): Episodes finished since construction.
        env_steps (int): Env steps taken since construction (all copies).
    """

    def __init__(
        self, env_config: EnvConfig, policy: BasePolicy, seed: int, device: str | torch.device = "cpu"
    ) -> None:
        self.policy = policy
        self.device = torch.device(device)
        self.num_envs = env_config.num_envs
        self.envs = gymnasium.vector.SyncVectorEnv(
            [functools.partial(make_env, env_config) for _ in range(self.num_envs)],
            autoreset_mode=gymnasium.vector.AutoresetMode.SAME_STEP,
        )
        self.action_space = self.envs.single_action_space
        self._obs, _ = self.envs.reset(seed=seed)
        self._episode_return = np.zeros(self.num_envs, dtype=np.float64)
        self._episode_length = np.zeros(self.num_envs, dtype=np.int64)
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=RECENT_EPISODES)
        self.episodes_finished = 0
        self.env_steps = 0

    def _value(self, obs: np.ndarray) -> torch.Tensor:
        # The mode is taken so bootstrapping draws no random numbers.
        observation = torch.as_tensor(obs, dtype=torch.float32)
        return self.policy.rollout({"observation": observation, "deterministic": True})["value"].float().cpu()

    def collect(self, num_steps: int) -> TensorDict:
        """Step every env copy `num_steps` times.

        Args:
            num_steps (int): T, steps per copy (>= 1).

        Returns:
            TensorDict: `[T, N]` experience on `device` (keys in the class docstring).
        """
        rows: dict[str, list[torch.Tensor]] = collections.defaultdict(list)
        final_values: dict[int, tuple[np.ndarray, torch.Tensor]] = {}
        for t in range(num_steps):
            observation = torch.as_tensor(self._obs, dtype=torch.float32)
            out = self.policy.rollout({"observation": observation, "deterministic": False})
            action = to_env_action(out["action"], self.action_space)
            next_obs, reward, terminated, truncated, info = self.envs.step(action)
            # Truncated copies are bootstrapped from their final observation (before the auto-reset).
            cut = np.flatnonzero(truncated & ~terminated)
            if cut.size:
                final = np.stack([info["final_obs"][i] for i in cut])
                final_values[t] = (cut, self._value(final))
            for key in ("action", "log_prob", "value"):
                rows[key].append(out[key].cpu())
            rows["observation"].append(observation)
            rows["reward"].append(torch.as_tensor(reward, dtype=torch.float32))
            rows["terminated"].append(torch.as_tensor(terminated, dtype=torch.bool))
            rows["truncated"].append(torch.as_tensor(truncated, dtype=torch.bool))
            self._track_episodes(reward, terminated | truncated)
            self._obs = next_obs
        stacked = {key: torch.stack(items) for key, items in rows.items()}
        data = TensorDict(stacked, batch_size=[num_steps, self.num_envs])
        next_value = torch.cat([data["value"][1:].float(), self._value(self._obs)[None]])
        next_value = next_value.masked_fill(data["terminated"] | data["truncated"], 0.0)
        for t, (cut, values) in final_values.items():
            next_value[t, torch.as_tensor(cut)] = values
        data["next_value"] = next_value
        self.env_steps += num_steps * self.num_envs
        return data.to(self.device)

    def _track_episodes(self, reward: np.ndarray, done: np.ndarray) -> None:
        self._episode_return += reward
        self._episode_length += 1
        for i in np.flatnonzero(done):
            self.recent_returns.append(float(self._episode_return[i]))
            self.recent_lengths.append(int(self._episode_length[i]))
            self.episodes_finished += 1
        self._episode_return[done] = 0.0
        self._episode_length[done] = 0

    def mean_recent_return(self) -> float:
        """Mean of `recent_returns`.

        Returns:
            float: The mean, or NaN before the first finished episode.
        """
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan

    def close(self) -> None:
        """Close the env copies."""
        self.envs.close()


def evaluate_episodes(
    policy: BasePolicy, env_config: EnvConfig, episodes: int, deterministic: bool = True, seed: int = 0
) -> list[float]:
    """Play whole episodes on one env copy, one after the other (no bias towards short episodes).

    Args:
        policy (BasePolicy): An initialised policy; its gated rollout path is used.
        env_config (EnvConfig): `spec.env`.
        episodes (int): Episodes to play (>= 1).
        deterministic (bool, optional): Take the mode of the action distribution. Defaults to True.
        seed (int, optional): Episode i resets with seed + i. Defaults to 0.

    Returns:
        list[float]: Undiscounted return of each episode, in order.
    """
    env = make_env(env_config)
    returns = []
    try:
        for episode in range(episodes):
            obs, _ = env.reset(seed=seed + episode)
            total, done = 0.0, False
            while not done:
                observation = torch.as_tensor(np.asarray(obs)[None], dtype=torch.float32)
                out = policy.rollout({"observation": observation, "deterministic": deterministic})
                obs, reward, terminated, truncated, _ = env.step(to_env_action(out["action"], env.action_space)[0])
                total += float(reward)
                done = terminated or truncated
            returns.append(total)
    finally:
        env.close()
    return returns
