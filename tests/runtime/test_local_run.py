"""`rlightning run` end to end: 2 DDP ranks under torchrun, 2 evaluators, weight sync, run directory, resume."""

from __future__ import annotations

import itertools
import json
import re
from pathlib import Path

import pytest

from rlightning.runtime import _startup
from rlightning.runtime._tensorboard import TAGS, logdir_hint
from rlightning.runtime.rundir import RunDir, read_jsonl
from tests._tensorboard_events import read_scalars

pytestmark = pytest.mark.slow


def test_run_then_resume(tmp_path: Path, write_manifest, run_helpers) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    code, out = finish(start_run(write_manifest(tiny_manifest(total_env_steps=3000)), run.root))
    assert code == 0, out
    summary = json.loads(run.summary_path.read_text())
    assert summary["consistent"] is True, str(summary)
    assert summary["weight_version"] > 0
    assert summary["stop_reason"] == "total_env_steps"
    assert summary["env_steps"] >= 3000
    assert summary["sync"]["count"] > 0 and summary["sync"]["bytes"] > 0
    assert summary["final_eval_version"] == summary["weight_version"] and summary["final_eval_note"] is None
    assert set(summary["evaluators"]) == {"0", "1"}
    assert [e["in_place_versions"] for e in summary["evaluators"].values()] == [0, 0]  # `single`: staged
    # Start-up measured phase by phase from the launch, each reached after the one before, and shown.
    phases = summary["startup_seconds"]
    assert set(phases) == set(_startup.PHASES), phases
    assert all(0 <= phases[a] <= phases[b] for a, b in itertools.pairwise(_startup.PHASES)), phases
    assert "start-up, seconds from launch: process" in out
    rows = read_jsonl(run.metrics_path)
    assert len(rows) == summary["iterations"]
    assert [r["iteration"] for r in rows] == list(range(1, len(rows) + 1))
    assert all(r["env_steps"] > 0 for r in rows)
    assert run.plot_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    checkpoints = run.checkpoints()
    assert 1 <= len(checkpoints) <= 2  # checkpoint.keep
    assert checkpoints[-1] == run.checkpoint_path(summary["iterations"])
    for name in ("trainer.log", "eval-0.log", "eval-1.log"):  # `rlightning run` forks its children (Linux)
        headers = [line for line in (run.logs_dir / name).read_text().splitlines() if line.startswith("--- ")]
        assert headers and "(a fork of the launcher)" in headers[0], name
    # TensorBoard's reader sees the rows at their env steps; `rlightning run` said where (at the start and the end).
    assert out.count(logdir_hint(run.tensorboard_dir)) == 2, out
    scalars = read_scalars(run.tensorboard_dir)
    keys = ("train_return", "env_steps_per_second", "trainer_idle_fraction", "policy_lag_mean", "sync_seconds",
            "weight_version", "consistent")
    assert {*(TAGS[k] for k in keys), "train/policy_loss", "train/value_loss"} <= set(scalars), sorted(scalars)
    assert [step for step, _ in scalars[TAGS["weight_version"]]] == [r["env_steps"] for r in rows]

    # A second run in the same directory continues from the newest checkpoint.
    code, out = finish(start_run(write_manifest(tiny_manifest(total_env_steps=5000)), run.root))
    assert code == 0, out
    resumed = json.loads(run.summary_path.read_text())
    assert resumed["resumed_from"] == str(checkpoints[-1])
    assert resumed["weight_version"] > summary["weight_version"]
    assert resumed["iterations"] > summary["iterations"]
    assert resumed["env_steps"] >= 5000
    assert resumed["consistent"] is True, resumed
    # Rank 0 loaded the checkpoint and broadcast its training state: both ranks hold the same weights.
    log_text = (run.logs_dir / "trainer.log").read_text()
    digests = dict(re.findall(r"rank (\d) resumed from .* state digest (\w+)", log_text))
    assert set(digests) == {"0", "1"} and len(set(digests.values())) == 1, digests
    new_rows = read_jsonl(run.metrics_path)[len(rows) :]
    assert new_rows and new_rows[0]["iteration"] == summary["iterations"] + 1
    assert new_rows[0]["weight_version"] > summary["weight_version"]
    # One curve on: the resumed attempt's event file continues the first one's steps.
    versions = read_scalars(run.tensorboard_dir)[TAGS["weight_version"]]
    assert [step for step, _ in versions] == [r["env_steps"] for r in rows + new_rows]


def test_a_step_stop_whose_final_weights_go_unevaluated_says_why(tmp_path: Path, write_manifest, run_helpers) -> None:
    """Evaluators too slow to play `episodesPerReport` episodes within the final wait (200-step Pendulum episodes,
    100,000 a report, at most `eval.EVALUATION_COPIES` at once, 5 + 10 s): the summary says in one line why its final
    eval return is not of the final weights."""
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    manifest = tiny_manifest(
        total_env_steps=1000,
        env={"id": "Pendulum-v1"},
        eval={"episodesPerReport": 100_000, "evaluationIntervalSeconds": 10},  # data first, for the 2 iterations
        weightSync={"timeoutSeconds": 5},
    )
    code, out = finish(start_run(write_manifest(manifest), run.root))
    assert code == 0, out
    summary = json.loads(run.summary_path.read_text())
    assert summary["stop_reason"] == "total_env_steps"
    assert summary["final_eval_version"] != summary["weight_version"]
    note = summary["final_eval_note"]
    assert "\n" not in note and f"final weight version {summary['weight_version']} within 15 s" in note, note
    assert f"note: {note}" in out, "the run's output says it too"


def test_evaluators_apply_weights_without_a_buffer(tmp_path: Path, write_manifest, run_helpers) -> None:
    """`none` applies each version at once (gated, between forward passes), never stalled waiting for an update
    thread; every version is applied and reported (`single`, the default, is checked by every other run, e.g.
    tests/runtime/test_fleet_data.py's bfloat16 fleet)."""
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    manifest = tiny_manifest(total_env_steps=2000, policy={"weightBuffer": {"bufferStrategy": "none"}})
    code, out = finish(start_run(write_manifest(manifest), run.root))
    assert code == 0, out
    summary = json.loads(run.summary_path.read_text())
    assert summary["consistent"] is True, str(summary)
    assert summary["final_eval_version"] == summary["weight_version"]
    # each evaluator says it received its versions in place (`single` stages them, and reports 0)
    assert set(summary["evaluators"]) == {"0", "1"}
    assert all(e["in_place_versions"] >= 1 for e in summary["evaluators"].values()), summary["evaluators"]
    for name in ("eval-0.log", "eval-1.log"):
        assert "was not applied" not in (run.logs_dir / name).read_text()
