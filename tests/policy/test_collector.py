"""The collector: same-step autoreset, truncation bootstrapping, episode tracking, evaluation episodes."""

from __future__ import annotations

import asyncio

import gymnasium
import numpy as np
import pytest
import torch
from policy_helpers import counter_env_config

from rlightning.config import PolicyConfig
from rlightning.policy import EnvMeta, PPOPolicy
from rlightning.runtime.collector import RolloutCollector, evaluate_episodes, to_env_action

torch.set_num_threads(1)


@pytest.fixture
def policy() -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [8]}), "train")
    policy.init_train(EnvMeta.from_env_config(counter_env_config()), seed=0)
    return policy


def _value(policy: PPOPolicy, count: float) -> float:
    with torch.no_grad():
        return float(policy.network.critic(torch.tensor([[count]])))


def test_collect_layout_and_truncation_bootstrap(policy: PPOPolicy) -> None:
    collector = RolloutCollector(counter_env_config(num_envs=2), policy, seed=0)
    rollouts_before = policy.timings.stats("rollout").count
    data = collector.collect(7)
    assert data.batch_size == torch.Size([7, 2])
    expected_dtypes = {"observation": torch.float32, "action": torch.int64, "log_prob": torch.float32,
                       "value": torch.float32, "reward": torch.float32, "terminated": torch.bool,
                       "truncated": torch.bool, "next_value": torch.float32}
    assert {key: data[key].dtype for key in expected_dtypes} == expected_dtypes
    assert data["observation"].shape == (7, 2, 1)
    # Counter env truncated after 3 steps: observations 0,1,2,0,1,2,0 (the auto-reset happens in the same step).
    assert data["observation"][:, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert data["truncated"][:, 0].tolist() == [False, False, True, False, False, True, False]
    assert not data["terminated"].any()
    next_value = data["next_value"][:, 0]
    # the final observation, not the reset one
    assert next_value[2].item() == pytest.approx(_value(policy, 3.0), abs=1e-6)
    assert next_value[5].item() == pytest.approx(_value(policy, 3.0), abs=1e-6)
    assert next_value[6].item() == pytest.approx(_value(policy, 1.0), abs=1e-6)  # after the last step
    assert torch.equal(next_value[[0, 1, 3, 4]], data["value"][[1, 2, 4, 5], 0])
    # every action went through the gated rollout path: 7 steps + 2 truncation bootstraps + 1 final value
    assert policy.timings.stats("rollout").count - rollouts_before == 10
    assert list(collector.recent_returns) == [3.0] * 4 and list(collector.recent_lengths) == [3] * 4
    assert collector.episodes_finished == 4 and collector.env_steps == 14
    collector.close()


def test_episodes_straddle_collect_calls(policy: PPOPolicy) -> None:
    collector = RolloutCollector(counter_env_config(num_envs=1), policy, seed=0)
    collector.collect(2)
    assert collector.episodes_finished == 0 and np.isnan(collector.mean_recent_return())
    collector.collect(2)
    assert list(collector.recent_returns) == [3.0] and collector.mean_recent_return() == 3.0
    collector.close()


def test_evaluate_episodes_plays_whole_episodes(policy: PPOPolicy) -> None:
    assert evaluate_episodes(policy, counter_env_config(), episodes=3) == [3.0, 3.0, 3.0]


def test_box_actions_are_clipped_for_the_env_only() -> None:
    space = gymnasium.spaces.Box(-2.0, 2.0, shape=(2,), dtype=np.float32)
    action = torch.tensor([[3.0, -0.5], [-9.0, 1.0]])
    env_action = to_env_action(action, space)
    assert env_action.tolist() == [[2.0, -0.5], [-2.0, 1.0]] and env_action.dtype == np.float32
    assert action[0, 0] == 3.0  # the policy's sample (and its log-prob) stay unclipped


@pytest.mark.timeout(30)
def test_async_rollouts_from_an_event_loop(policy: PPOPolicy) -> None:
    evaluator = PPOPolicy(PolicyConfig(device="cpu", rollout_mode="async", policy_kwargs={"hiddenSizes": [8]}), "eval")
    evaluator.init_eval(EnvMeta.from_env_config(counter_env_config()), seed=0)

    async def many() -> list:
        requests = [evaluator.rollout_async({"observation": torch.full((1, 1), float(i))}) for i in range(16)]
        return await asyncio.gather(*requests)

    try:
        results = asyncio.run(asyncio.wait_for(many(), 20))
        assert len(results) == 16 and all(result["action"].shape == (1,) for result in results)
        assert evaluator.get_num_requests() == 0 and evaluator.check_idle(timeout=1.0)
    finally:
        evaluator.close()
