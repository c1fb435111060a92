"""Run directory records, the summary/plot helpers, the progress view and the consistency ledger."""

from __future__ import annotations

import io
import json
from pathlib import Path

import torch

from rlightning import contract, weights
from rlightning.policy._consistency import VersionLedger
from rlightning.runtime.progress import PlainProgress, format_row
from rlightning.runtime.report import SyncTotals, plot_returns
from rlightning.runtime.rundir import JsonlTail, RunDir, append_jsonl, default_run_dir, read_jsonl, write_json_atomic
from rlightning.runtime.settings import ProcessSettings, SettingsError, eval_ordinal

import pytest


def test_checkpoints_sorted_by_iteration_and_pruned(tmp_path: Path) -> None:
    run = RunDir(tmp_path).create()
    for iteration in (2, 10, 1, 30):
        run.checkpoint_path(iteration).write_bytes(b"x")
    (run.checkpoints_dir / ".iter-00000099.pt.tmp-1").write_bytes(b"partial")
    assert [p.name for p in run.checkpoints()] == [
        "iter-00000001.pt", "iter-00000002.pt", "iter-00000010.pt", "iter-00000030.pt"
    ]
    assert run.newest_checkpoint() == run.checkpoint_path(30)
    deleted = run.prune_checkpoints(keep=2)
    assert [p.name for p in deleted] == ["iter-00000001.pt", "iter-00000002.pt"]
    assert run.checkpoints() == [run.checkpoint_path(10), run.checkpoint_path(30)]


def test_the_highest_published_version_is_recorded_and_read_back(tmp_path: Path) -> None:
    run = RunDir(tmp_path).create()
    assert run.published_version() == 0  # nothing published yet
    run.record_published(41)
    assert run.published_version() == 41 and not list(tmp_path.glob("*.tmp"))
    run.published_path.write_text("{")  # unreadable: as if none was recorded
    assert run.published_version() == 0


def test_default_run_dir_is_name_and_utc_stamp() -> None:
    from datetime import UTC, datetime

    path = default_run_dir("cartpole", datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC))
    assert path == Path("runs/cartpole-20260102T030405Z")


def test_jsonl_tail_skips_a_torn_last_line_until_it_completes(tmp_path: Path) -> None:
    path = tmp_path / "metrics.jsonl"
    tail = JsonlTail(path)
    assert tail.read_new() == []
    append_jsonl(path, {"iteration": 1, "eval_return": float("nan")})
    with path.open("a") as f:
        f.write('{"iteration": 2')
    assert tail.read_new() == [{"iteration": 1, "eval_return": None}]
    with path.open("a") as f:
        f.write("}\n")
    assert tail.read_new() == [{"iteration": 2}]
    assert read_jsonl(path) == [{"iteration": 1, "eval_return": None}, {"iteration": 2}]


def test_write_json_atomic_replaces(tmp_path: Path) -> None:
    path = tmp_path / "summary.json"
    write_json_atomic(path, {"a": 1})
    write_json_atomic(path, {"a": float("inf")})
    assert json.loads(path.read_text()) == {"a": None}
    assert list(tmp_path.iterdir()) == [path]


def test_sync_totals() -> None:
    totals = SyncTotals()
    totals.add(100, 0.5)
    totals.add(300, 1.5)
    assert (totals.count, totals.bytes, totals.seconds, totals.last_bytes) == (2, 400, 2.0, 300)


def test_plot_returns_writes_png(tmp_path: Path) -> None:
    rows = [
        {"env_steps": 1000 * i, "train_return": 10.0 * i, "eval_return": None if i < 2 else 12.0 * i}
        for i in range(1, 6)
    ]
    path = plot_returns(rows, tmp_path / "returns.png", "t")
    assert path is not None and path.read_bytes()[:4] == b"\x89PNG"
    assert plot_returns([], tmp_path / "none.png") is None


def test_plain_progress_prints_rate_limited_rows_and_the_last_one() -> None:
    out = io.StringIO()
    view = PlainProgress(total_env_steps=1000, stream=out, min_interval=3600)
    rows = [{"iteration": i, "env_steps": 100 * i, "weight_version": i, "consistent": True} for i in (1, 2, 3)]
    with view:
        view.update(rows[:1], {})
        view.update(rows[1:], {})
    lines = out.getvalue().splitlines()
    assert lines == [format_row(rows[0], 1000), format_row(rows[2], 1000)]
    assert "steps 300/1000 (30%)" in lines[1] and "consistent yes" in lines[1]


def _state(scale: float) -> dict[str, torch.Tensor]:
    return {"w": torch.full((3,), scale), "b": torch.zeros(2)}


def _report(ordinal: int, version: int, state: dict[str, torch.Tensor]) -> weights.ReceiverReport:
    return weights.ReceiverReport(ordinal, weights.WeightRecord.of(version, state), {}, 0.0)


def test_ledger_checks_reports_against_the_version_they_applied() -> None:
    ledger = VersionLedger(keep=2)
    for version in (1, 2, 3):
        ledger.record(version, _state(float(version)))
    assert ledger.latest == 3
    ok = ledger.check({0: _report(0, 3, _state(3.0)), 1: _report(1, 2, _state(2.0)), 2: _report(2, 1, _state(1.0))})
    assert ok.consistent is True
    assert ok.checked == [0, 1] and ok.on_latest == [0]  # version 1 was forgotten (keep=2)
    bad = ledger.check({0: _report(0, 3, _state(2.0))})
    assert bad.consistent is False and set(bad.mismatched[0]) == {"w"}
    assert ledger.check({}).consistent is None


def test_ledger_digests_a_version_only_when_an_exact_check_asks_and_its_weights_are_unchanged() -> None:
    live = _state(1.0)  # the trainer's tensors: the ledger keeps them, not a copy
    ledger = VersionLedger()
    ledger.record(1, live)
    assert ledger.reference(1).digest is None  # a publish takes no digest
    one_ulp = {"w": torch.nextafter(live["w"], torch.tensor(2.0)), "b": live["b"].clone()}
    assert ledger.check({0: _report(0, 1, one_ulp)}, exact=False).consistent is True  # within the tolerance
    assert ledger.check({0: _report(0, 1, one_ulp)}, exact=True).mismatched == {0: ["w"]}  # the digest sees it
    assert ledger.reference(1).digest == weights.tensor_digests(live)  # taken once, kept
    ledger.record(2, live)
    live["w"].add_(1.0)  # trained on after version 2 was sent: its digests can no longer be taken
    assert ledger.reference(2, exact=True).digest is None
    assert ledger.check({0: _report(0, 2, _state(1.0))}, exact=True).consistent is True  # by fingerprint


def test_eval_ordinal_from_variable_or_pod_name() -> None:
    assert eval_ordinal({contract.ENV_EVAL_ORDINAL: "3"}) == 3
    assert eval_ordinal({contract.ENV_POD_NAME: "cartpole-eval-12"}) == 12
    with pytest.raises(SettingsError, match=contract.ENV_EVAL_ORDINAL):
        eval_ordinal({contract.ENV_POD_NAME: "cartpole-eval"})


def test_settings_need_the_spec_path_and_integers() -> None:
    with pytest.raises(SettingsError, match=contract.ENV_SPEC_PATH):
        ProcessSettings.from_env({})
    with pytest.raises(SettingsError, match=contract.ENV_WEIGHT_SYNC_PORT):
        ProcessSettings.from_env({contract.ENV_SPEC_PATH: "/x.yaml", contract.ENV_WEIGHT_SYNC_PORT: "http"})
    settings = ProcessSettings.from_env({contract.ENV_SPEC_PATH: "/x.yaml", contract.ENV_REPORT_STATUS: "1"})
    assert settings.weight_sync_port == contract.WEIGHT_SYNC_PORT and settings.metrics_port == 0
    assert settings.report_status and settings.run_dir == Path(contract.DEFAULT_RUN_DIR_IN_POD)


def test_live_progress_shows_returns_version_consistency_and_processes() -> None:
    from rich.console import Console

    from rlightning.runtime.progress import LiveProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=120, color_system=None)
    row = {
        "iteration": 56, "env_steps": 28672, "train_return": 370.5, "eval_return": 500.0, "eval_version": 56,
        "weight_version": 56, "consistent": False, "sync_seconds": 0.027, "sync_bytes": 36620,
    }  # fmt: skip
    with LiveProgress("run cartpole", 200_000, 475, console=console) as view:
        view.update([row], {"trainer": "running", "eval-0": "exited 1"})
    text = out.getvalue()
    for needle in ("28,672 / 200,000", "370.5", "500.0 on version 56", "(target 475)", "NO", "eval-0: exited 1"):
        assert needle in text, text


def test_live_progress_fits_an_80_column_terminal() -> None:
    from rich.console import Console

    from rlightning.runtime.progress import LiveProgress

    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=80, color_system=None)
    with LiveProgress("run cartpole", 200_000, 475, console=console) as view:
        view.update([{"iteration": 56, "env_steps": 28672}], {"trainer": "running"})
    last_frame = out.getvalue().split("run cartpole")[-1]
    lines = [line.strip() for line in last_frame.splitlines()]
    assert any(line.startswith("env steps") and line.endswith("iteration 56") for line in lines), last_frame
