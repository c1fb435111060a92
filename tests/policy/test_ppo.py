"""PPO: its kwargs model, GAE, Discrete and Box action spaces, and learning CartPole."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from tensordict import TensorDict

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig, format_validation_error
from rlightning.policy import EnvMeta, PPOKwargs, PPOPolicy
from rlightning.policy.ppo import compute_gae
from rlightning.runtime.collector import RolloutCollector, evaluate_episodes

torch.set_num_threads(1)


def test_kwargs_use_camel_case_and_reject_unknown_or_out_of_range_fields() -> None:
    kwargs = PPOKwargs.model_validate(
        {"hiddenSizes": [32], "clipCoef": 0.1, "gaeLambda": 0.9, "updateEpochs": 3, "numMinibatches": 2,
         "entropyCoef": 0.0, "valueCoef": 1.0, "normalizeAdvantages": False, "clipValueLoss": False, "gamma": 0.9}
    )
    assert (kwargs.hidden_sizes, kwargs.clip_coef, kwargs.gae_lambda, kwargs.clip_value_loss) == ([32], 0.1, 0.9, False)
    assert PPOPolicy.kwargs_model is PPOKwargs
    with pytest.raises(ValidationError) as info:
        PPOKwargs.model_validate({"hiddenSize": [8], "gamma": 1.5, "clipCoef": 0, "hiddenSizes": [0]})
    assert sorted(format_validation_error(info.value, prefix="spec.policy.policyKwargs")) == [
        "spec.policy.policyKwargs.clipCoef: Input should be greater than 0",
        "spec.policy.policyKwargs.gamma: Input should be less than or equal to 1",
        "spec.policy.policyKwargs.hiddenSize: unknown field",
        "spec.policy.policyKwargs.hiddenSizes[0]: Input should be greater than 0",
    ]


def test_example_manifest_kwargs_are_valid() -> None:
    from pathlib import Path

    from rlightning.config import load_manifest

    manifest = load_manifest(Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml")
    PPOKwargs.model_validate(manifest.spec.policy.policy_kwargs)


def test_gae_bootstraps_truncation_from_the_final_value_and_not_termination() -> None:
    # One env, 4 steps: truncated at t=1 (bootstrap next_value 10), terminated at t=3.
    data = TensorDict(
        {
            "reward": torch.tensor([[1.0], [1.0], [1.0], [1.0]]),
            "value": torch.tensor([[0.5], [0.5], [0.5], [0.5]]),
            "next_value": torch.tensor([[0.5], [10.0], [0.5], [7.0]]),
            "terminated": torch.tensor([[False], [False], [False], [True]]),
            "truncated": torch.tensor([[False], [True], [False], [False]]),
        },
        batch_size=[4, 1],
    )
    gamma, lam = 0.9, 0.8
    advantages, returns = compute_gae(data, gamma, lam)
    d3 = 1.0 - 0.5  # terminal: no bootstrap
    d2 = 1.0 + gamma * 0.5 - 0.5
    d1 = 1.0 + gamma * 10.0 - 0.5  # truncated: bootstrap from the final observation's value, stop the trace
    d0 = 1.0 + gamma * 0.5 - 0.5
    expected = [d0 + gamma * lam * d1, d1, d2 + gamma * lam * d3, d3]
    assert advantages[:, 0].tolist() == pytest.approx(expected)
    assert torch.allclose(returns, advantages + 0.5)


def test_deterministic_discrete_rollouts_take_the_mode_and_draw_no_random_numbers() -> None:
    env = EnvConfig(id="CartPole-v1")
    policy = PPOPolicy(PolicyConfig(device="cpu"), "eval")
    policy.init_eval(EnvMeta.from_env_config(env), seed=0)
    try:
        observation = torch.randn(5, 4)
        state = torch.get_rng_state()
        first = policy.rollout({"observation": observation, "deterministic": True})
        second = policy.rollout({"observation": observation, "deterministic": True})
        assert torch.equal(torch.get_rng_state(), state)
        assert torch.equal(first["action"], second["action"]) and first["action"].dtype == torch.int64
        assert first.batch_size == torch.Size([5]) and first["log_prob"].shape == (5,) and first["value"].shape == (5,)
    finally:
        policy.close()


@pytest.mark.timeout(60)
def test_pendulum_update_trains_the_log_std_and_fingerprints_it() -> None:
    env = EnvConfig(id="Pendulum-v1", num_envs=2)
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16], "entropyCoef": 0.01}), "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=1000), seed=0)
    assert [name for name, _ in policy.model_list] == ["agent"]
    collector = RolloutCollector(env, policy, seed=0)
    batch = collector.collect(64)
    assert batch["action"].shape == (64, 2, 1) and batch["action"].dtype == torch.float32
    before = policy.get_param_fingerprint()
    assert "agent.log_std" in before
    policy.update_dataset(batch)
    metrics = policy.train()
    assert all(math.isfinite(value) for value in metrics.values())
    assert policy.get_param_fingerprint()["agent.log_std"] != before["agent.log_std"]
    assert metrics["lr"] == pytest.approx(policy.config.optim.lr)  # first update: no annealing yet
    assert policy.current_lr() == pytest.approx(policy.config.optim.lr * (1 - 128 / 1000))
    collector.close()


def test_update_dataset_names_missing_keys() -> None:
    policy = PPOPolicy(PolicyConfig(device="cpu"), "train")
    policy.init_train(EnvMeta.from_env_config(EnvConfig(id="CartPole-v1")), seed=0)
    with pytest.raises(ValueError, match=r"missing \['next_value'\]"):
        keys = ("observation", "action", "log_prob", "value", "reward", "terminated", "truncated")
        policy.update_dataset(TensorDict({k: torch.zeros(2, 2) for k in keys}, batch_size=[2, 2]))


@pytest.mark.slow
@pytest.mark.timeout(120)
def test_ppo_learns_cartpole() -> None:
    env = EnvConfig(id="CartPole-v1", num_envs=8)
    steps, rollout = 50_000, 128
    policy = PPOPolicy(PolicyConfig(device="cpu"), "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=steps), seed=0)
    before = float(np.mean(evaluate_episodes(policy, env, episodes=5, seed=1000)))
    collector = RolloutCollector(env, policy, seed=0)
    early = None
    while policy.env_steps < steps:
        policy.update_dataset(collector.collect(rollout))
        policy.train()
        if early is None and len(collector.recent_returns) >= 20:
            early = collector.mean_recent_return()
    late = collector.mean_recent_return()
    after = float(np.mean(evaluate_episodes(policy, env, episodes=5, seed=1000)))
    collector.close()
    print(f"CartPole returns: eval before {before:.1f}, early {early:.1f}, late {late:.1f}, eval after {after:.1f}")
    assert late > 2 * early and late > 100  # training returns rise clearly (seeds 0-3 give 150-190 from ~20)
    assert after > 150  # greedy evaluation (seeds 0-3 give 380-440; a random greedy policy can reach ~380)
