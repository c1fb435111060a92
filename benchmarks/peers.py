"""rlightning against Stable-Baselines3 PPO on CartPole-v1: launch to solved, on this machine, in one run.

Both sides use RL Baselines3 Zoo's tuned CartPole-v1 PPO (https://github.com/DLR-RM/rl-baselines3-zoo,
hyperparams/ppo.yml): 256 samples per update (8 envs x 32 steps), one minibatch of 256, 20 epochs, gamma 0.98,
GAE lambda 0.8, no entropy bonus, learning rate 1e-3 and (SB3) clip range 0.2 both annealed linearly over 1e5 steps,
64x64 tanh MLPs. The example weighs the value loss as SB3 does, unclipped; it keeps its clip range fixed: annealed
(`annealClipCoef: true`) it took 1.2x the env steps to solve (docs/measurements.md).

"Solved" is the same rule on both sides: the mean of `EPISODES` deterministic evaluation episodes of the current weights
reaches `TARGET` (rlightning's fleet plays at least `EPISODES` of them together, each evaluator its share); an
evaluation runs once the last `EPISODES` training episodes reach the target (at most every second) and, on CartPole,
every 10 s otherwise (rlightning's evaluators: `rlightning/runtime/eval.py`; SB3: a callback after
each rollout). Behind the slow env an evaluation costs up to 12.5 s (5 x 500 steps x 5 ms), so there only the first rule
evaluates (`SLOW_EVALUATION_INTERVAL_SECONDS`), on both sides. Wall is measured from the process launch (interpreter
start and imports count) to the moment the target is confirmed: for rlightning, when summary.json appears (written once
rank 0 confirmed the target on the final weights); for SB3, when its worker process prints that an evaluation reached
it. Env steps are those trained on (rlightning: summary.json `env_steps`; SB3: `num_timesteps`).

Threads: both sides run with `OMP_NUM_THREADS=1` (`THREADS`), set in the environment of the SB3 worker and of
`rlightning run`. One intra-op thread a process is what `rlightning run` gives its children by default (they
share the machine's cores), and a 64x64 MLP on 256 samples gains nothing from more; with torch's default (one
thread per core) SB3's one process ran threads of its own against the other processes on a shared machine (its wall
went from 9 s to 280 s under load in one sitting; not measured apart). Pinning both the same way compares
the two codes, not their thread settings.

Cases, seeds interleaved (SB3 then rlightning for each seed):

- `cartpole`: `examples/cartpole.yaml` as is (one trainer rank learning from 2 evaluators x 4 envs, lag 1; or the
  manifest given with `--manifest`) against SB3 with 8 envs in one process (DummyVecEnv), as a new user would run it.
- `slow-N`: behind a 5 ms-per-step env (`benchmarks/slow_env.py`, `--step-latency-ms`) with N evaluators of one env
  each (1 trainer rank, N batches of [256/N, 1] per update, `train.maxPolicyLag` `--slow-lag`, default 1 so that
  collection overlaps the update) against SB3 with N envs in a SubprocVecEnv (n_steps 256/N): the same update.
- `appo-N` (`--slow-policies ppo,appo`): the same behind the slow env with `examples/cartpole-appo.yaml`'s APPO
  (V-trace, free-running evaluators, `train.maxPolicyLag` `--appo-lag`, default 4, docs/vtrace.md), against the
  same SB3 runs as `slow-N` (each seed's SB3 run is made once and counted for both).

- `halfcheetah`, `hopper`: MuJoCo locomotion to `--env-steps` (default 1M) with `--workload-evaluators` evaluators
  (default 2; a list runs each count) against SB3's PPO with CleanRL's settings in one process, and a plain process
  stepping the env with the same policy (`benchmarks/_workload_peers.py`; the extra `mujoco` too).
  `--workload-policies ppo,appo` adds the same runs under APPO (`rlightning-appo`, lag `--appo-lag`).

Needs the optional extra `peers` (`pip install -e '.[peers]'`: stable-baselines3); the runtime never imports it.

Usage:
    python benchmarks/peers.py                                   # 5 seeds, cartpole and slow-1, slow-4, slow-8
    python benchmarks/peers.py --seeds 2 --evaluators 8 --json peers.json
    python benchmarks/peers.py --cases cartpole --seeds 3
    python benchmarks/peers.py --cases halfcheetah --seeds 3 --workload-evaluators 2
    python benchmarks/peers.py --cases halfcheetah --seeds 1 --workload-evaluators 1,2,4 --env-steps 200000 --no-sb3
    python benchmarks/peers.py --cases halfcheetah --seeds 1 --workload-evaluators 4 --workload-policies ppo,appo \
        --no-sb3
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for tests._ports and benchmarks.slow_env
from benchmarks import _record, _workload_peers  # noqa: E402
from tests._ports import BENCH_PEERS  # noqa: E402

TARGET = 475.0
EPISODES = 5
"""Deterministic evaluation episodes per check (the example's `eval.episodesPerReport`)."""
TOTAL_STEPS = 100_000
"""The Zoo's `n_timesteps`: the learning rate anneals over it, and a run that has not solved by then failed."""
SAMPLES_PER_UPDATE = 256
EVALUATION_INTERVAL_SECONDS = 10.0
SLOW_EVALUATION_INTERVAL_SECONDS = 3600.0
TARGET_CHECK_SECONDS = 1.0
PORTS_PER_RUN = 4
SLOW_ENV_ID = "benchmarks.slow_env:SlowCartPole-v1"
THREADS = "1"
"""`OMP_NUM_THREADS` of both sides (module docstring, "Threads")."""
SOLVED = "solved"
"""The SB3 worker's line on stdout once an evaluation reached the target: `solved <env steps>`."""


@dataclasses.dataclass
class Outcome:
    """One run: seconds from launch to the target confirmed (None: not solved) and env steps trained on."""

    system: str
    case: str
    seed: int
    wall_seconds: float | None
    env_steps: int | None
    first_iteration_seconds: float | None = None
    dropped_share: float | None = None
    startup_seconds: dict[str, float] | None = None
    """rlightning's start-up phases (summary.json `startup_seconds`), for `--json`."""


# -- rlightning -------------------------------------------------------------------------------------------------
EXAMPLE = REPO / "examples" / "cartpole.yaml"
APPO_EXAMPLE = REPO / "examples" / "cartpole-appo.yaml"


def run_ports(index: int) -> dict[str, int]:
    """The benchmark's own ports for run `index` (`spec.ports`, less the metrics port)."""
    first = PORTS_PER_RUN * (index % (BENCH_PEERS.size // PORTS_PER_RUN))
    return {"torchrun": BENCH_PEERS.port(first), "weightSync": BENCH_PEERS.port(first + 1),
            "trajectories": BENCH_PEERS.port(first + 2)}  # fmt: skip


def example_manifest(seed: int, index: int, path: Path = EXAMPLE) -> dict[str, Any]:
    """The manifest at `path` (the example by default) with `train.seed` and the benchmark's own ports (run `index`)."""
    doc = yaml.safe_load(path.read_text())
    spec = doc["spec"]
    spec["train"]["seed"] = seed
    spec["ports"] = {**run_ports(index), "metrics": 0}
    return doc


def slow_manifest(
    evaluators: int, seed: int, index: int, latency_ms: float, lag: int, path: Path = EXAMPLE
) -> dict[str, Any]:
    """The example at `path` behind the slow env: `evaluators` evaluators of one env each, one trainer rank learning
    from one [256/evaluators, 1] batch of each per update (the Zoo's 256 samples).
    """
    doc = example_manifest(seed, index, path)
    spec = doc["spec"]
    spec["env"] = {"id": SLOW_ENV_ID, "numEnvs": 1, "kwargs": {"step_latency_ms": latency_ms}}
    spec["train"].update(procsPerNode=1, rolloutSteps=SAMPLES_PER_UPDATE // evaluators, batchesPerUpdate=evaluators,
                         maxPolicyLag=lag)  # fmt: skip
    spec["eval"].update(replicas=evaluators, evaluationIntervalSeconds=SLOW_EVALUATION_INTERVAL_SECONDS)
    return doc


def run_rlightning(case: str, doc: dict[str, Any], seed: int, timeout: float) -> Outcome:
    """`rlightning run` the manifest; wall until summary.json appears."""
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        path, run_dir = Path(tmp) / "manifest.yaml", Path(tmp) / "run"
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": THREADS}  # fmt: skip
        summary_path = run_dir / "summary.json"
        started = time.monotonic()
        proc = subprocess.Popen(
            [sys.executable, "-m", "rlightning", "run", str(path), "--run-dir", str(run_dir), "--plain"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        wall = None
        while proc.poll() is None and time.monotonic() - started < timeout:
            if summary_path.exists():
                wall = time.monotonic() - started
                break
            time.sleep(0.02)
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        if proc.returncode != 0 or not summary_path.exists():
            raise SystemExit(f"rlightning run failed ({proc.returncode}):\n{out[-3000:]}")
        summary = json.loads(summary_path.read_text())
    solved = bool(summary["reached_target"])
    return Outcome(
        "rlightning", case, seed, wall if solved else None, summary["env_steps"] if solved else None,
        summary["startup_seconds"].get("first_iteration"), (summary.get("dropped") or {}).get("share"),
        summary["startup_seconds"],
    )  # fmt: skip


# -- Stable-Baselines3, in a worker process of its own (its imports count, as rlightning's do) ------------------
def run_sb3(case: str, config: dict[str, Any], seed: int, timeout: float) -> Outcome:
    """Run the SB3 worker; wall until it prints that it solved."""
    started = time.monotonic()
    proc = subprocess.Popen(
        [sys.executable, __file__, "--sb3-worker", json.dumps({**config, "seed": seed})],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": THREADS}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    wall, steps = None, None
    for line in proc.stdout:
        if line.startswith(SOLVED):
            wall, steps = time.monotonic() - started, int(line.split()[1])
            break
    try:
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    return Outcome("sb3", case, seed, wall, steps)


def sb3_worker(config: dict[str, Any]) -> int:
    """Train SB3 PPO with the Zoo's settings until an evaluation reaches the target; print `solved <steps>`."""
    import gymnasium
    from stable_baselines3 import PPO
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.monitor import Monitor
    from stable_baselines3.common.vec_env import DummyVecEnv, SubprocVecEnv

    import benchmarks.slow_env  # noqa: F401  (registers SlowCartPole-v1)

    env_id, kwargs, n_envs = config["env_id"], config.get("env_kwargs", {}), config["n_envs"]
    vec_cls = SubprocVecEnv if config.get("subproc") else DummyVecEnv
    env = make_vec_env(env_id, n_envs=n_envs, seed=config["seed"], vec_env_cls=vec_cls, env_kwargs=kwargs)
    eval_env = Monitor(gymnasium.make(env_id, **kwargs))

    def linear(start: float) -> Any:
        """SB3's linear schedule from `start` down to 0 over the run."""
        return lambda progress: progress * start  # SB3's progress_remaining goes from 1 to 0

    class Solve(BaseCallback):
        """After each rollout, evaluate when due (module docstring); stop once the target is reached."""

        def __init__(self) -> None:
            super().__init__()
            self.solved = False
            self.interval = config.get("evaluation_interval", EVALUATION_INTERVAL_SECONDS)
            self.next_interval = time.monotonic() + self.interval
            self.next_target_check = time.monotonic()

        def _on_rollout_end(self) -> None:
            now = time.monotonic()
            recent = [info["r"] for info in list(self.model.ep_info_buffer or [])[-EPISODES:]]
            near = len(recent) == EPISODES and statistics.fmean(recent) >= TARGET and now >= self.next_target_check
            if not (near or now >= self.next_interval):
                return
            returns, _ = evaluate_policy(
                self.model, eval_env, n_eval_episodes=EPISODES, deterministic=True, return_episode_rewards=True
            )
            mean = statistics.fmean(returns if isinstance(returns, list) else [returns])
            self.next_interval = time.monotonic() + self.interval
            self.next_target_check = time.monotonic() + TARGET_CHECK_SECONDS
            if mean >= TARGET:
                self.solved = True
                print(f"{SOLVED} {self.model.num_timesteps}", flush=True)

        def _on_step(self) -> bool:
            return not self.solved

    model = PPO(
        "MlpPolicy", env, n_steps=SAMPLES_PER_UPDATE // n_envs, batch_size=SAMPLES_PER_UPDATE, n_epochs=20,
        gamma=0.98, gae_lambda=0.8, ent_coef=0.0, learning_rate=linear(1e-3), clip_range=linear(0.2),
        seed=config["seed"], device="cpu", verbose=0,
    )  # fmt: skip
    model.learn(total_timesteps=TOTAL_STEPS, callback=Solve())
    env.close()
    return 0


# -- the table --------------------------------------------------------------------------------------------------
def table(outcomes: list[Outcome]) -> list[dict[str, Any]]:
    """One row per case and system: medians with min and max over the seeds, and ratios to SB3's medians."""
    rows: list[dict[str, Any]] = []
    for case in dict.fromkeys(o.case for o in outcomes):
        medians: dict[str, tuple[float | None, float | None]] = {}
        for system in ("sb3", "rlightning"):
            runs = [o for o in outcomes if o.case == case and o.system == system]
            walls = [o.wall_seconds for o in runs if o.wall_seconds is not None]
            steps = [float(o.env_steps) for o in runs if o.env_steps is not None]
            firsts = [o.first_iteration_seconds for o in runs if o.first_iteration_seconds is not None]
            drops = [o.dropped_share for o in runs if o.dropped_share is not None]
            medians[system] = (statistics.median(walls) if walls else None, statistics.median(steps) if steps else None)
            spread = _workload_peers.spread
            rows.append({
                "case": case, "system": system, "solved": f"{len(walls)}/{len(runs)}",
                "wall_seconds": spread(walls, ".1f"), "env_steps": spread(steps, ".0f"),
                "first_iteration_seconds": spread(firsts, ".1f"), "dropped_share": spread(drops, ".3f"),
                "wall_median": medians[system][0], "env_steps_median": medians[system][1],
            })  # fmt: skip
        for row in rows[-2:]:
            base_wall, base_steps = medians["sb3"]
            row["wall_x_sb3"] = row["wall_median"] / base_wall if row["wall_median"] and base_wall else None
            row["steps_x_sb3"] = (
                row["env_steps_median"] / base_steps if row["env_steps_median"] and base_steps else None
            )
    return rows


def print_table(rows: list[dict[str, Any]]) -> None:
    """Print the rows as one table."""
    header = (f"{'case':<9} {'system':<11} {'solved':>6} {'wall s, median (min-max)':>26} {'x SB3':>6} "
              f"{'env steps, median (min-max)':>28} {'x SB3':>6} {'1st iter s':>16} {'dropped':>20}")  # fmt: skip
    print(header)
    for r in rows:
        wall_x = "-" if r["wall_x_sb3"] is None else f"{r['wall_x_sb3']:.2f}"
        steps_x = "-" if r["steps_x_sb3"] is None else f"{r['steps_x_sb3']:.2f}"
        print(f"{r['case']:<9} {r['system']:<11} {r['solved']:>6} {r['wall_seconds']:>26} {wall_x:>6} "
              f"{r['env_steps']:>28} {steps_x:>6} {r['first_iteration_seconds']:>16} "
              f"{r['dropped_share']:>20}")  # fmt: skip


def run_workloads(args: argparse.Namespace, cases: list[str]) -> int:
    """The MuJoCo cases (`benchmarks/_workload_peers.py`): the plain process, then seeds interleaved, SB3 first."""
    plain = {case: _workload_peers.run_plain(case) for case in cases}
    counts = [int(c) for c in args.workload_evaluators.split(",")]
    policies = args.workload_policies.split(",")
    if not set(policies) <= {"ppo", "appo"}:
        raise SystemExit(f"--workload-policies: {args.workload_policies!r}: each one of ppo, appo")
    outcomes: list[_workload_peers.WorkloadOutcome] = []
    index = 0
    for case in cases:
        for seed in range(args.seeds):
            runs = [(0, "sb3")] if not args.no_sb3 else []
            runs += [(count, policy) for count in counts for policy in policies]
            for count, policy in runs:
                if policy == "sb3":
                    outcome = _workload_peers.run_sb3(case, seed, args.env_steps, args.timeout)
                else:
                    appo_lag = args.appo_lag if policy == "appo" else None
                    doc = _workload_peers.manifest(case, count, seed, args.env_steps, run_ports(index), appo_lag)
                    outcome = _workload_peers.run_rlightning(case, doc, seed, args.timeout)
                    index += 1
                outcomes.append(outcome)
                print(json.dumps(dataclasses.asdict(outcome)), file=sys.stderr, flush=True)
    rows = _workload_peers.print_table(outcomes, plain)
    if args.record:
        _record.append_row(_workload_peers.figures_line(rows, plain))
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "plain": plain,
                                         "runs": [dataclasses.asdict(o) for o in outcomes]}, indent=2))  # fmt: skip
    return 0


def main() -> int:
    """Run the chosen cases for every system and seed and print the table (module docstring); 0 once printed."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per case and system (>= 5 for a recorded figure)")
    parser.add_argument("--cases", default="cartpole,slow", help="comma-separated: cartpole, slow")
    parser.add_argument("--evaluators", default="1,4,8", help="evaluator (and SubprocVecEnv env) counts of `slow`")
    parser.add_argument("--step-latency-ms", type=float, default=5.0, help="added latency per env step (ms)")
    parser.add_argument("--slow-lag", type=int, default=1, help="train.maxPolicyLag of the slow-env runs")
    parser.add_argument("--slow-policies", default="ppo", help="comma-separated: ppo (slow-N), appo (appo-N)")
    parser.add_argument("--appo-lag", type=int, default=4, help="train.maxPolicyLag of the APPO runs")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds one run may take at most")
    parser.add_argument("--json", type=Path, default=None, help="also write the rows and every run to this file")
    parser.add_argument("--manifest", type=Path, default=EXAMPLE,
                        help="the PolicyGroup of the `cartpole` case (a variant of the example to compare)")
    parser.add_argument("--workload-evaluators", default="2", help="evaluator counts of halfcheetah and hopper")
    parser.add_argument("--workload-policies", default="ppo",
                        help="comma-separated, halfcheetah and hopper: ppo (the example), appo (APPO at --appo-lag)")
    parser.add_argument("--env-steps", type=int, default=1_000_000, help="env steps of halfcheetah and hopper runs")
    parser.add_argument("--no-sb3", action="store_true", help="halfcheetah and hopper: rlightning and plain only")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP + " (halfcheetah and hopper)")
    parser.add_argument("--sb3-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--sb3-workload-worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--plain-worker", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.sb3_worker is not None:
        return sb3_worker(json.loads(args.sb3_worker))
    if args.sb3_workload_worker is not None:
        return _workload_peers.sb3_worker(json.loads(args.sb3_workload_worker))
    if args.plain_worker is not None:
        return _workload_peers.plain_worker(args.plain_worker)
    cases = set(args.cases.split(","))
    workloads = [case for case in args.cases.split(",") if case in _workload_peers.EXAMPLES]
    if workloads:
        return run_workloads(args, workloads)
    plan: list[tuple[str, dict[str, Any], Any]] = []  # case, SB3 config, rlightning manifest by (seed, index)
    if "cartpole" in cases:
        plan.append(("cartpole", {"env_id": "CartPole-v1", "n_envs": 8},
                     lambda seed, index: example_manifest(seed, index, args.manifest)))
    if "slow" in cases:
        for count in (int(c) for c in args.evaluators.split(",")):
            config = {"env_id": SLOW_ENV_ID, "n_envs": count, "subproc": True,
                      "env_kwargs": {"step_latency_ms": args.step_latency_ms},
                      "evaluation_interval": SLOW_EVALUATION_INTERVAL_SECONDS}  # fmt: skip
            for policy in args.slow_policies.split(","):
                lag, path = (args.appo_lag, APPO_EXAMPLE) if policy == "appo" else (args.slow_lag, EXAMPLE)
                plan.append((f"{'slow' if policy == 'ppo' else policy}-{count}", config,
                             lambda seed, index, n=count, lag=lag, path=path: slow_manifest(
                                 n, seed, index, args.step_latency_ms, lag, path)))  # fmt: skip
    outcomes: list[Outcome] = []
    sb3_runs: dict[tuple[str, int], Outcome] = {}  # (config, seed) -> its run, shared by the cases of one config
    index = 0
    for case, config, manifest in plan:
        for seed in range(args.seeds):
            key = (json.dumps(config, sort_keys=True), seed)
            if key not in sb3_runs:
                sb3_runs[key] = run_sb3(case, config, seed, args.timeout)
            for outcome in (
                dataclasses.replace(sb3_runs[key], case=case),
                run_rlightning(case, copy.deepcopy(manifest(seed, index)), seed, args.timeout),
            ):
                outcomes.append(outcome)
                print(json.dumps(dataclasses.asdict(outcome)), file=sys.stderr, flush=True)
            index += 1
    rows = table(outcomes)
    print_table(rows)
    if args.json is not None:
        args.json.write_text(json.dumps({"rows": rows, "runs": [dataclasses.asdict(o) for o in outcomes]}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
