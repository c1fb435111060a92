"""Benchmark: what draining one of four evaluators costs the trainer.

`rlightning run` trains PPO on CartPole-v1 behind a fixed per-step latency (as `benchmarks/fleet_throughput.py`,
whose manifest it uses: one trainer rank, `train.maxPolicyLag` 1, the evaluators producing every batch) with four
evaluators. After `--warmup` iterations, evaluator `--drained` gets SIGTERM, as a drain or a preemption sends it; the
launcher starts it again with the same ordinal, as its StatefulSet would. From metrics.jsonl:

- the median interval between iterations before the drain (s);
- the longest interval from the drain until the replacement holds the newest weights (it is back in a row's
  `evaluators`), and the iterations done meanwhile: a trainer that neither waits for the lost evaluator nor for its
  replacement keeps iterating, three evaluators' pace;
- batches dropped meanwhile (the drained evaluator's partial batch is never counted) and the seconds until the
  replacement held the newest weights.

`--record` appends the figures to docs/measurements.md (`benchmarks/_record.py`).

Usage:
    python benchmarks/evaluator_drain.py
    python benchmarks/evaluator_drain.py --seconds-after 10 --record
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for tests._ports and benchmarks.slow_env
from benchmarks import _record, fleet_throughput  # noqa: E402

EVALUATORS = 4
RUN_INDEX = 9
"""The run's ports: `fleet_throughput.manifest`'s index 9 (BENCH_FLEET's last three ports)."""
START_SECONDS = 180.0
"""Bound for the warm-up iterations (imports, rendezvous, the first publish)."""
BACK_SECONDS = 120.0
"""Bound for the drained evaluator's replacement to hold the newest weights."""


def _rows(run_dir: Path) -> list[dict]:
    path = run_dir / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def _wait_rows(
    run_dir: Path, done: Callable[[list[dict]], bool], timeout: float, what: str, proc: subprocess.Popen[bytes]
) -> list[dict]:
    """Poll metrics.jsonl every 50 ms until `done(rows)`; SystemExit after `timeout` s or when the run ends."""
    deadline = time.monotonic() + timeout
    while True:
        rows = _rows(run_dir)
        if done(rows):
            return rows
        if proc.poll() is not None or time.monotonic() > deadline:
            raise SystemExit(f"no {what} within {timeout:.0f} s (run exit code {proc.poll()})")
        time.sleep(0.05)


def _evaluator_pid(launcher: int, ordinal: int) -> int:
    """The process of evaluator `ordinal`: the launcher starts its evaluators first, in ordinal order, then the
    trainer (`LocalRun.children`), each its own child (forked: its command line is the launcher's), so it is the
    launcher's child started `ordinal`-th.
    """
    children = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == launcher:  # ppid; fields[19] is the start time in clock ticks
            children.append((int(fields[19]), int(pid)))
    if len(children) <= ordinal:
        raise SystemExit(f"the launcher {launcher} has {len(children)} children, no evaluator {ordinal}")
    return sorted(children)[ordinal][1]


def run(latency_ms: float, warmup: int, seconds_after: float, drained: int) -> dict:
    """One run: warm up, drain evaluator `drained`, wait for its replacement and `seconds_after` more; the figures."""
    with tempfile.TemporaryDirectory(prefix="drain-bench-") as tmp:
        path = Path(tmp) / "manifest.yaml"
        document = fleet_throughput.manifest(EVALUATORS, latency_ms, 100_000_000, RUN_INDEX)
        path.write_text(yaml.safe_dump(document))
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlightning", "run", str(path), "--run-dir", str(run_dir), "--plain"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
        )  # fmt: skip
        try:
            before = _wait_rows(run_dir, lambda rows: len(rows) >= warmup and len(rows[-1]["evaluators"]) == EVALUATORS,
                                START_SECONDS, f"{warmup} iterations with {EVALUATORS} evaluators", proc)
            os.kill(_evaluator_pid(proc.pid, drained), signal.SIGTERM)
            drained_at = time.monotonic()
            n_before = len(before)
            rows = _wait_rows(run_dir, lambda rows: any(drained in r["evaluators"] for r in rows[n_before:]),
                              BACK_SECONDS, f"evaluator {drained} back with the newest weights", proc)
            back_seconds = time.monotonic() - drained_at
            time.sleep(seconds_after)
            rows = _rows(run_dir)
        finally:
            os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=30)
    back = next(i for i in range(n_before, len(rows)) if drained in rows[i]["evaluators"])
    gaps = [b["elapsed_seconds"] - a["elapsed_seconds"] for a, b in zip(rows, rows[1:], strict=False)]
    steady = gaps[1:n_before - 1] or gaps[:n_before - 1]
    return {
        "median_interval_before": statistics.median(steady),
        "longest_interval_while_drained": max(gaps[n_before - 1:back]),
        "iterations_while_drained": back - n_before + 1,
        "back_seconds": back_seconds,
        "dropped_while_drained": rows[back]["dropped_batches"] - rows[n_before - 1]["dropped_batches"],
        "median_interval_after": statistics.median(gaps[back:]) if gaps[back:] else None,
    }


def main() -> int:
    """Run the drill (module docstring) and print its figures in one line (`--record`: appended to
    docs/measurements.md); 0 when it ran to the end.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--step-latency-ms", type=float, default=5.0, help="added latency per env step (ms)")
    parser.add_argument("--warmup", type=int, default=8, help="iterations before the drain")
    parser.add_argument("--seconds-after", type=float, default=5.0, help="training after the replacement is back (s)")
    parser.add_argument("--drained", type=int, default=2, help="ordinal of the evaluator drained")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    args = parser.parse_args()
    figures = run(args.step_latency_ms, args.warmup, args.seconds_after, args.drained)
    after = figures["median_interval_after"]
    line = (
        f"one of {EVALUATORS} evaluators drained ({args.step_latency_ms:g} ms env): iterations every "
        f"{figures['median_interval_before']:.2f} s before (median); while it was gone and until its replacement held "
        f"the newest weights ({figures['back_seconds']:.1f} s), {figures['iterations_while_drained']} iterations, "
        f"the longest interval {figures['longest_interval_while_drained']:.2f} s; "
        f"{figures['dropped_while_drained']} batches dropped meanwhile; "
        f"{'-' if after is None else f'{after:.2f} s'} after (median)"
    )
    print(line)
    if args.record:
        print(f"recorded: {_record.append_row(line)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
