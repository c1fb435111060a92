"""A checkpoint holds what a resume needs: the next update after a resume is bit-identical on CPU."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest
import torch

from rlightning.config import EnvConfig, PolicyConfig, TrainConfig
from rlightning.policy import EnvMeta, PolicyGroup, PPOPolicy
from rlightning.runtime.collector import RolloutCollector

torch.set_num_threads(1)
ENV = EnvConfig(id="CartPole-v1", num_envs=4)
META = EnvMeta.from_env_config(ENV)
CONFIG = PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [32, 32], "updateEpochs": 2, "numMinibatches": 4})
TRAIN = TrainConfig(total_env_steps=4096)  # learning rate anneals, so the env-step counter matters


def _draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


@pytest.mark.timeout(120)
def test_resume_reproduces_the_next_update_bit_for_bit(tmp_path: Path) -> None:
    original = PPOPolicy(CONFIG, "train")
    original.init_train(META, TRAIN, seed=0)
    group = PolicyGroup(original)
    collector = RolloutCollector(ENV, original, seed=0)
    original.update_dataset(collector.collect(64))
    original.train()
    group.sync_weights()
    group.sync_weights()
    next_batch = collector.collect(64).clone()
    path = group.save_checkpoint(tmp_path / "ckpt.pt")

    # The run that did not stop.
    original.update_dataset(next_batch)
    metrics = original.train()
    draws = _draws()

    # A fresh process-like start: other seed, other weights, other RNG states; then resume.
    resumed = PPOPolicy(CONFIG, "train")
    resumed.init_train(META, TRAIN, seed=12345)
    _draws()
    assert resumed.get_param_digests() != original.get_param_digests()
    state = resumed.load_checkpoint(path)
    assert state["counters"] == {"iteration": 1, "env_steps": 256} and resumed.weight_version == 2
    resumed.update_dataset(next_batch)
    assert resumed.train() == metrics
    assert _draws() == draws
    assert resumed.get_param_digests() == original.get_param_digests()
    assert (resumed.iteration, resumed.env_steps, resumed.weight_version) == (2, 512, 2)
    for mine, theirs in zip(
        resumed.optimizer.state_dict()["state"].values(), original.optimizer.state_dict()["state"].values(), strict=True
    ):
        for key in ("step", "exp_avg", "exp_avg_sq"):
            assert torch.equal(mine[key], theirs[key])


@pytest.mark.timeout(60)
def test_without_the_rng_states_the_next_update_differs(tmp_path: Path) -> None:
    """Dropping the RNG restore changes the next update (minibatch order), so the test above can fail."""
    original = PPOPolicy(CONFIG, "train")
    original.init_train(META, TRAIN, seed=0)
    collector = RolloutCollector(ENV, original, seed=0)
    batch = collector.collect(64).clone()
    path = original.save_checkpoint(tmp_path / "ckpt.pt")
    original.update_dataset(batch)
    original.train()
    resumed = PPOPolicy(CONFIG, "train")
    resumed.init_train(META, TRAIN, seed=7)
    resumed.load_checkpoint(path, restore_rng=False)
    resumed.update_dataset(batch)
    resumed.train()
    assert resumed.get_param_digests() != original.get_param_digests()


def test_checkpoint_loads_into_an_evaluator_and_rejects_unknown_formats(tmp_path: Path) -> None:
    trainer = PPOPolicy(CONFIG, "train")
    trainer.init_train(META, TRAIN, seed=0)
    trainer.weight_version = 5
    path = trainer.save_checkpoint(tmp_path / "a" / "ckpt.pt")
    assert not list(path.parent.glob(".*tmp*"))  # written atomically, no leftovers
    evaluator = PPOPolicy(CONFIG, "eval")
    evaluator.init_eval(META)
    try:
        evaluator.load_checkpoint(path)
        assert evaluator.get_param_digests() == trainer.get_param_digests() and evaluator.weight_version == 5
        state = torch.load(path, weights_only=True)
        del state["extra"]
        torch.save({**state, "format_version": 1}, tmp_path / "v1.pt")  # written before `extra` existed
        evaluator.weight_version = 0
        evaluator.load_checkpoint(tmp_path / "v1.pt")
        assert evaluator.get_param_digests() == trainer.get_param_digests() and evaluator.weight_version == 5
        torch.save({**state, "format_version": 99}, tmp_path / "bad.pt")
        with pytest.raises(ValueError, match="format_version must be 1 or 2, got 99"):
            evaluator.load_checkpoint(tmp_path / "bad.pt")
    finally:
        evaluator.close()
