"""Resuming DDP ranks: rank 0's checkpoint wins on every rank, even when the ranks' run dirs differ.

With `train.nodes > 1` each trainer pod has a run directory of its own; here rank 1's is empty, so only the
broadcast from rank 0 (`rlightning.runtime._resume`) can give it the checkpoint's state.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from rlightning.config import EnvConfig, PolicyConfig
from rlightning.policy import EnvMeta, PPOPolicy
from rlightning.runtime import _resume
from rlightning.runtime.rundir import RunDir
from tests._gloo_workers import run_ranks

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent


def _checkpoint(run_dir: RunDir) -> tuple[Path, str, float]:
    """A checkpoint with trained weights, Adam state and counters; returns (path, digest, optimizer sum)."""
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16]}), "train")
    policy.init_train(EnvMeta.from_env_config(EnvConfig(id="CartPole-v1", num_envs=2)), seed=7)
    loss = sum((p**2).sum() for p in policy.parameters())
    loss.backward()
    policy.optimizer.step()
    policy.iteration, policy.env_steps, policy.weight_version = 7, 1234, 5
    path = policy.save_checkpoint(run_dir.create().checkpoint_path(7))
    optimizer_sum = sum(
        float(v.double().sum()) for s in policy.optimizer.state.values() for v in s.values() if torch.is_tensor(v)
    )
    return path, _resume.state_digest(policy), optimizer_sum


@pytest.mark.timeout(180)
def test_every_rank_resumes_rank_0s_checkpoint(tmp_path: Path) -> None:
    world_size = 2
    run_dirs = [RunDir(tmp_path / f"node{rank}") for rank in range(world_size)]
    path, digest, optimizer_sum = _checkpoint(run_dirs[0])
    assert optimizer_sum != 0.0
    results = run_ranks(HERE / "resume_worker.py", world_size, tmp_path, [[str(d.root)] for d in run_dirs])
    for result in results:
        assert result["resumed_from"] == str(path)
        assert result["digest"] == digest  # bit for bit the checkpoint's weights, on every rank
        assert result["optimizer_sum"] == pytest.approx(optimizer_sum, rel=1e-12)
        assert (result["iteration"], result["env_steps"], result["weight_version"]) == (7, 1234, 5)
        # before its first publish the resumed trainer exports the checkpoint's version and counts, never 0
        assert result["exported"] == {"rlightning_weight_version": 5.0, "rlightning_train_iteration": 7.0,
                                      "rlightning_train_env_steps": 1234.0}
