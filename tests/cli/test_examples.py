"""Every manifest under examples/ passes `rlightning validate` (structural and deep checks), and runs."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert any(p.name == "cartpole.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlightning", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid PolicyGroup" in result.stdout


def run_example(name: str, tmp_path: Path) -> dict:
    """`rlightning run examples/NAME --plain`, as is; returns its summary.json after checking it exited 0."""
    run_dir = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "rlightning", "run", str(REPO / "examples" / name), "--plain",
         "--run-dir", str(run_dir)],
        capture_output=True, text=True, timeout=840, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return json.loads((run_dir / "summary.json").read_text())


DEFAULT_PORTS = pytest.mark.xdist_group("example_default_ports")
"""The examples run as they are, on the default ports: one at a time, on one xdist worker."""


@pytest.mark.slow
@pytest.mark.timeout(900)
@DEFAULT_PORTS
def test_cartpole_example_runs_to_its_target(tmp_path: Path) -> None:
    """examples/cartpole.yaml: its evaluators produce the data and it reaches 475, measured on the final weights."""
    summary = run_example("cartpole.yaml", tmp_path)
    assert summary["reached_target"] is True and summary["final_eval_return"] >= 475, summary
    assert summary["stop_reason"] == "target_eval_return"
    assert summary["consistent"] is True, str(summary)
    # The return that stopped training was measured with the final weights, by every evaluator.
    assert summary["final_eval_version"] == summary["weight_version"], summary
    assert all(e["return_version"] == summary["weight_version"] for e in summary["evaluators"].values()), summary
    # The two evaluators produced every sample the trainers learned from.
    by_evaluator = summary["env_steps_by_evaluator"]
    assert set(by_evaluator) == {"0", "1"} and sum(by_evaluator.values()) == summary["env_steps"], summary


@pytest.mark.slow
@pytest.mark.timeout(900)
@DEFAULT_PORTS
def test_cartpole_appo_example_runs_to_its_target(tmp_path: Path) -> None:
    """examples/cartpole-appo.yaml: APPO's free-running evaluators produce the data, nothing within the lag is
    dropped, and it reaches 475 on the final weights."""
    summary = run_example("cartpole-appo.yaml", tmp_path)
    assert summary["reached_target"] is True and summary["final_eval_return"] >= 475, summary
    assert summary["consistent"] is True and summary["final_eval_version"] == summary["weight_version"], summary
    assert summary["dropped"]["share"] == 0.0, summary["dropped"]
    assert sum(summary["policy_lag_counts"]) * 32 * 4 == summary["env_steps"], summary  # batches of [32, 4]
    assert summary["importance_weights"]["updates"] == summary["iterations"], summary


@pytest.mark.slow
@pytest.mark.timeout(900)
@DEFAULT_PORTS
def test_pendulum_example_runs_to_its_target(tmp_path: Path) -> None:
    """examples/pendulum.yaml: SAC learns from the evaluator's data and reaches -250."""
    summary = run_example("pendulum.yaml", tmp_path)
    assert summary["reached_target"] is True and summary["final_eval_return"] >= -250, summary
    assert summary["stop_reason"] == "target_eval_return"
    assert summary["consistent"] is True, str(summary)
    assert summary["env_steps_by_evaluator"] == {"0": summary["env_steps"]}, summary  # all data from the fleet
