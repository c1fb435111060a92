"""The collector: the policy's layout, same-step autoreset, next observations, episode tracking, evaluation."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
import pytest
import torch
from policy_helpers import counter_env_config
from tensordict import TensorDict
from torch import nn

from rlightning import weights
from rlightning.config import OptimConfig, PolicyConfig
from rlightning.policy import BasePolicy, EnvMeta, ExperienceField, PPOPolicy, check_batch
from rlightning.runtime.collector import (
    RECENT_EPISODES,
    EpisodeTally,
    FinishedEpisodes,
    RolloutCollector,
    evaluate_episodes,
    to_env_action,
)

torch.set_num_threads(1)


@pytest.fixture
def policy() -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [8]}), "train")
    policy.init_train(EnvMeta.from_env_config(counter_env_config()), seed=0)
    return policy


def test_collect_layout_and_next_observation_across_autoresets(policy: PPOPolicy) -> None:
    collector = RolloutCollector(counter_env_config(num_envs=2), policy, seed=0)
    rollouts_before = policy.timings.stats("rollout").count
    data = collector.collect(7)
    assert data.batch_size == torch.Size([7, 2])
    expected_dtypes = {"observation": torch.float32, "next_observation": torch.float32, "reward": torch.float32,
                       "terminated": torch.bool, "truncated": torch.bool, "action": torch.int64,
                       "log_prob": torch.float32}
    assert {key: value.dtype for key, value in data.items()} == expected_dtypes  # exactly these keys
    assert data["observation"].shape == data["next_observation"].shape == (7, 2, 1)
    # Counter env truncated after 3 steps: observations 0,1,2,0,1,2,0 (the auto-reset happens in the same step).
    assert data["observation"][:, 0, 0].tolist() == [0, 1, 2, 0, 1, 2, 0]
    assert data["truncated"][:, 0].tolist() == [False, False, True, False, False, True, False]
    assert not data["terminated"].any()
    # the final observation (3), not the reset one (0), where the episode was cut; the next one after the last step
    assert data["next_observation"][:, 0, 0].tolist() == [1, 2, 3, 1, 2, 3, 1]
    # one gated rollout per step and nothing else: the collector computes no values
    assert policy.timings.stats("rollout").count - rollouts_before == 7
    assert list(collector.recent_returns) == [3.0] * 4 and list(collector.recent_lengths) == [3] * 4
    assert collector.episodes_finished == 4 and collector.env_steps == 14
    collector.close()


class LogitsPolicy(BasePolicy):
    """Acts greedily on a linear layer's logits; keeps what `declared` says of its output (action, logits, scratch)."""

    def __init__(self, declared: dict[str, ExperienceField]) -> None:
        super().__init__(PolicyConfig(device="cpu"), "train")
        self.declared = declared

    def construct_network(self, env_meta: EnvMeta) -> None:
        self.linear = nn.Linear(1, 2)

    def setup_optimizer(self, optim_cfg: OptimConfig) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=optim_cfg.lr)

    def rollout_step(self, env_ret: Mapping[str, Any]) -> torch.Tensor:
        return self.linear(env_ret["observation"])

    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"action": policy_resp.argmax(-1), "logits": policy_resp, "scratch": torch.zeros(len(policy_resp))}

    def rollout_fields(self) -> dict[str, ExperienceField]:
        return dict(self.declared)

    def update_dataset(self, dataset: TensorDict) -> None:
        raise NotImplementedError  # the collector never trains

    def train(self) -> dict[str, float]:
        raise NotImplementedError

    def get_trainable_parameters(self) -> dict[str, dict[str, torch.Tensor]]:
        return {"linear": weights.named_state(self.linear)}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        weights.load_named_state(self, self.clean_state_dict(state_dict))


def _logits_policy(declared: dict[str, ExperienceField]) -> LogitsPolicy:
    policy = LogitsPolicy(declared)
    policy.init_train(EnvMeta.from_env_config(counter_env_config()), seed=0)
    return policy


def test_the_policy_declares_what_the_collector_keeps() -> None:
    policy = _logits_policy({"logits": ExperienceField((2,), torch.float32)})
    collector = RolloutCollector(counter_env_config(num_envs=2), policy, seed=0)
    data = collector.collect(4)
    assert set(data.keys()) == {"observation", "next_observation", "reward", "terminated", "truncated", "logits"}
    assert set(data.keys()) == set(collector.fields) == set(policy.experience_fields())
    assert check_batch(data, policy.experience_fields(), (4, 2)) is None
    with torch.no_grad():
        assert torch.allclose(data["logits"], policy.linear(data["observation"]))
    collector.close()


@pytest.mark.parametrize(
    ("declared", "message"),
    [
        ({"logits": ExperienceField((2,), torch.float64)}, r"'logits' has dtype torch.float32, expected torch.float64"),
        ({"logits": ExperienceField((), torch.float32)}, r"'logits' has shape \[3, 2, 2\], expected \[3, 2\]"),
        ({"value": ExperienceField((), torch.float32)}, r"missing keys \['value'\]"),
    ],
)
def test_rollout_outputs_that_break_the_declaration_are_rejected(
    declared: dict[str, ExperienceField], message: str
) -> None:
    collector = RolloutCollector(counter_env_config(num_envs=2), _logits_policy(declared), seed=0)
    with pytest.raises(ValueError, match=r"LogitsPolicy's rollout outputs do not match rollout_fields\(\): " + message):
        collector.collect(3)
    collector.close()


def test_a_policy_must_declare_its_rollout_fields_and_not_redeclare_env_keys() -> None:
    class Undeclared(LogitsPolicy):
        rollout_fields = BasePolicy.rollout_fields

    undeclared = Undeclared({})
    undeclared.init_train(EnvMeta.from_env_config(counter_env_config()), seed=0)
    with pytest.raises(NotImplementedError, match=r"Undeclared does not declare rollout_fields\(\)"):
        RolloutCollector(counter_env_config(), undeclared, seed=0)
    with pytest.raises(ValueError, match=r"redeclares env keys \['reward'\]"):
        _logits_policy({"reward": ExperienceField((), torch.float32)}).experience_fields()
    with pytest.raises(RuntimeError, match="not initialised"):
        LogitsPolicy({}).experience_fields()


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


def test_the_episodes_of_a_batch_are_those_finished_since_its_mark() -> None:
    tally = EpisodeTally()
    tally.record_episode(1.0, 10)
    mark = tally.episodes_finished
    assert tally.finished_since(mark) == FinishedEpisodes((), (), 0)
    for episode in range(RECENT_EPISODES + 5):
        tally.record_episode(float(episode), episode + 1)
    new = tally.finished_since(mark)
    assert new.count == RECENT_EPISODES + 5, "every episode is counted, also those no longer remembered"
    assert new.returns == tuple(float(e) for e in range(5, RECENT_EPISODES + 5)), "the newest, oldest first"
    assert new.lengths == tuple(e + 1 for e in range(5, RECENT_EPISODES + 5))
