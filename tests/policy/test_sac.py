"""SAC: its kwargs, what trainer and evaluator hold, replay warm-up, the soft Bellman target, checkpoints."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from tensordict import TensorDict

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig, format_validation_error
from rlightning.policy import EnvMeta, PolicyGroup, SACKwargs, SACPolicy, _training_state
from rlightning.runtime.collector import RolloutCollector

torch.set_num_threads(1)
ENV = EnvConfig(id="Pendulum-v1", num_envs=2)
META = EnvMeta.from_env_config(ENV)
OPTIM = {"lr": 1e-3, "annealLr": False, "maxGradNorm": None}


def _config(**kwargs) -> PolicyConfig:
    return PolicyConfig(
        device="cpu",
        policy_kwargs={"hiddenSizes": [16, 16], "batchSize": 32, "learningStarts": 64, "gradientSteps": 4, **kwargs},
        optim=OPTIM,
    )


def _trainer(seed: int = 0, **kwargs) -> SACPolicy:
    policy = SACPolicy(_config(**kwargs), "train")
    policy.init_train(META, TrainConfig(total_env_steps=10_000), seed=seed)
    return policy


def test_kwargs_use_camel_case_and_reject_unknown_or_out_of_range_fields() -> None:
    kwargs = SACKwargs.model_validate({"hiddenSizes": [32], "tau": 0.01, "bufferSize": 500, "autoEntropy": False})
    assert (kwargs.hidden_sizes, kwargs.tau, kwargs.buffer_size, kwargs.auto_entropy) == ([32], 0.01, 500, False)
    assert SACPolicy.kwargs_model is SACKwargs
    with pytest.raises(ValidationError) as info:
        SACKwargs.model_validate({"tau": 0, "gradientStep": 3, "bufferSize": 0, "initAlpha": -1.0})
    assert sorted(format_validation_error(info.value, prefix="spec.policy.policyKwargs")) == [
        "spec.policy.policyKwargs.bufferSize: Input should be greater than 0",
        "spec.policy.policyKwargs.gradientStep: unknown field",
        "spec.policy.policyKwargs.initAlpha: Input should be greater than 0",
        "spec.policy.policyKwargs.tau: Input should be greater than 0",
    ]


def test_discrete_actions_are_rejected() -> None:
    policy = SACPolicy(_config(), "train")
    with pytest.raises(ValueError, match="SACPolicy supports action spaces Box, got Discrete"):
        policy.init_train(EnvMeta.from_env_config(EnvConfig(id="CartPole-v1")))


def test_evaluators_hold_the_actor_and_follow_the_trainer() -> None:
    trainer = _trainer()
    evaluator = SACPolicy(_config(), "eval")
    evaluator.init_eval(META, seed=1)
    try:
        held = set(evaluator.get_param_digests())
        assert held == set(trainer.get_eval_weights()) and all(name.startswith("actor.") for name in held)
        assert {"actor.action_scale", "actor.action_bias"} <= held  # the bounds travel with the actor
        assert any(name.startswith("critic_target.") for name in trainer.get_param_digests())
        assert set(trainer.get_trainable_parameters()) == {"actor", "critic", "temperature"}
        group = PolicyGroup(trainer, [evaluator])
        collector = RolloutCollector(ENV, trainer, seed=0)
        for _ in range(3):
            trainer.update_dataset(collector.collect(32))
            trainer.train()
            group.sync_weights()
            assert group.wait_for_eval_weights(timeout=10.0) and group.verify_eval_weight_consistency()
        out = evaluator.rollout({"observation": torch.zeros(5, 3), "deterministic": True})
        assert out["action"].shape == (5, 1) and bool((out["action"].abs() <= 2.0).all())  # Pendulum: [-2, 2]
        expected = trainer.rollout({"observation": torch.zeros(5, 3), "deterministic": True})["action"]
        assert torch.equal(out["action"], expected)
    finally:
        evaluator.close()


def test_no_gradient_step_before_learning_starts_then_every_loss_learns() -> None:
    trainer = _trainer()
    collector = RolloutCollector(ENV, trainer, seed=0)
    before = trainer.get_param_digests()
    trainer.update_dataset(collector.collect(16))  # 32 transitions < learningStarts 64
    metrics = trainer.train()
    assert metrics["gradient_steps"] == 0 and metrics["replay_size"] == 32 and trainer.env_steps == 32
    assert trainer.get_param_digests() == before
    trainer.update_dataset(collector.collect(16))
    metrics = trainer.train()
    assert metrics["gradient_steps"] == 4 and trainer.iteration == 2 and trainer.env_steps == 64
    after = trainer.get_param_digests()
    for prefix in ("actor.", "critic.", "critic_target.", "temperature."):
        assert any(after[n] != before[n] for n in after if n.startswith(prefix)), prefix
    assert metrics["alpha"] != 1.0
    with pytest.raises(RuntimeError, match="needs init_train and a batch"):
        trainer.train()  # the batch was consumed


def test_fixed_alpha_is_not_trained() -> None:
    trainer = _trainer(autoEntropy=False, initAlpha=0.2, learningStarts=0)
    trainer.update_dataset(RolloutCollector(ENV, trainer, seed=0).collect(16))
    metrics = trainer.train()
    assert metrics["alpha"] == pytest.approx(0.2) and metrics["alpha_loss"] == 0.0
    assert set(trainer.get_trainable_parameters()) == {"actor", "critic"}


def _terminal_batch(terminated: bool) -> TensorDict:
    steps = 64
    return TensorDict(
        {
            "observation": torch.zeros(steps, 1, 3),
            "next_observation": torch.zeros(steps, 1, 3),
            "action": torch.zeros(steps, 1, 1),
            "reward": torch.full((steps, 1), -1.0),
            "terminated": torch.full((steps, 1), terminated),
            "truncated": torch.full((steps, 1), not terminated),
        },
        batch_size=[steps, 1],
    )


def test_terminated_steps_are_not_bootstrapped_and_truncated_ones_are() -> None:
    # Reward -1 at one state: terminated, Q(s, a) is -1; truncated, it is bootstrapped towards -1 / (1 - gamma).
    results = {}
    for terminated in (True, False):
        trainer = _trainer(seed=3, learningStarts=0, gradientSteps=300, autoEntropy=False, initAlpha=1e-6,
                           gamma=0.5, tau=0.5)  # fmt: skip
        trainer.update_dataset(_terminal_batch(terminated))
        trainer.train()
        with torch.no_grad():
            results[terminated] = [float(q) for q in trainer.critic(torch.zeros(1, 3), torch.zeros(1, 1))]
    assert results[True] == pytest.approx([-1.0, -1.0], abs=0.1)
    assert max(results[False]) < -1.5  # -2 at the fixed point


def test_update_dataset_checks_the_layout() -> None:
    trainer = _trainer()
    batch = RolloutCollector(ENV, trainer, seed=0).collect(4)
    with pytest.raises(ValueError, match=r"SAC dataset: missing keys \['action'\]"):
        trainer.update_dataset(batch.exclude("action"))
    with pytest.raises(ValueError, match="is not"):
        trainer.update_dataset(batch.reshape(-1))
    with pytest.raises(RuntimeError, match="needs init_train"):
        SACPolicy(_config(), "eval").update_dataset(batch)


def test_checkpoint_resumes_weights_optimizer_and_counters(tmp_path: Path) -> None:
    trainer = _trainer(learningStarts=0)
    collector = RolloutCollector(ENV, trainer, seed=0)
    trainer.update_dataset(collector.collect(16))
    trainer.train()
    path = trainer.save_checkpoint(tmp_path / "ckpt.pt")
    resumed = _trainer(seed=9)
    resumed.load_checkpoint(path)
    assert resumed.get_param_digests() == trainer.get_param_digests()
    assert (resumed.iteration, resumed.env_steps) == (1, 32)
    state = resumed.optimizer.state_dict()
    assert len(state["param_groups"]) == 3 and state["state"]  # actor, critic, temperature, with Adam moments
    evaluator = SACPolicy(_config(), "eval")
    evaluator.init_eval(META)
    evaluator.load_state_dict(torch.load(path, weights_only=True)["weights"], strict=False)  # takes the actor
    evaluator.close()
    actor = {name: digest for name, digest in trainer.get_param_digests().items() if name.startswith("actor.")}
    assert evaluator.get_param_digests() == actor


def test_a_resume_continues_with_the_replay_buffer(tmp_path: Path) -> None:
    trainer = _trainer(learningStarts=48, bufferSize=64)
    collector = RolloutCollector(ENV, trainer, seed=0)
    trainer.update_dataset(collector.collect(16))
    assert trainer.train()["gradient_steps"] == 0  # 32 transitions: still warming up
    second = collector.collect(16)
    collector.close()
    path = trainer.save_checkpoint(tmp_path / "ckpt.pt")
    assert torch.load(path, weights_only=True)["extra"]["replay"]["transitions"]["observation"].shape == (32, 3)
    trainer.update_dataset(second)
    uninterrupted = trainer.train()
    peer = _trainer(seed=3, learningStarts=48, bufferSize=64)  # another DDP rank: rank 0's state is broadcast
    resumed = _trainer(seed=9, learningStarts=48, bufferSize=64)
    resumed.load_checkpoint(path)  # restores the global RNG state too
    assert len(resumed.replay) == 32
    _training_state.restore(peer, _training_state.capture(resumed))  # what `_resume` sends and applies
    held = peer.replay.state_dict()["transitions"]
    assert len(held["action"]) == 32
    assert torch.equal(held["action"], resumed.replay.state_dict()["transitions"]["action"])
    resumed.update_dataset(second)
    metrics = resumed.train()  # 64 transitions held: it learns at once, as the trainer it resumes did
    assert metrics["gradient_steps"] == uninterrupted["gradient_steps"] == 4
    assert resumed.get_param_digests() == trainer.get_param_digests()  # same buffer, same RNG: the same update


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_rank_ddp_updates_keep_ranks_identical(tmp_path: Path) -> None:
    from tests._gloo_workers import run_ranks

    results = run_ranks(Path(__file__).resolve().parent / "sac_ddp_worker.py", 2, tmp_path, [[], []])
    for result in results:
        assert result["ddp"] == [True, True, True] and not result["target_wrapped"]
        assert result["env_steps"] == 2 * 16 * 2 * 2  # summed over ranks
        assert result["metrics"]["gradient_steps"] == 3
        assert result["eval_weights"] and all(name.startswith("actor.") for name in result["eval_weights"])
    assert results[0]["after_wrap"] == results[1]["after_wrap"]  # same start, target critics included
    assert results[0]["observation_sum"] != results[1]["observation_sum"]  # each rank sampled its own data
    assert results[0]["after_update"] == results[1]["after_update"]  # all-reduced gradients, same targets
    changed = [n for n, d in results[0]["after_update"].items() if d != results[0]["after_wrap"][n]]
    assert {name.split(".")[0] for name in changed} == {"actor", "critic", "critic_target", "temperature"}
