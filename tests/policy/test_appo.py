"""APPO: its kwargs, the lag declaration the runtime reads, PPO on on-policy data, importance weights on lagged data,
and learning CartPole from batches acted with weights two updates old."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig, format_validation_error
from rlightning.policy import APPOKwargs, APPOPolicy, EnvMeta, PPOKwargs, PPOPolicy
from rlightning.runtime.collector import RolloutCollector, evaluate_episodes

torch.set_num_threads(1)
CARTPOLE = EnvConfig(id="CartPole-v1", num_envs=4)


def test_kwargs_extend_ppos_with_the_truncation_levels_and_check_their_order() -> None:
    kwargs = APPOKwargs.model_validate({"rhoBar": 2.0, "cBar": 0.5, "clipCoef": 0.1})
    assert (kwargs.rho_bar, kwargs.c_bar, kwargs.clip_coef) == (2.0, 0.5, 0.1)
    assert (APPOKwargs().rho_bar, APPOKwargs().c_bar, APPOKwargs().gae_lambda) == (1.0, 1.0, 1.0)  # IMPALA's
    assert APPOPolicy.kwargs_model is APPOKwargs
    with pytest.raises(ValidationError) as info:
        APPOKwargs.model_validate({"rhoBar": 0.5, "cBar": 1.0})
    assert format_validation_error(info.value, prefix="spec.policy.policyKwargs") == [
        "spec.policy.policyKwargs.rhoBar: must be >= cBar (1.0), as IMPALA assumes, got 0.5"
    ]
    with pytest.raises(ValidationError, match="rhoBar"):  # PPO's own model knows no V-trace
        PPOKwargs.model_validate({"rhoBar": 1.0})


def test_only_a_correcting_policy_declares_it() -> None:
    assert APPOPolicy.corrects_policy_lag is True
    assert PPOPolicy.corrects_policy_lag is False


def _policy(cls: type[PPOPolicy], seed: int = 0, **kwargs: object) -> PPOPolicy:
    policy = cls(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16], **kwargs}), "train")
    policy.init_train(EnvMeta.from_env_config(CARTPOLE), seed=seed)
    return policy


def test_on_on_policy_data_an_update_is_ppos_with_gae_lambda_one() -> None:
    """rho = 1: V-trace's targets are the GAE(1) returns and its advantages GAE(1)'s (IMPALA's q_s - V(x_s) differs
    from GAE's advantage for lambda < 1, tests/policy/test_vtrace.py)."""
    appo, ppo = _policy(APPOPolicy, gaeLambda=1.0), _policy(PPOPolicy, gaeLambda=1.0)
    assert torch.equal(torch.nn.utils.parameters_to_vector(appo.network.parameters()),
                       torch.nn.utils.parameters_to_vector(ppo.network.parameters()))  # fmt: skip
    collector = RolloutCollector(CARTPOLE, appo, seed=0)
    batch = collector.collect(64)
    collector.close()
    stats = {}
    for policy in (appo, ppo):
        torch.manual_seed(1)  # the same minibatch order
        policy.update_dataset(batch.clone())
        stats[policy.algorithm] = policy.train()
    assert torch.allclose(torch.nn.utils.parameters_to_vector(appo.network.parameters()),
                          torch.nn.utils.parameters_to_vector(ppo.network.parameters()), atol=1e-5)  # fmt: skip
    assert stats["APPO"]["importance_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert "importance_weight_mean" not in stats["PPO"]


def test_importance_weights_are_one_on_policy_and_move_with_lag() -> None:
    policy = _policy(APPOPolicy)
    collector = RolloutCollector(CARTPOLE, policy, seed=0)
    fresh = collector.collect(64)
    policy.update_dataset(fresh.clone())
    stats = policy.train()
    assert stats["importance_weight_mean"] == pytest.approx(1.0, abs=1e-5)
    assert stats["importance_weight_clipped_share"] == 0.0
    # The same batch again: acted with the weights before that update, a version old now.
    policy.update_dataset(fresh.clone())
    stats = policy.train()
    collector.close()
    assert stats["importance_weight_mean"] != pytest.approx(1.0, abs=1e-4)
    assert 0.0 < stats["importance_weight_clipped_share"] < 1.0


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_appo_learns_cartpole_from_batches_two_versions_old() -> None:
    """Every batch is acted with the weights of two updates before the one that learns from it (a fleet's lag)."""
    env = EnvConfig(id="CartPole-v1", num_envs=8)
    steps, rollout, lag = 50_000, 128, 2
    kwargs = {"gaeLambda": 0.95}
    policy = APPOPolicy(PolicyConfig(device="cpu", policy_kwargs=kwargs), "train")
    policy.init_train(EnvMeta.from_env_config(env), TrainConfig(total_env_steps=steps), seed=0)
    behaviour = APPOPolicy(PolicyConfig(device="cpu", policy_kwargs=kwargs), "eval")
    behaviour.init_eval(EnvMeta.from_env_config(env), seed=0)
    versions = collections.deque([policy.network.state_dict()], maxlen=lag + 1)
    behaviour.network.load_state_dict(versions[0])
    collector = RolloutCollector(env, behaviour, seed=0)
    clipped = []
    while policy.env_steps < steps:
        policy.update_dataset(collector.collect(rollout))
        clipped.append(policy.train()["importance_weight_clipped_share"])
        versions.append({k: v.clone() for k, v in policy.network.state_dict().items()})
        behaviour.network.load_state_dict(versions[0])  # the weights `lag` updates back
    late = collector.mean_recent_return()
    after = float(np.mean(evaluate_episodes(policy, env, episodes=5, seed=1000)))
    collector.close()
    print(f"APPO at lag {lag}: late training return {late:.1f}, eval after {after:.1f}, "
          f"clipped share {np.mean(clipped):.3f}")  # fmt: skip
    assert np.mean(clipped) > 0.0  # the data really was off-policy
    assert late > 100 and after > 150  # PPO on-policy, the same budget: seeds 0-3 give 150-190 and 380-440
