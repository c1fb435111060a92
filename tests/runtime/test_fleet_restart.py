"""A trainer gang restarted without its run directory continues from the weights the evaluators hold.

Real processes from the launch plans, as `rlightning run` starts them: one evaluator, and two trainers (2 DDP ranks
under torchrun each) one after the other with run directories of their own, as a restarted gang on an `emptyDir`.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlightning import contract, trajectories, weights
from rlightning.policy import EnvMeta, PolicyRole, build_policy
from rlightning.runtime import _resume
from rlightning.runtime.local import Child, LocalRun
from rlightning.runtime.rundir import RunDir, read_jsonl
from rlightning.runtime.validate import validate_file

pytestmark = pytest.mark.slow

TRAINER_SECONDS = 120.0
REPO = Path(__file__).resolve().parents[2]


def _launcher(manifest_path: Path, root: Path) -> LocalRun:
    run = LocalRun(validate_file(manifest_path), manifest_path.read_text(), RunDir(root))
    run.run_dir.create()
    run.run_dir.spec_path.write_text(run.manifest_text)
    return run


def _train(run: LocalRun, attempt: int) -> str:
    """Run a trainer gang to its end; returns its log."""
    trainer = run.child("trainer", contract.PolicyRole.TRAIN)
    trainer.env[contract.ENV_TRAIN_ATTEMPT] = str(attempt)
    trainer.start()
    assert trainer.popen is not None
    try:
        code = trainer.popen.wait(TRAINER_SECONDS)
    except subprocess.TimeoutExpired:
        trainer.stop(10)
        pytest.fail(f"trainer attempt {attempt} did not end within {TRAINER_SECONDS} s:\n"
                    f"{trainer.log_path.read_text()[-4000:]}")
    log = trainer.log_path.read_text()
    assert code == 0, log[-4000:]
    return log


def _digest_of(run: LocalRun, checkpoint: Path) -> str:
    """`_resume.state_digest` of a policy holding the checkpoint's weights."""
    spec = run.manifest.spec
    policy = build_policy(spec.policy, PolicyRole.EVAL)
    policy.init_eval(EnvMeta.from_env_config(spec.env), seed=0)
    try:
        policy.load_checkpoint(checkpoint, restore_rng=False)
        return _resume.state_digest(policy)
    finally:
        policy.close()


def test_a_gang_restarted_without_checkpoints_continues_from_the_fleets_weights(
    tmp_path: Path, write_manifest, run_helpers
) -> None:
    tiny_manifest, _, _ = run_helpers
    manifest = write_manifest(tiny_manifest(total_env_steps=1000, eval={"replicas": 1}))
    first, second = _launcher(manifest, tmp_path / "attempt-0"), _launcher(manifest, tmp_path / "attempt-1")
    evaluator: Child = _launcher(manifest, tmp_path / "eval").child("eval-0", contract.PolicyRole.EVAL, 0)
    evaluator.start()
    try:
        _train(first, 0)
        ended = json.loads(first.run_dir.summary_path.read_text())
        assert ended["consistent"] is True, ended  # the evaluator holds the final version, bit for bit
        version = ended["weight_version"]
        assert version > 0

        log = _train(second, 1)  # its run directory holds no checkpoint
        assert f"loaded weight version {version} from evaluator 0" in log, log[-4000:]
        starts = re.findall(r"rank (\d) starts from the fleet's weight version (\d+) .* state digest (\w+)", log)
        assert {(rank, int(v)) for rank, v, _ in starts} == {("0", version), ("1", version)}, starts
        # Both ranks start with exactly the weights the first gang ended with (its final checkpoint).
        assert {digest for _, _, digest in starts} == {_digest_of(first, first.run_dir.checkpoints()[-1])}
        # its sender goes on from the pulled version: no warning that the fleet is ahead of it
        assert "above this sender's" not in log, log[-4000:]
        restarted = json.loads(second.run_dir.summary_path.read_text())
        assert restarted["resumed_from"] is None and restarted["consistent"] is True, restarted
        rows = read_jsonl(second.run_dir.metrics_path)
        assert rows and rows[0]["weight_version"] > version  # published above the pulled version
        versions = [row["weight_version"] for row in rows]
        assert versions == sorted(versions)
    finally:
        evaluator.stop(10)
    assert f"pull with weight version {version}" in evaluator.log_path.read_text()


def test_a_policy_whose_evaluators_hold_a_part_starts_from_that_part(caplog) -> None:
    spec = validate_file(REPO / "examples" / "pendulum.yaml").spec  # SAC: evaluators hold the actor only
    env_meta = EnvMeta.from_env_config(spec.env)
    evaluator = build_policy(spec.policy, PolicyRole.EVAL)
    evaluator.init_eval(env_meta, seed=5)
    held = trajectories.decode_weights(trajectories.encode_weights(4, 0, weights.named_state(evaluator)))
    dist.init_process_group("gloo", store=dist.TCPStore("127.0.0.1", 0, 1, True), rank=0, world_size=1)
    trainer = build_policy(spec.policy, PolicyRole.TRAIN)
    try:
        trainer.init_train(env_meta, spec.train, seed=1)
        critic = {name: t.clone() for name, t in weights.named_state(trainer).items() if name.startswith("critic.")}
        with caplog.at_level("WARNING", logger="rlightning.train"):
            assert _resume.restart_from_fleet(trainer, lambda: held) == 4
        assert trainer.weight_version == 4
        actor = trainer.get_eval_weights()
        assert actor.keys() == held.state.keys()
        assert all(torch.equal(actor[name], held.state[name]) for name in held.state)
        assert all(torch.equal(weights.named_state(trainer)[name], t) for name, t in critic.items())
        assert "they keep their initial values" in caplog.text and "critic" in caplog.text
    finally:
        evaluator.close()
        trainer.close()
        dist.destroy_process_group()
