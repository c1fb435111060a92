"""Checkpoints across trainer attempts: a trainer of an older attempt (a zombie that came back after a partition)
cannot commit one once a newer attempt marked the run directory, and a resume reads the newest by (attempt,
iteration). Two trainers share one run directory, as two attempts' pods share a persistentVolumeClaim.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlightning.config import EnvConfig, PolicyConfig, PolicyGroupSpec
from rlightning.policy import EnvMeta, PPOPolicy, _training_state
from rlightning.runtime import _rank_zero, _resume
from rlightning.runtime.rundir import FencedError, RunDir

torch.set_num_threads(1)
SPEC = PolicyGroupSpec.model_validate(
    {"policy": {"policyClass": "rlightning.policy:PPOPolicy"}, "env": {"id": "CartPole-v1"}}
)


def _trainer(seed: int) -> PPOPolicy:
    policy = PPOPolicy(PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [8]}), "train")
    policy.init_train(EnvMeta.from_env_config(EnvConfig(id="CartPole-v1", num_envs=1)), seed=seed)
    return policy


def test_checkpoints_order_by_attempt_then_iteration(tmp_path: Path) -> None:
    run = RunDir(tmp_path).create()
    for iteration, epoch in ((50, 0), (10, 0), (12, 1), (3, 2), (40, 1)):
        run.checkpoint_path(iteration, epoch).write_bytes(b"x")
    assert [p.name for p in run.checkpoints()] == [
        "iter-00000010.pt", "iter-00000050.pt", "iter-00000012-epoch-1.pt", "iter-00000040-epoch-1.pt",
        "iter-00000003-epoch-2.pt",
    ]
    assert run.newest_checkpoint() == run.checkpoint_path(3, 2)
    assert run.newest_checkpoint(1) == run.checkpoint_path(40, 1)  # never a newer attempt's
    assert run.newest_checkpoint(0) == run.checkpoint_path(50, 0)
    assert [p.name for p in run.prune_checkpoints(keep=2)] == [
        "iter-00000010.pt", "iter-00000050.pt", "iter-00000012-epoch-1.pt"
    ]


def test_a_zombie_of_an_older_attempt_cannot_commit_and_the_resume_reads_the_newer_attempt(tmp_path: Path) -> None:
    run = RunDir(tmp_path).create()
    run.mark_epoch(0)
    zombie = _trainer(seed=1)  # attempt 0, partitioned away while the operator starts attempt 1
    zombie.iteration, zombie.weight_version = 10, 4
    _rank_zero.save_checkpoint(zombie, run, SPEC, epoch=0)

    run.mark_epoch(1)  # attempt 1 starts, before it resumes
    current = _trainer(seed=2)
    current.load_checkpoint(run.newest_checkpoint(1))  # attempt 0's iteration 10
    current.iteration, current.weight_version = 12, 6
    with torch.no_grad():
        next(current.parameters()).add_(1.0)  # trained on: its weights differ from attempt 0's
    _rank_zero.save_checkpoint(current, run, SPEC, epoch=1)
    expected = _resume.state_digest(current)

    zombie.iteration, zombie.weight_version = 20, 9  # the partition heals; attempt 0 trained on, further
    with pytest.raises(FencedError, match="epoch 1 .* this trainer of epoch 0, an older attempt, may not commit"):
        _rank_zero.save_checkpoint(zombie, run, SPEC, epoch=0)
    with pytest.raises(FencedError, match="may not run"):
        run.mark_epoch(0)  # nor can a pod of attempt 0 start on the directory
    # nothing of the zombie's refused commit is left, staged file included
    assert sorted(p.name for p in run.checkpoints_dir.iterdir()) == ["iter-00000010.pt", "iter-00000012-epoch-1.pt"]
    assert _training_state.read_checkpoint(run.checkpoint_path(12, 1))["epoch"] == 1

    run.mark_epoch(2)  # attempt 2 resumes attempt 1's checkpoint, bit for bit
    resumed = _trainer(seed=3)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        assert _resume.resume(resumed, run, enabled=True, epoch=2) == str(run.checkpoint_path(12, 1))
    finally:
        dist.destroy_process_group()
    assert _resume.state_digest(resumed) == expected
    assert (resumed.iteration, resumed.weight_version) == (12, 6)
