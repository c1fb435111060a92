"""Async rollout mode's collector: env shards stepped at once by threads, joined into the usual `[T, N]` batch."""

from __future__ import annotations

import threading

import gymnasium
import pytest
import torch
from policy_helpers import COUNTER_ENV_ID, CounterEnv

from rlightning.config import EnvConfig, PolicyConfig, PolicyGroupSpec
from rlightning.policy import EnvMeta, PPOPolicy, RolloutRouter
from rlightning.runtime.collector import RolloutCollector, ShardedRolloutCollector, fleet_collector

torch.set_num_threads(1)

RENDEZVOUS_ENV_ID = "RlightningTestRendezvous-v0"
RENDEZVOUS = threading.Barrier(2)
"""Every step of the rendezvous env waits here for a step of another copy: only shards stepped at once pass."""


class RendezvousEnv(CounterEnv):
    """The counter env whose steps each wait (at most 10 s) for a step of another copy on another thread."""

    def step(self, action):
        RENDEZVOUS.wait(timeout=10.0)
        return super().step(action)


if RENDEZVOUS_ENV_ID not in gymnasium.envs.registry:
    gymnasium.register(RENDEZVOUS_ENV_ID, entry_point=RendezvousEnv, max_episode_steps=3)


def _async_policy(env_id: str = COUNTER_ENV_ID) -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", rollout_mode="async", policy_kwargs={"hiddenSizes": [8]}), "eval")
    policy.init_eval(EnvMeta.from_env_config(EnvConfig(id=env_id)), seed=0)
    return policy


@pytest.mark.timeout(60)
def test_shards_step_at_once_and_join_into_the_layout_of_one_collector() -> None:
    policy = _async_policy()
    RENDEZVOUS.reset()
    collector = ShardedRolloutCollector(EnvConfig(id=RENDEZVOUS_ENV_ID, num_envs=4), RolloutRouter([policy]), 2, 0)
    try:
        data = collector.collect(7)  # a shard stepped alone would break the rendezvous
    finally:
        collector.close()
        policy.close()
    assert [shard.num_envs for shard in collector.shards] == [2, 2]
    assert data.batch_size == torch.Size([7, 4]) and set(data.keys()) == set(policy.experience_fields())
    assert data["action"].dtype == torch.int64 and data["log_prob"].shape == (7, 4)
    # Every copy counts its steps and is truncated after 3, in every shard.
    assert (data["observation"][:, :, 0] == torch.tensor([0, 1, 2, 0, 1, 2, 0.0])[:, None]).all()
    assert (data["next_observation"][:, :, 0] == torch.tensor([1, 2, 3, 1, 2, 3, 1.0])[:, None]).all()
    assert list(collector.recent_returns) == [3.0] * 8 and list(collector.recent_lengths) == [3] * 8
    assert collector.episodes_finished == 8 and collector.env_steps == 28 and collector.mean_recent_return() == 3.0
    assert policy.timings.stats("rollout").count == 14  # one request per shard and step


def test_uneven_shards_cover_every_copy_once_with_its_seed() -> None:
    policy = _async_policy("CartPole-v1")
    config = EnvConfig(id="CartPole-v1", num_envs=5)
    sharded = ShardedRolloutCollector(config, RolloutRouter([policy]), 2, seed=7)
    single = RolloutCollector(config, policy, seed=7)
    try:
        assert [shard.num_envs for shard in sharded.shards] == [3, 2]
        first = sharded.collect(1)["observation"][0]
        assert torch.equal(first, single.collect(1)["observation"][0])  # copy i reset with seed + i in both
        with pytest.raises(ValueError, match=r"workers must be within 1..5 \(env.numEnvs\), got 6"):
            ShardedRolloutCollector(config, RolloutRouter([policy]), 6, seed=0)
    finally:
        sharded.close()
        single.close()
        policy.close()


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [("sync", None, None), ("async", None, [1, 1, 1]), ("async", 2, [2, 1]), ("async", 1, None)],
)
def test_the_evaluators_collector_follows_the_rollout_mode(
    mode: str, workers: int | None, expected: list[int] | None
) -> None:
    spec = PolicyGroupSpec.model_validate(
        {
            "env": {"id": COUNTER_ENV_ID, "numEnvs": 3},
            "policy": {"rolloutMode": mode, "policyKwargs": {"hiddenSizes": [8]}},
            "eval": {"rolloutWorkers": workers},
        }
    )
    policy = _async_policy()
    collector = fleet_collector(spec, [policy], seed=0)
    try:
        if expected is None:
            assert isinstance(collector, RolloutCollector) and collector.num_envs == 3
        else:
            assert isinstance(collector, ShardedRolloutCollector)
            assert [shard.num_envs for shard in collector.shards] == expected
        assert collector.collect(2).batch_size == torch.Size([2, 3])
        assert collector.env_steps == 6
    finally:
        collector.close()
        policy.close()
