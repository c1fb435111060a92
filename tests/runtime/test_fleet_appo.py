"""APPO on the fleet's data (`rlightning run`, real processes): its evaluators free-run, nothing within
`train.maxPolicyLag` is dropped, and the records carry the lag distribution and the importance weights.
The V-trace targets: tests/policy/test_vtrace.py; free-running and the refusal beyond the lag:
tests/trajectories/test_free_running.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlightning.runtime.rundir import RunDir, read_jsonl

pytestmark = pytest.mark.slow

BATCH_STEPS = 64 * 4
"""Env steps of one evaluator batch of the tiny manifest: rolloutSteps x numEnvs."""
LAG = 6
"""Two evaluators with two batches in flight each and two read per update keep a batch about 3 versions behind at
most (2 in a quiet run of examples/cartpole-appo.yaml); 6 leaves a descheduled evaluator room on a loaded machine."""


def test_appo_trains_on_every_batch_within_the_lag_and_records_its_distribution(
    tmp_path: Path, write_manifest, run_helpers
) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    manifest = tiny_manifest(
        total_env_steps=6000,
        policy={"policyClass": "rlightning.policy.appo:APPOPolicy", "policyKwargs": {"hiddenSizes": [16, 16]}},
        train={"maxPolicyLag": LAG, "procsPerNode": 1, "batchesPerUpdate": 2},
    )
    code, out = finish(start_run(write_manifest(manifest), run.root))
    assert code == 0, out
    summary, rows = json.loads(run.summary_path.read_text()), read_jsonl(run.metrics_path)
    assert summary["consistent"] is True, str(summary)
    assert summary["dropped"]["reasons"]["stale"] == 0 and summary["dropped_batches"] == 0, summary["dropped"]
    counts = summary["policy_lag_counts"]
    assert len(counts) == LAG + 1, counts
    assert sum(counts) * BATCH_STEPS == summary["env_steps"] == sum(summary["env_steps_by_evaluator"].values())
    assert sum(counts) == 2 * summary["iterations"]  # every update's two batches, each counted once by its lag
    assert all(sum(r["policy_lag_counts"]) == 2 for r in rows), [r["policy_lag_counts"] for r in rows]
    weights = summary["importance_weights"]
    assert weights["updates"] == summary["iterations"] == len(rows), weights
    assert 0.5 < weights["mean"] < 2.0 and 0.0 <= weights["clipped_share"] <= 1.0, weights
    assert all("train/importance_weight_mean" in r for r in rows)
