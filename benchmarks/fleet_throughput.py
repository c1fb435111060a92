"""Benchmark of the fleet loop: env steps per second the trainer learns from, against the number of evaluators.

For each evaluator count, `rlightning run` trains PPO on CartPole-v1 behind a fixed per-step latency
(`--step-latency-ms`, default 5 ms: the slow simulators that fleets exist for; a sleep, so the latency and not
this machine's 2 cores is the limit) with one trainer rank, the evaluators producing every batch, and
`train.maxPolicyLag` 1 (rollout overlaps training, as IMPALA, Sample Factory and RLlib's env runners do). Each run
lasts about `--seconds` of training; the figures come from its metrics.jsonl, after the first `--warmup` iterations:

- env steps per second trained on (the trainer's consumption), mean and max policy lag (weight versions), the
  trainer's idle fraction (waiting for data), batches dropped as too old;
- the trainer's own ceiling: samples per update / (update + publish seconds), measured in the same run.

Goal (issue 15): throughput at 4 evaluators >= 3.2x that at 1, at 8 >= 5x. Anchors: Sample Factory, IMPALA/SEED
RL, RLlib's env runners, TorchRL's distributed collectors.

`--policies ppo,appo` runs each evaluator count with each policy, side by side: `ppo` is `PPOPolicy` at
`train.maxPolicyLag` 1, its evaluators paced to the trainer's reads; `appo` is `APPOPolicy` (V-trace,
docs/vtrace.md) at `--appo-lag` (default 4), its evaluators free-running. `--record` appends the figures to
docs/measurements.md (`benchmarks/_record.py`).

`--rollout-mode async` sets `policy.rolloutMode: async`: each evaluator steps its copies as one shard per copy at
once (`eval.rolloutWorkers` defaults to `env.numEnvs`), instead of in turn.

Usage:
    python benchmarks/fleet_throughput.py                          # 1, 2, 4, 8 evaluators
    python benchmarks/fleet_throughput.py --evaluators 1,4 --seconds 15 --json rows.json
    python benchmarks/fleet_throughput.py --evaluators 1,2 --rollout-mode async
    python benchmarks/fleet_throughput.py --evaluators 8 --seconds 15 --policies ppo,appo --record
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for tests._ports and benchmarks.slow_env
from benchmarks import _record  # noqa: E402
from tests._ports import BENCH_FLEET  # noqa: E402

NUM_ENVS = 4
ROLLOUT_STEPS = 32
BATCHES_PER_UPDATE = 8
"""One update learns from 8 batches of [32, 4] (1,024 steps): at 8 evaluators one batch from each."""
KEYS = ("policy", "evaluators", "env_steps_per_second", "mean_policy_lag", "max_policy_lag", "trainer_idle_fraction",
        "dropped_batches", "trainer_ceiling_steps_per_second", "rollout_mode")  # fmt: skip
POLICIES = {"ppo": "rlightning.policy.ppo:PPOPolicy", "appo": "rlightning.policy.appo:APPOPolicy"}
"""`--policies` names -> `spec.policy.policyClass`."""


def manifest(
    evaluators: int, latency_ms: float, env_steps: int, index: int, rollout_mode: str = "sync",
    policy: str = "ppo", lag: int = 1,
) -> dict:  # fmt: skip
    """A PolicyGroup for one benchmark run, on its own ports of BENCH_FLEET (`policy`: a `POLICIES` name)."""
    first = 3 * index
    return {
        "apiVersion": "rlightning.io/v1alpha1",
        "kind": "PolicyGroup",
        "metadata": {"name": f"fleet-bench-{evaluators}"},
        "spec": {
            "env": {"id": "benchmarks.slow_env:SlowCartPole-v1", "numEnvs": NUM_ENVS,
                    "kwargs": {"step_latency_ms": latency_ms}},
            "policy": {"policyClass": POLICIES[policy],
                       "policyKwargs": {"hiddenSizes": [64, 64], "updateEpochs": 4, "numMinibatches": 4},
                       "rolloutMode": rollout_mode},
            "train": {"nodes": 1, "procsPerNode": 1, "totalEnvSteps": env_steps, "rolloutSteps": ROLLOUT_STEPS,
                      "batchesPerUpdate": BATCHES_PER_UPDATE, "maxPolicyLag": lag,
                      "checkpoint": {"intervalIterations": 1000}},
            "eval": {"replicas": evaluators, "episodesPerReport": 1, "evaluationIntervalSeconds": 3600},
            "weightSync": {"timeoutSeconds": 30},
            "ports": {"torchrun": BENCH_FLEET.port(first), "weightSync": BENCH_FLEET.port(first + 1),
                      "trajectories": BENCH_FLEET.port(first + 2), "metrics": 0},
        },
    }  # fmt: skip


def run_once(
    evaluators: int, latency_ms: float, seconds: float, warmup: int, index: int, rollout_mode: str = "sync",
    policy: str = "ppo", lag: int = 1,
) -> dict:  # fmt: skip
    """Train `policy` (a `POLICIES` name) at `train.maxPolicyLag` `lag` with `evaluators` evaluators for about
    `seconds` s of steady state; return one row (KEYS).
    """
    # Env steps per second of one evaluator: stepping its copies in turn (sync), or all at once (async).
    per_evaluator = 1000.0 / latency_ms * (NUM_ENVS if rollout_mode == "async" else 1)
    env_steps = int(per_evaluator * evaluators * seconds) + BATCHES_PER_UPDATE * ROLLOUT_STEPS * NUM_ENVS * warmup
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        path = Path(tmp) / "manifest.yaml"
        path.write_text(yaml.safe_dump(manifest(evaluators, latency_ms, env_steps, index, rollout_mode, policy, lag)))
        run_dir = Path(tmp) / "run"
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
        done = subprocess.run(
            [sys.executable, "-m", "rlightning", "run", str(path), "--run-dir", str(run_dir), "--plain"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=seconds * 4 + 180,
        )  # fmt: skip
        if done.returncode != 0:
            raise SystemExit(f"rlightning run failed ({done.returncode}):\n{done.stdout[-3000:]}{done.stderr[-3000:]}")
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[warmup:] if len(rows) > warmup + 1 else rows
    first, last = steady[0], steady[-1]
    seconds_span = last["elapsed_seconds"] - first["elapsed_seconds"]
    samples = BATCHES_PER_UPDATE * ROLLOUT_STEPS * NUM_ENVS
    ceilings = [samples / (r["update_seconds"] + (r["sync_seconds"] or 0.0)) for r in steady if r.get("update_seconds")]
    lags = [r["policy_lag_mean"] for r in steady if r["policy_lag_mean"] is not None]
    return {
        "policy": policy,
        "evaluators": evaluators,
        "env_steps_per_second": (last["env_steps"] - first["env_steps"]) / seconds_span if seconds_span > 0 else 0.0,
        "mean_policy_lag": statistics.fmean(lags) if lags else None,
        "max_policy_lag": max((r["policy_lag_max"] or 0 for r in steady), default=None),
        "trainer_idle_fraction": statistics.fmean(r["trainer_idle_fraction"] for r in steady),
        "dropped_batches": last["dropped_batches"],
        "trainer_ceiling_steps_per_second": statistics.median(ceilings) if ceilings else None,
        "rollout_mode": rollout_mode,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluators", default="1,2,4,8", help="comma-separated evaluator counts")
    parser.add_argument("--step-latency-ms", type=float, default=5.0, help="added latency per env step (ms)")
    parser.add_argument("--seconds", type=float, default=20.0, help="steady-state training per run (s)")
    parser.add_argument("--warmup", type=int, default=2, help="iterations left out of the figures")
    parser.add_argument("--rollout-mode", choices=("sync", "async"), default="sync", help="policy.rolloutMode")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows to this file")
    parser.add_argument("--policies", default="ppo", help="comma-separated: ppo (lag 1, paced), appo (V-trace)")
    parser.add_argument("--appo-lag", type=int, default=4, help="train.maxPolicyLag of the appo runs")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    args = parser.parse_args()
    counts = [int(c) for c in args.evaluators.split(",")]
    policies = args.policies.split(",")
    if unknown := sorted(set(policies) - set(POLICIES)):
        parser.error(f"--policies: unknown {unknown}, expected some of {sorted(POLICIES)}")
    print(f"{'policy':>6} {'evaluators':>10} {'steps/s':>9} {'x1':>6} {'lag mean':>9} {'lag max':>8} {'idle':>6} "
          f"{'dropped':>8} {'trainer ceiling steps/s':>24}")  # fmt: skip
    rows = []
    for index, (count, policy) in enumerate((c, p) for c in counts for p in policies):
        lag = args.appo_lag if policy == "appo" else 1
        row = run_once(count, args.step_latency_ms, args.seconds, args.warmup, index, args.rollout_mode, policy, lag)
        rows.append(row)
        base = next(r["env_steps_per_second"] for r in rows if r["policy"] == policy)
        speedup = row["env_steps_per_second"] / base if base else 0.0
        mean_lag = "-" if row["mean_policy_lag"] is None else f"{row['mean_policy_lag']:.2f}"
        ceiling = row["trainer_ceiling_steps_per_second"]
        print(f"{policy:>6} {count:>10} {row['env_steps_per_second']:>9.0f} {speedup:>6.2f} {mean_lag:>9} "
              f"{row['max_policy_lag']!s:>8} {row['trainer_idle_fraction']:>6.2f} {row['dropped_batches']:>8} "
              f"{'-' if ceiling is None else f'{ceiling:.0f}':>24}", flush=True)  # fmt: skip
    if args.json is not None:
        args.json.write_text(json.dumps([{key: row[key] for key in KEYS} for row in rows], indent=2))
    if args.record:
        figures = "; ".join(
            f"{r['policy']} (lag {args.appo_lag if r['policy'] == 'appo' else 1}) at {r['evaluators']} evaluators: "
            f"{r['env_steps_per_second']:.0f} env steps/s trained on, lag mean {r['mean_policy_lag'] or 0:.2f}, "
            f"dropped {r['dropped_batches']}"
            for r in rows
        )
        print(f"recorded: {_record.append_row(f'{args.step_latency_ms:g} ms env: {figures}')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
