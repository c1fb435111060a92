"""Rollout collection on a gymnasium vector env into `[T, N]` TensorDicts, and evaluation episodes.

Actions come from the policy's gated rollout path (`BasePolicy.rollout`), so a weight update never runs in
the middle of one. The batch layout is the policy's (`BasePolicy.experience_fields`): the env keys every
collector writes plus the rollout outputs the policy declares; the collector knows no algorithm's keys. The
vector env resets finished copies in the same step (gymnasium's `AutoresetMode.SAME_STEP`): the step returns the
new episode's first observation and the finished episode's last one in `info["final_obs"]`, which is what
`next_observation` holds for that step.

In async rollout mode an evaluator steps several shards of its env copies at once (`ShardedRolloutCollector`,
one thread per shard, `eval.rolloutWorkers`), each request going to the least-loaded policy replica through a
`RolloutRouter`; the shards' batches are joined along the env dimension, so the batch layout is the same.
"""

from __future__ import annotations

import collections
import concurrent.futures
import dataclasses
import functools
import math
from collections.abc import Sequence

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict

from rlightning.config import EnvConfig, PolicyGroupSpec
from rlightning.policy import BasePolicy, RolloutRouter, check_batch, make_env

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


@dataclasses.dataclass(frozen=True)
class FinishedEpisodes:
    """The episodes that finished since a mark of an `EpisodeTally` (`EpisodeTally.finished_since`).

    Attributes:
        returns (tuple[float, ...]): Their undiscounted returns, oldest first: those the tally still remembers
            (at most `RECENT_EPISODES`).
        lengths (tuple[int, ...]): Their lengths in env steps, in the same order.
        count (int): How many finished, also those beyond what the tally remembers (`>= len(returns)`).
    """

    returns: tuple[float, ...]
    lengths: tuple[int, ...]
    count: int


class EpisodeTally:
    """Returns and lengths of the last `RECENT_EPISODES` finished episodes (newest last), and how many finished.

    Attributes:
        recent_returns (collections.deque[float]): Returns of the last finished episodes, newest last.
        recent_lengths (collections.deque[int]): Their lengths in steps.
        episodes_finished (int): Episodes finished since construction.
    """

    def __init__(self) -> None:
        self.recent_returns: collections.deque[float] = collections.deque(maxlen=RECENT_EPISODES)
        self.recent_lengths: collections.deque[int] = collections.deque(maxlen=RECENT_EPISODES)
        self.episodes_finished = 0

    def record_episode(self, episode_return: float, length: int) -> None:
        """Count one finished episode.

        Args:
            episode_return (float): Its undiscounted return.
            length (int): Its length in env steps.
        """
        self.recent_returns.append(episode_return)
        self.recent_lengths.append(length)
        self.episodes_finished += 1

    def finished_since(self, mark: int) -> FinishedEpisodes:
        """The episodes that finished since `episodes_finished` was `mark` (a batch's, when read before it).

        Args:
            mark (int): An earlier value of `episodes_finished`.

        Returns:
            FinishedEpisodes: Their returns and lengths (the newest `RECENT_EPISODES` of them) and their count.
        """
        count = self.episodes_finished - mark
        new = min(count, len(self.recent_returns))
        returns, lengths = list(self.recent_returns), list(self.recent_lengths)
        return FinishedEpisodes(tuple(returns[len(returns) - new :]), tuple(lengths[len(lengths) - new :]), count)

    def mean_recent_return(self) -> float:
        """Mean of `recent_returns`.

        Returns:
            float: The mean, or NaN before the first finished episode.
        """
        return float(np.mean(self.recent_returns)) if self.recent_returns else math.nan


class RolloutCollector(EpisodeTally):
    """Steps `env_config.num_envs` env copies with a policy and returns `[T, N]` experience.

    The TensorDict has exactly the keys of `policy.experience_fields()`: `observation`, `next_observation`,
    `reward`, `terminated`, `truncated` (see `rlightning.policy.env_fields`) and the policy's `rollout_fields()`,
    taken from each rollout output (a mapping of `[N, ...]` tensors whose `action` `[N, *A]` goes to the env).

    Args:
        env_config (EnvConfig): `spec.env`.
        policy (BasePolicy): An initialised policy that declares `rollout_fields`.
        seed (int): Seeds the env copies (copy i gets seed + i) on the first reset.
        device (str | torch.device, optional): Where the returned TensorDicts live. Defaults to "cpu".
        router (RolloutRouter | None, optional): Send each request through it (to the least-loaded of its
            replicas, of `policy`'s class) instead of to `policy`. Defaults to None.

    Raises:
        NotImplementedError: When the policy does not declare `rollout_fields`.
        RuntimeError: When the policy is not initialised.
        ValueError: When the policy's `rollout_fields()` redeclares an env key.

    Attributes:
        fields (dict[str, ExperienceField]): The layout of every batch, `policy.experience_fields()`.
        recent_returns (collections.deque[float]): Returns of the last finished episodes, newest last.
        recent_lengths (collections.deque[int]): Their lengths in steps.
        episodes_finished (int): Episodes finished since construction.
        env_steps (int): Env steps taken since construction (all copies).
    """

    def __init__(
        self,
        env_config: EnvConfig,
        policy: BasePolicy,
        seed: int,
        device: str | torch.device = "cpu",
        router: RolloutRouter | None = None,
    ) -> None:
        self.policy = policy
        self._act = policy.rollout if router is None else router.rollout
        self.fields = policy.experience_fields()
        self._rollout_keys = list(policy.rollout_fields())
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
        super().__init__()
        self.env_steps = 0

    def collect(self, num_steps: int) -> TensorDict:
        """Step every env copy `num_steps` times.

        Args:
            num_steps (int): T, steps per copy (>= 1).

        Returns:
            TensorDict: `[T, N]` experience on `device` with the keys, per-step shapes and dtypes of `fields`.

        Raises:
            ValueError: When the policy's rollout outputs do not match its `rollout_fields()`.
        """
        rows: dict[str, list[torch.Tensor]] = collections.defaultdict(list)
        for _ in range(num_steps):
            observation = torch.as_tensor(self._obs, dtype=torch.float32)
            out = self._act({"observation": observation, "deterministic": False})
            action = to_env_action(out["action"], self.action_space)
            next_obs, reward, terminated, truncated, info = self.envs.step(action)
            done = terminated | truncated
            # A copy (not a view of next_obs): finished copies get their final observation, not the reset one.
            next_observation = torch.tensor(next_obs, dtype=torch.float32)
            for i in np.flatnonzero(done):
                next_observation[i] = torch.as_tensor(info["final_obs"][i], dtype=torch.float32)
            for key in self._rollout_keys:
                value = out.get(key, None)
                if value is not None:  # a missing key is reported by the layout check below
                    rows[key].append(value.cpu())
            rows["observation"].append(observation)
            rows["next_observation"].append(next_observation)
            rows["reward"].append(torch.as_tensor(reward, dtype=torch.float32))
            rows["terminated"].append(torch.as_tensor(terminated, dtype=torch.bool))
            rows["truncated"].append(torch.as_tensor(truncated, dtype=torch.bool))
            self._track_episodes(reward, done)
            self._obs = next_obs
        stacked = {key: torch.stack(items) for key, items in rows.items()}
        data = TensorDict(stacked, batch_size=[num_steps, self.num_envs])
        reason = check_batch(data, self.fields, (num_steps, self.num_envs))
        if reason is not None:
            raise ValueError(f"{type(self.policy).__name__}'s rollout outputs do not match rollout_fields(): {reason}")
        self.env_steps += num_steps * self.num_envs
        return data.to(self.device)

    def _track_episodes(self, reward: np.ndarray, done: np.ndarray) -> None:
        self._episode_return += reward
        self._episode_length += 1
        for i in np.flatnonzero(done):
            self.record_episode(float(self._episode_return[i]), int(self._episode_length[i]))
        self._episode_return[done] = 0.0
        self._episode_length[done] = 0

    def close(self) -> None:
        """Close the env copies."""
        self.envs.close()


class ShardedRolloutCollector(EpisodeTally):
    """Steps `env_config.num_envs` env copies as `workers` shards at once, one thread each, into one `[T, N]` batch.

    Shard k is a `RolloutCollector` of consecutive copies (sizes differ by at most one) whose requests go through
    `router`; a weight update still never overlaps a forward pass (each replica's gate), and with the env's step
    time spent outside the GIL (a simulator, a remote env) the shards overlap. Copy i is seeded with seed + i, as
    in one `RolloutCollector`; which sample a copy draws depends on the order the threads reach the policy.

    Args:
        env_config (EnvConfig): `spec.env`.
        router (RolloutRouter): The policy replicas; the batch layout is the first replica's.
        workers (int): Shards, at most `env_config.num_envs`.
        seed (int): Seeds the env copies (copy i gets seed + i) on the first reset.
        device (str | torch.device, optional): Where the returned TensorDicts live. Defaults to "cpu".

    Raises:
        ValueError: When `workers` is not within 1..`env_config.num_envs`.

    Attributes:
        fields (dict[str, ExperienceField]): The layout of every batch.
        recent_returns (collections.deque[float]): Returns of the last finished episodes of all shards, newest last.
        recent_lengths (collections.deque[int]): Their lengths in steps.
        episodes_finished (int): Episodes finished since construction.
        env_steps (int): Env steps taken since construction (all copies).
    """

    def __init__(
        self,
        env_config: EnvConfig,
        router: RolloutRouter,
        workers: int,
        seed: int,
        device: str | torch.device = "cpu",
    ) -> None:
        if not 1 <= workers <= env_config.num_envs:
            raise ValueError(f"workers must be within 1..{env_config.num_envs} (env.numEnvs), got {workers}")
        self.num_envs = env_config.num_envs
        sizes = [len(part) for part in np.array_split(np.arange(self.num_envs), workers)]
        starts = np.cumsum([0, *sizes[:-1]])
        self.shards: list[RolloutCollector] = []
        try:
            for start, size in zip(starts, sizes, strict=True):
                shard_config = env_config.model_copy(update={"num_envs": size})
                self.shards.append(
                    RolloutCollector(shard_config, router.replicas[0], seed + int(start), device, router=router)
                )
        except BaseException:
            for shard in self.shards:
                shard.close()
            raise
        self.fields = self.shards[0].fields
        self._pool = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="rollout-worker")
        super().__init__()
        self.env_steps = 0

    def collect(self, num_steps: int) -> TensorDict:
        """Step every shard `num_steps` times, concurrently, and join their batches along the env dimension.

        Args:
            num_steps (int): T, steps per copy (>= 1).

        Returns:
            TensorDict: `[T, N]` experience, copies in order, with the layout of `fields`.

        Raises:
            ValueError: When the policy's rollout outputs do not match its `rollout_fields()` (from any shard,
                after all shards finished).
        """
        finished = [shard.episodes_finished for shard in self.shards]
        futures = [self._pool.submit(shard.collect, num_steps) for shard in self.shards]
        concurrent.futures.wait(futures)  # every shard is done before any error is raised: none steps on alone
        batches = [future.result() for future in futures]
        for shard, mark in zip(self.shards, finished, strict=True):
            new = shard.finished_since(mark)
            for episode_return, length in zip(new.returns, new.lengths, strict=True):
                self.record_episode(episode_return, length)
            self.episodes_finished += new.count - len(new.returns)  # beyond what the shard remembers
        self.env_steps += num_steps * self.num_envs
        return TensorDict.cat(batches, dim=1)

    def close(self) -> None:
        """Stop the worker threads (after the batch in progress) and close the env copies."""
        self._pool.shutdown(wait=True)
        for shard in self.shards:
            shard.close()


def fleet_collector(
    spec: PolicyGroupSpec, replicas: Sequence[BasePolicy], seed: int
) -> RolloutCollector | ShardedRolloutCollector:
    """The collector of an evaluator that produces training data: `eval.rolloutWorkers` shards whose requests
    a `RolloutRouter` sends to the least-loaded of `replicas`.

    Args:
        spec (PolicyGroupSpec): The validated spec (`PolicyGroupSpec.eval_rollout_workers`).
        replicas (Sequence[BasePolicy]): The evaluator's initialised policy replicas.
        seed (int): Seeds the env copies (copy i gets seed + i).

    Returns:
        RolloutCollector | ShardedRolloutCollector: One collector stepping every copy in turn (one worker), else
            the copies in that many concurrent shards.
    """
    router = RolloutRouter(replicas)
    workers = spec.eval_rollout_workers()
    if workers == 1:
        return RolloutCollector(spec.env, router.replicas[0], seed, router=router)
    return ShardedRolloutCollector(spec.env, router, workers, seed)


def evaluate_episodes(
    policy: BasePolicy, env_config: EnvConfig, episodes: int, deterministic: bool = True, seed: int = 0
) -> list[float]:
    """Play whole episodes, each on its own env copy, the copies stepped together (one forward pass a step for all
    still playing; no bias towards short episodes, as each copy plays exactly one).

    Args:
        policy (BasePolicy): An initialised policy; its gated rollout path is used.
        env_config (EnvConfig): `spec.env`.
        episodes (int): Episodes to play (>= 1).
        deterministic (bool, optional): Take the mode of the action distribution. Defaults to True.
        seed (int, optional): Episode i resets with seed + i. Defaults to 0.

    Returns:
        list[float]: Undiscounted return of each episode, in order.
    """
    envs = [make_env(env_config) for _ in range(episodes)]
    try:
        observations = [env.reset(seed=seed + i)[0] for i, env in enumerate(envs)]
        returns = [0.0] * episodes
        playing = list(range(episodes))
        while playing:
            batch = torch.as_tensor(np.stack([np.asarray(observations[i]) for i in playing]), dtype=torch.float32)
            actions = to_env_action(policy.rollout({"observation": batch, "deterministic": deterministic})["action"],
                                    envs[0].action_space)  # fmt: skip
            still = []
            for i, action in zip(playing, actions, strict=True):
                observations[i], reward, terminated, truncated, _ = envs[i].step(action)
                returns[i] += float(reward)
                if not (terminated or truncated):
                    still.append(i)
            playing = still
    finally:
        for env in envs:
            env.close()
    return returns
