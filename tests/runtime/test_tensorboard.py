"""Trainer rank 0's TensorBoard event files: the metrics rows as scalars at env steps, one curve across resumes, and
nothing (no error) without the tensorboard package. A whole run writing them: tests/runtime/test_local_run.py."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

from rlightning.runtime._records import DataFigures, IterationRow, Recorder
from rlightning.runtime._tensorboard import TAGS, TensorBoardWriter
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings
from tests._tensorboard_events import read_scalars

DATA = DataFigures(env_steps_per_second=10.0, trainer_idle_fraction=0.25, policy_lag_mean=None, policy_lag_max=None,
                   dropped_batches=0, update_seconds=0.1)


def open_writer(log_dir: Path, env_steps: int) -> TensorBoardWriter:
    writer = TensorBoardWriter.open(log_dir, env_steps)
    assert writer is not None
    return writer


def started_recorder(run: RunDir) -> Recorder:
    settings = ProcessSettings(group_name="g", namespace=None, spec_path=run.root / "spec.yaml", run_dir=run.root,
                               master_addr="127.0.0.1", weight_sync_port=0, metrics_port=0, report_status=False)
    recorder = Recorder(settings, run.create())
    recorder.begin(0, 0, 0)
    recorder.iteration(IterationRow(iteration=1, env_steps=64, train_return=9.0, eval_return=None, eval_version=None,
                                    weight_version=1, consistent=None, evaluators=(), train_stats={"loss": 0.5},
                                    data=DATA))
    return recorder


def test_a_row_becomes_scalars_at_its_env_steps(tmp_path: Path) -> None:
    writer = open_writer(tmp_path, 0)
    writer.write({"env_steps": 640, "iteration": 1, "train_return": 21.5, "eval_return": None, "consistent": True,
                  "policy_lag_max": 2, "train/policy_loss": -0.25, "time": "2026-01-01T00:00:00+00:00",
                  "evaluators": [0, 1], "elapsed_seconds": 3.5})
    writer.close()
    assert read_scalars(tmp_path) == {
        "progress/iteration": [(640, 1.0)],
        "returns/train": [(640, 21.5)],
        "weight_sync/consistent": [(640, 1.0)],
        "policy_lag/max": [(640, 2.0)],
        "train/policy_loss": [(640, -0.25)],
    }, "None, strings, lists and keys without a tag are not written"


def test_a_resumed_run_replaces_the_steps_after_its_checkpoint(tmp_path: Path) -> None:
    first = open_writer(tmp_path, 0)
    for steps, value in ((100, 1.0), (200, 2.0), (300, 3.0)):
        first.write({"env_steps": steps, "train_return": value})
    first.close()
    resumed = open_writer(tmp_path, 200)  # from the checkpoint at 200 env steps: the row at 300 is orphaned
    for steps, value in ((300, 30.0), (400, 40.0)):
        resumed.write({"env_steps": steps, "train_return": value})
    resumed.close()
    assert read_scalars(tmp_path)["returns/train"] == [(100, 1.0), (200, 2.0), (300, 30.0), (400, 40.0)]


def test_the_recorder_writes_each_row_at_once(tmp_path: Path) -> None:
    run = RunDir(tmp_path)
    started_recorder(run)  # not closed: each row is flushed as it is written
    scalars = read_scalars(run.tensorboard_dir)
    assert scalars[TAGS["train_return"]] == [(64, 9.0)]
    assert scalars[TAGS["trainer_idle_fraction"]] == [(64, 0.25)]
    assert scalars[TAGS["weight_version"]] == [(64, 1.0)]
    assert scalars["train/loss"] == [(64, 0.5)]


def test_without_tensorboard_nothing_is_written_and_one_line_says_why(tmp_path: Path, monkeypatch, caplog) -> None:
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # its import fails, as without the package
    run = RunDir(tmp_path)
    with caplog.at_level(logging.INFO):
        started_recorder(run)
    assert not run.tensorboard_dir.exists()
    assert [r.getMessage() for r in caplog.records if "tensorboard" in r.getMessage().lower()] == [
        "no TensorBoard event files: the tensorboard package is not installed (pip install 'rlightning[tensorboard]')"
    ]
