"""A dead evaluator, a dead child and Ctrl-C: bounded, clean, with clear messages.

Decision (documented in rlightning.runtime.local and .train): a dead evaluator does not stop training.
Its group's publish fails within `weightSync.timeoutSeconds` (at once when the process is gone), the trainer
logs and counts it and keeps publishing to the others; `rlightning run` restarts the evaluator with the same
ordinal, as its StatefulSet would, and it rejoins under a new generation. With `--eval-restarts 0` a dead
evaluator fails the run instead: the launcher stops the others and exits 1 naming the process.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from rlightning.runtime.rundir import RunDir, read_jsonl
from tests._polling import wait_for

pytestmark = pytest.mark.slow


def _wait_for(proc, predicate, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if proc.poll() is not None:
            pytest.fail(f"rlightning run exited with {proc.returncode} while waiting for {what}:\n{proc.stdout.read()}")
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.2)


def _last(run: RunDir) -> dict:
    rows = read_jsonl(run.metrics_path)
    return rows[-1] if rows else {}


def _version(run: RunDir) -> int:
    return _last(run).get("weight_version", 0)


def _pid(run: RunDir, name: str) -> int:
    """The newest pid of a child, from the launcher's header line in its log."""
    text = (run.logs_dir / f"{name}.log").read_text()
    return int(re.findall(r"pid (\d+)", text)[-1])


def _children(pid: int) -> list[int]:
    """Direct children of `pid` (Linux /proc)."""
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    return [int(child) for child in children]


def _running(pid: int) -> bool:
    """Whether process `pid` exists and is not a zombie."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except FileNotFoundError:
        return False
    return state != "Z"


def _alive(pid: int) -> bool:
    """Whether the process group led by `pid` (a child and what it started) has a live member."""
    try:
        os.killpg(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_killed_evaluator_is_dropped_then_rejoins(tmp_path: Path, write_manifest, run_helpers) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    proc = start_run(write_manifest(tiny_manifest(total_env_steps=40000)), run.root)
    _wait_for(proc, lambda: 0 in _last(run).get("evaluators", []), 180, "eval-0 to acknowledge a version")
    victim = _pid(run, "eval-0")
    killed_at = _version(run)
    os.kill(victim, signal.SIGKILL)
    _wait_for(proc, lambda: _version(run) >= killed_at + 5, 120, "training to go on after the kill")
    code, out = finish(proc)
    assert code == 0, out
    assert "eval-0 exited with code -9; restarting it (1/3)" in out
    summary = json.loads(run.summary_path.read_text())
    assert summary["consistent"] is True, str(summary)  # the restarted evaluator caught up with the final version
    assert summary["evaluators"]["0"]["applied_version"] == summary["weight_version"]
    assert _pid(run, "eval-0") != victim
    # Killed mid-batch (it sends batches without pause): nothing partial was trained on, and once restarted it
    # produced data again.
    assert summary["evaluators"]["0"].get("env_steps", 0) > 0, summary["evaluators"]
    assert all(n % (64 * 4) == 0 for n in summary["env_steps_by_evaluator"].values()), summary
    # The publish that met the dead evaluator failed (for its group only) and training went on: no iteration
    # waited longer than the sync timeout (10 s in the tiny manifest) plus slack for a loaded machine.
    assert summary["sync"]["failures"] >= 1, summary["sync"]
    assert "training on without them" in (run.logs_dir / "trainer.log").read_text()
    rows = read_jsonl(run.metrics_path)
    gaps = [b["elapsed_seconds"] - a["elapsed_seconds"] for a, b in zip(rows, rows[1:], strict=False)]
    assert max(gaps) < 10 + 20, gaps


def test_dead_child_stops_the_run_with_a_clear_message(tmp_path: Path, write_manifest, run_helpers) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    proc = start_run(write_manifest(tiny_manifest(total_env_steps=10**6)), run.root, "--eval-restarts", "0")
    _wait_for(proc, lambda: _version(run) >= 2, 180, "weight version 2")
    trainer, other = _pid(run, "trainer"), _pid(run, "eval-0")
    os.kill(_pid(run, "eval-1"), signal.SIGKILL)
    code, out = finish(proc, timeout=120)
    assert code == 1, out
    assert "error: eval-1 failed with signal 9; stopping the others" in out
    assert "eval-1.log" in out
    assert "Traceback" not in out.split("error: eval-1")[0]
    assert not _alive(trainer) and not _alive(other)


def test_ctrl_c_checkpoints_and_stops_every_child(tmp_path: Path, write_manifest, run_helpers) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    proc = start_run(write_manifest(tiny_manifest(total_env_steps=10**6)), run.root)
    _wait_for(proc, lambda: _version(run) >= 2, 180, "weight version 2")
    pids = [_pid(run, name) for name in ("trainer", "eval-0", "eval-1")]
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=120)
    assert code == 130, out
    assert "interrupted" in out
    assert run.summary_path.exists(), out
    summary = json.loads(run.summary_path.read_text())
    assert summary["stop_reason"] == "interrupted"
    assert run.newest_checkpoint() == run.checkpoint_path(summary["iterations"])
    assert not any(_alive(pid) for pid in pids)


def test_dead_trainer_stops_the_evaluators_and_its_resume_issues_no_version_twice(
    tmp_path: Path, write_manifest, run_helpers
) -> None:
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    checkpoints = {"checkpoint": {"intervalIterations": 10, "keep": 2}}
    proc = start_run(write_manifest(tiny_manifest(total_env_steps=10**6, train=checkpoints)), run.root)
    # Well past the checkpoint of iteration 10 and before the next: versions were published after it, more than the
    # resumed trainer publishes before its first row.
    _wait_for(proc, lambda: _last(run).get("iteration", 0) in range(13, 18), 180, "iteration 13 (checkpoint at 10)")
    trainer, evals = _pid(run, "trainer"), [_pid(run, "eval-0"), _pid(run, "eval-1")]
    ranks = _children(trainer)  # torchrun starts each rank in a session of its own
    assert len(ranks) == 2, ranks
    os.kill(trainer, signal.SIGKILL)  # torchrun itself; its ranks must not train on as orphans
    code, out = finish(proc, timeout=120)
    assert code == 1, out
    assert "error: trainer failed with signal 9; stopping the others" in out
    assert not _alive(trainer) and not any(_alive(pid) for pid in evals)
    wait_for(f"the ranks {ranks} of the killed torchrun to exit", lambda: not any(_running(pid) for pid in ranks),
             timeout=30, interval=0.1)

    # The resume starts from the older checkpoint with fresh evaluators: its versions continue above every one
    # published before the kill, never naming other weights with a version already issued.
    rows = read_jsonl(run.metrics_path)
    checkpoint = run.newest_checkpoint()
    assert checkpoint is not None
    held = next(r["weight_version"] for r in rows if run.checkpoint_path(r["iteration"]) == checkpoint)
    issued = run.published_version()  # the highest version published before the kill (at least the rows')
    assert held < max(r["weight_version"] for r in rows) <= issued, (held, issued)
    manifest = tiny_manifest(total_env_steps=rows[-1]["env_steps"] + 1, train=checkpoints)
    code, out = finish(start_run(write_manifest(manifest), run.root))
    assert code == 0, out
    assert json.loads(run.summary_path.read_text())["resumed_from"] == str(checkpoint)
    resumed = read_jsonl(run.metrics_path)[len(rows) :]
    assert resumed and resumed[0]["weight_version"] > issued, (issued, resumed[0])


def test_a_silent_fleet_pauses_training_without_a_hang(tmp_path: Path, write_manifest, run_helpers) -> None:
    """Both evaluators frozen (SIGSTOP: alive, sending nothing): the ranks wait for data together, rank 0 says so,
    and Ctrl-C still stops the run cleanly."""
    tiny_manifest, start_run, finish = run_helpers
    run = RunDir(tmp_path / "run")
    proc = start_run(write_manifest(tiny_manifest(total_env_steps=10**6)), run.root)
    _wait_for(proc, lambda: _version(run) >= 2, 180, "weight version 2")
    evals = [_pid(run, "eval-0"), _pid(run, "eval-1")]
    for pid in evals:
        os.kill(pid, signal.SIGSTOP)
    try:
        paused_at = _last(run)["iteration"]
        log = run.logs_dir / "trainer.log"
        _wait_for(proc, lambda: "training is paused" in log.read_text(), 90, "rank 0 to report the pause")
        assert _last(run)["iteration"] <= paused_at + 1  # at most the iteration whose data was in flight
    finally:
        for pid in evals:
            os.kill(pid, signal.SIGCONT)
    proc.send_signal(signal.SIGINT)
    code, out = finish(proc, timeout=120)
    assert code == 130, out
    summary = json.loads(run.summary_path.read_text())
    assert summary["stop_reason"] == "interrupted"


def test_a_failing_rank_shows_its_own_exception_first(
    tmp_path: Path, write_manifest, run_helpers, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A policy whose constructor raises: the first error line names the exception, not torchrun's banner."""
    tiny_manifest, start_run, finish = run_helpers
    (tmp_path / "broken_ctor.py").write_text(
        "from rlightning.policy.ppo import PPOPolicy\n\n\n"
        "class BrokenPolicy(PPOPolicy):\n"
        "    def __init__(self, *args, **kwargs):\n"
        "        raise ValueError('action space Discrete(2) is not supported')\n"
    )
    doc = tiny_manifest(train={"procsPerNode": 1}, eval={"replicas": 0},
                        policy={"policyClass": "broken_ctor:BrokenPolicy", "policyKwargs": {}})
    run = RunDir(tmp_path / "run")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p))
    code, out = finish(start_run(write_manifest(doc), run.root), timeout=120)
    assert code == 1, out
    errors = [line for line in out.splitlines() if line.startswith("error:")]
    assert errors and errors[0].startswith(
        "error: trainer failed with exit code 1: ValueError: action space Discrete(2) is not supported"
    ), out
    where = out.splitlines()[out.splitlines().index(errors[0]) + 1]
    assert "broken_ctor.py" in where and "in __init__" in where and "(rank 0)" in where, out
