"""The lag distribution and a lag-correcting policy's importance weights, as trainer rank 0 records them: each
metrics.jsonl row, TensorBoard (one scalar a lag) and summary.json (summed and averaged over the run)."""

from __future__ import annotations

import json
from pathlib import Path

from rlightning.runtime._records import DataFigures, IterationRow, Recorder
from rlightning.runtime.rundir import RunDir, read_jsonl
from rlightning.runtime.settings import ProcessSettings
from tests._tensorboard_events import read_scalars


def _row(iteration: int, lag_counts: tuple[int, ...] | None, stats: dict[str, float]) -> IterationRow:
    data = DataFigures(env_steps_per_second=10.0, trainer_idle_fraction=0.0, policy_lag_mean=0.5, policy_lag_max=2,
                       dropped_batches=0, update_seconds=0.1, policy_lag_counts=lag_counts)  # fmt: skip
    return IterationRow(iteration=iteration, env_steps=64 * iteration, train_return=None, eval_return=None,
                        eval_version=None, weight_version=iteration, consistent=None, evaluators=(),
                        train_stats=stats, data=data)  # fmt: skip


def _recorder(run: RunDir) -> Recorder:
    settings = ProcessSettings(group_name="g", namespace=None, spec_path=run.root / "spec.yaml", run_dir=run.root,
                               master_addr="127.0.0.1", weight_sync_port=0, metrics_port=0, report_status=False)
    recorder = Recorder(settings, run.create())
    recorder.begin(0, 0, 0)
    return recorder


def _summary(recorder: Recorder) -> dict:
    recorder.summary(stop_reason="total_env_steps", iterations=2, env_steps=128, weight_version=2,
                     final_eval_return=None, final_eval_version=None, final_train_return=None,
                     target_eval_return=None, reached_target=False, consistent=None)  # fmt: skip
    return json.loads(recorder.run_dir.summary_path.read_text())


def test_the_lag_distribution_and_importance_weights_reach_every_record(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    recorder = _recorder(run)
    stats = [{"importance_weight_mean": 1.0, "importance_weight_clipped_share": 0.0},
             {"importance_weight_mean": 1.2, "importance_weight_clipped_share": 0.5}]  # fmt: skip
    recorder.iteration(_row(1, (3, 1, 0), stats[0]))
    recorder.iteration(_row(2, (1, 2, 1), stats[1]))
    summary = _summary(recorder)
    assert summary["policy_lag_counts"] == [4, 3, 1]
    assert summary["importance_weights"] == {"mean": 1.1, "clipped_share": 0.25, "updates": 2}
    assert [row["policy_lag_counts"] for row in read_jsonl(run.metrics_path)] == [[3, 1, 0], [1, 2, 1]]
    scalars = read_scalars(run.tensorboard_dir)
    assert scalars["policy_lag/batches_at_lag_0"] == [(64, 3.0), (128, 1.0)]
    assert scalars["policy_lag/batches_at_lag_2"] == [(64, 0.0), (128, 1.0)]
    assert scalars["train/importance_weight_clipped_share"] == [(64, 0.0), (128, 0.5)]


def test_without_fleet_data_or_lag_correction_the_summary_says_none(tmp_path: Path) -> None:
    recorder = _recorder(RunDir(tmp_path))
    recorder.iteration(_row(1, None, {"policy_loss": 0.1}))
    summary = _summary(recorder)
    assert summary["policy_lag_counts"] is None and summary["importance_weights"] is None
