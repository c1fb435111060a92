"""PPO: its kwargs model, GAE, Discrete and Box action spaces, and learning CartPole."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError
from tensordict import TensorDict

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig, format_validation_error
from rlightning.policy import EnvMeta, ExperienceField, PPOKwargs, PPOPolicy
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
        assert first.batch_size == torch.Size([5]) and first["log_prob"].shape == (5,)
        assert set(first.keys()) == set(policy.rollout_fields()) == {"action", "log_prob"}
        assert policy.rollout_fields()["action"] == ExperienceField((), torch.int64)
    finally:
        policy.close()


@pytest.mark.timeout(60)
def test_pendulum_update_trains_the_log_std_and_fingerprints_it() -> None:
    env = EnvConfig(id="Pendulum-v1", num_envs=2)
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16], "entropyCoef": 0.01}), "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=1000), seed=0)
    assert [name for name, _ in policy.model_list] == ["agent"]
    assert policy.rollout_fields() == {
        "action": ExperienceField((1,), torch.float32), "log_prob": ExperienceField((), torch.float32)
    }
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


@pytest.mark.timeout(60)
@pytest.mark.parametrize("anneal", [True, False])
def test_clip_coef_anneals_linearly_over_the_run_only_when_asked(anneal: bool) -> None:
    env = EnvConfig(id="CartPole-v1", num_envs=2)
    kwargs = {"hiddenSizes": [8], "clipCoef": 0.2, "annealClipCoef": anneal, "updateEpochs": 2}
    optim = {"lr": 0.01, "annealLr": False}  # a learning rate annealed to 0 as well would leave the ratios at 1
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs=kwargs, optim=optim), "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=256), seed=0)
    collector = RolloutCollector(env, policy, seed=0)
    clips = []
    for _ in range(3):  # 128 env steps an update: half the run, then all of it
        policy.update_dataset(collector.collect(64))
        metrics = policy.train()
        clips.append(metrics["clip_coef"])
    assert clips == ([0.2, 0.1, 0.0] if anneal else [0.2, 0.2, 0.2])
    # the last update's ratios move off 1 after its first step: at a range of 0 nearly all count as clipped
    assert (metrics["clip_fraction"] > 0.5) == anneal
    collector.close()


def _cartpole_policy(seed: int = 0) -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [8]}), "train")
    policy.init_train(EnvMeta.from_env_config(EnvConfig(id="CartPole-v1")), seed=seed)
    return policy


def _zeros_batch(policy: PPOPolicy, steps: int = 3, envs: int = 2) -> TensorDict:
    fields = policy.experience_fields()
    return TensorDict(
        {key: torch.zeros(steps, envs, *field.shape, dtype=field.dtype) for key, field in fields.items()},
        batch_size=[steps, envs],
    )


def test_update_dataset_checks_the_layout_and_ignores_extra_keys() -> None:
    policy = _cartpole_policy()
    assert set(policy.experience_fields()) == {
        "observation", "next_observation", "reward", "terminated", "truncated", "action", "log_prob"
    }  # no value estimates: PPO makes them in train
    with pytest.raises(ValueError, match=r"PPO dataset: missing keys \['next_observation'\]"):
        policy.update_dataset(_zeros_batch(policy).exclude("next_observation"))
    wrong = _zeros_batch(policy)
    wrong["action"] = wrong["action"].float()
    with pytest.raises(ValueError, match=r"PPO dataset: 'action' has dtype torch.float32, expected torch.int64"):
        policy.update_dataset(wrong)
    with pytest.raises(ValueError, match=r"PPO dataset: batch_size \[6\] is not \[T, N\]"):
        policy.update_dataset(_zeros_batch(policy).reshape(-1))
    extra = _zeros_batch(policy)
    extra["weight_version"] = torch.ones(3, 2, dtype=torch.int64)
    policy.update_dataset(extra)
    policy.train()
    assert policy.iteration == 1
    assert set(extra.keys()) == {*policy.experience_fields(), "weight_version"}  # the caller's batch is untouched


def _update_digests(batch: TensorDict) -> dict[str, str]:
    policy = _cartpole_policy(seed=0)
    torch.manual_seed(1)  # same minibatch order for every call
    policy.update_dataset(batch.clone())
    policy.train()
    return policy.get_param_digests()


def test_train_bootstraps_truncation_from_next_observation_and_never_termination() -> None:
    # One env, 3 steps: terminated at t=0, truncated at t=1. Only the truncated step's next state counts.
    gen = torch.Generator().manual_seed(0)
    batch = TensorDict(
        {
            "observation": torch.randn(3, 1, 4, generator=gen),
            "next_observation": torch.randn(3, 1, 4, generator=gen),
            "reward": torch.ones(3, 1),
            "terminated": torch.tensor([[True], [False], [False]]),
            "truncated": torch.tensor([[False], [True], [False]]),
            "action": torch.tensor([[0], [1], [0]]),
            "log_prob": torch.full((3, 1), math.log(0.5)),
        },
        batch_size=[3, 1],
    )
    baseline = _update_digests(batch)
    after_terminal = batch.clone()
    after_terminal["next_observation"][0] = 5.0
    assert _update_digests(after_terminal) == baseline
    after_cut = batch.clone()
    after_cut["next_observation"][1] = 5.0
    assert _update_digests(after_cut) != baseline


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


def _pendulum_ppo(role: str = "train", **kwargs) -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16], **kwargs}), role)
    meta = EnvMeta.from_env_config(EnvConfig(id="Pendulum-v1"))
    if role == "train":
        policy.init_train(meta, seed=0)
    else:
        policy.init_eval(meta, seed=1)
    return policy


def test_observation_statistics_are_learned_after_the_update_synced_and_checkpointed(tmp_path) -> None:
    from rlightning.policy import PolicyGroup

    assert not any("obs_norm" in name for name in _pendulum_ppo().get_param_digests())  # off by default
    trainer = _pendulum_ppo(normalizeObservations=True, updateEpochs=1, numMinibatches=1)
    collector = RolloutCollector(EnvConfig(id="Pendulum-v1", num_envs=4), trainer, seed=0)
    norm = trainer.network.obs_norm
    seen = []
    for _ in range(2):
        batch = collector.collect(64)
        seen.append(batch["observation"].reshape(-1, 3).double())
        trainer.update_dataset(batch)
        metrics = trainer.train()
        # One minibatch of one epoch: the ratio is exactly 1 only if the batch is scored with the statistics that
        # collected it, so the statistics must move after the epochs, not before.
        assert metrics["approx_kl"] == pytest.approx(0.0, abs=1e-6)
    observations = torch.cat(seen)
    assert float(norm.count) == pytest.approx(512, abs=1e-3)
    assert torch.allclose(norm.mean, observations.mean(0), atol=1e-6)
    assert torch.allclose(norm.var, observations.var(0, unbiased=False), rtol=1e-4)
    evaluator = _pendulum_ppo("eval", normalizeObservations=True)
    try:
        group = PolicyGroup(trainer, [evaluator])
        group.sync_weights()
        assert group.wait_for_eval_weights(timeout=10.0) and group.verify_eval_weight_consistency()
        assert torch.equal(evaluator.network.obs_norm.mean, norm.mean)  # the evaluator normalises alike
        obs = torch.tensor([[1.0, 0.0, 6.0]])
        assert torch.equal(
            evaluator.rollout({"observation": obs, "deterministic": True})["action"],
            trainer.rollout({"observation": obs, "deterministic": True})["action"],
        )
    finally:
        evaluator.close()
    path = trainer.save_checkpoint(tmp_path / "ppo.pt")
    resumed = _pendulum_ppo(normalizeObservations=True)
    resumed.load_checkpoint(path)
    restored = resumed.network.obs_norm
    assert torch.equal(restored.var, norm.var) and torch.equal(restored.count, norm.count)


def test_target_kl_stops_the_epochs_early() -> None:
    results = {}
    for target in (None, 1e-9):
        policy = _pendulum_ppo(updateEpochs=5, numMinibatches=2, targetKl=target)
        policy.update_dataset(RolloutCollector(EnvConfig(id="Pendulum-v1", num_envs=2), policy, seed=0).collect(32))
        results[target] = policy.train()["epochs"]
    assert results == {None: 5.0, 1e-9: 1.0}
    with pytest.raises(ValidationError):
        PPOKwargs.model_validate({"targetKl": 0})
