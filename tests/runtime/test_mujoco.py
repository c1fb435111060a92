"""A MuJoCo env through `rlightning run` with the locomotion examples' PPO settings: it learns, and every evaluator
normalises with exactly the trainer's statistics of the version it holds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from rlightning.runtime.rundir import RunDir, read_jsonl

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
TARGET = 200.0
"""InvertedPendulum-v5 pays 1 a step while the pole stands (at most 1,000). 200 uniformly random policies'
episodes returned 4.8 on average (std 2.7) and 21 at best (seeds 0-199), so a deterministic evaluation averaging 200
over the fleet's episodes is ten times the best random episode: the policy learned to balance. The examples' settings
reach it in about 10k env steps (20 updates of 512)."""
ENV_STEPS_CAP = 40_000


def invertedpendulum_manifest(ports: dict) -> dict:
    """examples/hopper.yaml's PPO (CleanRL's continuous-control settings, both normalisations) on
    InvertedPendulum-v5, with smaller updates: 2 evaluators x one [64, 4] batch each, 8 minibatches."""
    doc = yaml.safe_load((REPO / "examples" / "hopper.yaml").read_text())
    doc["metadata"]["name"] = "invertedpendulum"
    spec = doc["spec"]
    spec["env"] = {"id": "InvertedPendulum-v5", "numEnvs": 4}
    spec["policy"]["policyKwargs"]["numMinibatches"] = 8
    spec["train"].update(totalEnvSteps=ENV_STEPS_CAP, rolloutSteps=64, batchesPerUpdate=2, targetEvalReturn=TARGET,
                         checkpoint={"intervalIterations": 5, "keep": 1})  # fmt: skip
    spec["eval"].update(replicas=2, evaluationIntervalSeconds=5)
    spec["ports"] = ports
    return doc


@pytest.mark.timeout(420)
def test_a_mujoco_env_learns_and_evaluators_normalize_with_the_trainers_statistics(
    tmp_path: Path, write_manifest, run_helpers
) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    manifest = write_manifest(invertedpendulum_manifest(tiny_manifest()["spec"]["ports"]))
    code, out = finish(start_run(manifest, run.root), timeout=360)
    assert code == 0, out
    summary = json.loads(run.summary_path.read_text())
    assert summary["stop_reason"] == "target_eval_return", summary
    assert summary["final_eval_return"] >= TARGET, summary
    # Every version an evaluator reported was checked bit for bit against what the trainer published: the
    # normalisation statistics are buffers of the network, so they are in that check.
    assert summary["consistent"] is True, str(summary)
    rows = read_jsonl(run.metrics_path)
    assert rows and all(row["consistent"] is True for row in rows), [row["consistent"] for row in rows]
    state = torch.load(run.checkpoints()[-1], map_location="cpu", weights_only=False)
    flat = json.dumps(sorted(_keys(state)))
    for name in ("obs_norm.mean", "obs_norm.var", "obs_norm.count", "reward_norm.returns.var"):
        assert name in flat, flat
    # The statistics moved: the checkpointed counts are the env steps trained on (plus the initial 1e-4).
    counts = [value for key, value in _tensors(state) if key.endswith("obs_norm.count")]
    assert counts and all(abs(float(c) - summary["env_steps"]) < 1 for c in counts), (counts, summary["env_steps"])


def _tensors(value: object, prefix: str = "") -> list[tuple[str, torch.Tensor]]:
    if isinstance(value, torch.Tensor):
        return [(prefix, value)]
    if isinstance(value, dict):
        return [item for key, inner in value.items() for item in _tensors(inner, f"{prefix}.{key}" if prefix else key)]
    return []


def _keys(value: object) -> list[str]:
    return [key for key, _ in _tensors(value)]
