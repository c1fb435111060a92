"""MuJoCo locomotion against Stable-Baselines3's PPO: `benchmarks/peers.py --cases halfcheetah,hopper`.

Both sides train PPO with CleanRL's ppo_continuous_action.py settings (https://github.com/vwxyzjn/cleanrl; the
"37 implementation details of PPO" blog post's continuous-action list): 2,048 samples per update, 32 minibatches,
10 epochs, gamma 0.99, GAE lambda 0.95, clip 0.2 on the surrogate and the value update, no entropy bonus, value
coefficient 0.5, gradient norm 0.5, Adam at 3e-4 with epsilon 1e-5 annealed linearly to 0, 64x64 tanh MLPs with
orthogonal init, a state-independent log-std starting at 0, observations normalised by running statistics (clipped
to 10) and rewards scaled by the running std of the discounted return (clipped to 10). rlightning:
`examples/halfcheetah.yaml` / `examples/hopper.yaml` with E evaluators (`--evaluators`) of 4 env copies each, one
batch of `[2048 / (4 E), 4]` from each per update, one trainer rank, `maxPolicyLag` 1. SB3: one env in one process
(`VecNormalize`, `clip_range_vf` 0.2; SB3 weighs its value loss as the squared error where CleanRL and rlightning take
half of it: `vf_coef` 0.25 gives the same gradient).

Per run: wall seconds from the process launch to `--env-steps` trained on (rlightning: summary.json appears; SB3:
`learn` returns), env steps/s trained on (env steps / wall), the training return (the mean undiscounted return of the
last training episodes: rlightning, the last 5 iterations' means in metrics.jsonl, about 10 episodes; SB3, its last 10
`ep_info_buffer` entries) and the deterministic evaluation return of the final weights (rlightning: summary.json
`final_eval_return`, `eval.episodesPerReport` episodes per evaluator; SB3: 10 episodes, statistics frozen), and the
CPU seconds (user and system) of the run's whole process tree. Seeds interleave, SB3 first.

On a busy machine the wall ratio flatters the side with more processes (the scheduler shares the cores by process,
so rlightning's trainer and evaluators get more of them than SB3's one process); the CPU seconds do not depend on
the load, and on an otherwise idle machine the wall is what a user sees.

The plain-process baseline of the per-evaluator rate (`plain`) steps the same env copies with the same policy's
rollout path (`RolloutCollector`, no trainer, no transport) for `PLAIN_SECONDS`, in a process of its own, in the
same run: an evaluator's env steps/s (its env steps over the run's wall after its first batch) is reported against it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, cast

import yaml

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = {"halfcheetah": REPO / "examples" / "halfcheetah.yaml", "hopper": REPO / "examples" / "hopper.yaml"}
SAMPLES_PER_UPDATE = 2048
NUM_ENVS = 4
PLAIN_SECONDS = 20.0
TRAIN_RETURN_ROWS = 5
"""Iterations whose mean training return is averaged into the final training return (about 10 episodes)."""
SB3_EPISODES = 10
THREADS = "1"
TRAINED = "trained"
"""The SB3 worker's line once `learn` returned: `trained <env steps> <training return>`."""
EVALUATED = "evaluated"
"""Its line after the deterministic evaluation: `evaluated <mean return>`."""


@dataclasses.dataclass
class WorkloadOutcome:
    """One run: wall to the env steps, their rate, the training and evaluation returns at the end."""

    system: str
    case: str
    evaluators: int
    seed: int
    wall_seconds: float | None
    env_steps: int | None
    train_return: float | None
    eval_return: float | None
    steps_per_evaluator_per_second: float | None = None
    cpu_seconds: float | None = None


def children_cpu_seconds() -> float:
    """User and system CPU seconds of this process's waited-for descendants so far (`getrusage(RUSAGE_CHILDREN)`)."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


APPO_CLASS = "rlightning.policy.appo:APPOPolicy"


def manifest(case: str, evaluators: int, seed: int, env_steps: int, ports: dict[str, int],
             appo_lag: int | None = None) -> dict[str, Any]:  # fmt: skip
    """The example of `case` with `evaluators` evaluators, each sending one `[2048 / (4 E), 4]` batch per update.

    With `appo_lag`, the same settings under APPO (V-trace targets, rho-bar and c-bar 1.0, free-running evaluators,
    docs/vtrace.md) at `train.maxPolicyLag` `appo_lag`; GAE's lambda is V-trace's.
    """
    doc = yaml.safe_load(EXAMPLES[case].read_text())
    spec = doc["spec"]
    if appo_lag is not None:
        spec["policy"]["policyClass"] = APPO_CLASS
        spec["policy"]["policyKwargs"].update(rhoBar=1.0, cBar=1.0)
        spec["train"]["maxPolicyLag"] = appo_lag
    if SAMPLES_PER_UPDATE % (NUM_ENVS * evaluators):
        raise SystemExit(f"--evaluators: {evaluators} does not divide {SAMPLES_PER_UPDATE // NUM_ENVS}")
    spec["env"]["numEnvs"] = NUM_ENVS
    spec["train"].update(seed=seed, totalEnvSteps=env_steps, batchesPerUpdate=evaluators,
                         rolloutSteps=SAMPLES_PER_UPDATE // (NUM_ENVS * evaluators))  # fmt: skip
    spec["eval"]["replicas"] = evaluators
    spec["ports"] = {**ports, "metrics": 0}
    return doc


def run_rlightning(case: str, doc: dict[str, Any], seed: int, timeout: float) -> WorkloadOutcome:
    """`rlightning run` the manifest to its env steps; wall until summary.json appears."""
    evaluators = doc["spec"]["eval"]["replicas"]
    system = "rlightning-appo" if doc["spec"]["policy"]["policyClass"] == APPO_CLASS else "rlightning"
    with tempfile.TemporaryDirectory(prefix="peers-") as tmp:
        path, run_dir = Path(tmp) / "manifest.yaml", Path(tmp) / "run"
        path.write_text(yaml.safe_dump(doc))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
               "OMP_NUM_THREADS": THREADS}  # fmt: skip
        launched, cpu = time.time(), children_cpu_seconds()  # wall clock, as the summary's modification time
        proc = subprocess.run(
            [sys.executable, "-m", "rlightning", "run", str(path), "--run-dir", str(run_dir), "--plain"],
            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
        )  # fmt: skip
        summary_path = run_dir / "summary.json"
        if proc.returncode != 0 or not summary_path.exists():
            raise SystemExit(f"rlightning run failed ({proc.returncode}):\n{proc.stdout[-3000:]}")
        wall, cpu = summary_path.stat().st_mtime - launched, children_cpu_seconds() - cpu
        summary = json.loads(summary_path.read_text())
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    returns = [row["train_return"] for row in rows if row.get("train_return") is not None][-TRAIN_RETURN_ROWS:]
    first_batch = summary["startup_seconds"].get("first_batch") or 0.0
    per_evaluator = statistics.fmean(summary["env_steps_by_evaluator"].values()) / max(wall - first_batch, 1e-9)
    return WorkloadOutcome(
        system, case, evaluators, seed, wall, summary["env_steps"],
        statistics.fmean(returns) if returns else None, summary.get("final_eval_return"), per_evaluator, cpu,
    )  # fmt: skip


def run_sb3(case: str, seed: int, env_steps: int, timeout: float) -> WorkloadOutcome:
    """Run the SB3 worker (`sb3_worker`); wall until it prints that `learn` returned."""
    env_id = yaml.safe_load(EXAMPLES[case].read_text())["spec"]["env"]["id"]
    config = {"env_id": env_id, "seed": seed, "env_steps": env_steps}
    started, cpu = time.monotonic(), children_cpu_seconds()
    proc = subprocess.Popen(
        [sys.executable, str(REPO / "benchmarks" / "peers.py"), "--sb3-workload-worker", json.dumps(config)],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": THREADS}, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert proc.stdout is not None
    wall = steps = train_return = eval_return = None
    for line in proc.stdout:
        words = line.split()
        if words and words[0] == TRAINED:
            wall, steps, train_return = time.monotonic() - started, int(words[1]), float(words[2])
        elif words and words[0] == EVALUATED:
            eval_return = float(words[1])
    try:
        proc.wait(timeout=max(1.0, timeout - (time.monotonic() - started)))
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
    cpu = children_cpu_seconds() - cpu  # the evaluation after `learn` included: a few seconds
    return WorkloadOutcome("sb3", case, 1, seed, wall, steps, train_return, eval_return, None, cpu)


def sb3_worker(config: dict[str, Any]) -> int:
    """Train SB3's PPO with CleanRL's settings (module docstring); print the `trained` and `evaluated` lines."""
    from stable_baselines3 import PPO
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.evaluation import evaluate_policy
    from stable_baselines3.common.vec_env import VecNormalize

    env = VecNormalize(make_vec_env(config["env_id"], n_envs=1, seed=config["seed"]), gamma=0.99)
    model = PPO(
        "MlpPolicy", env, n_steps=SAMPLES_PER_UPDATE, batch_size=SAMPLES_PER_UPDATE // 32, n_epochs=10,
        learning_rate=lambda progress: progress * 3e-4, gamma=0.99, gae_lambda=0.95, clip_range=0.2,
        clip_range_vf=0.2, ent_coef=0.0, vf_coef=0.25, max_grad_norm=0.5, seed=config["seed"], device="cpu", verbose=0,
    )  # fmt: skip
    model.learn(total_timesteps=config["env_steps"])
    recent = [info["r"] for info in list(model.ep_info_buffer or [])[-SB3_EPISODES:]]
    print(f"{TRAINED} {model.num_timesteps} {statistics.fmean(recent) if recent else float('nan')}", flush=True)
    eval_env = VecNormalize(make_vec_env(config["env_id"], n_envs=1, seed=config["seed"] + 1000), training=False,
                            norm_reward=False)  # fmt: skip
    eval_env.obs_rms = env.obs_rms
    returns, _ = evaluate_policy(model, eval_env, n_eval_episodes=SB3_EPISODES, deterministic=True,
                                 return_episode_rewards=True)  # fmt: skip
    # return_episode_rewards=True makes `returns` a list of floats; the stubs type it as a union.
    print(f"{EVALUATED} {statistics.fmean(cast(list[float], returns))}", flush=True)
    return 0


def run_plain(case: str) -> float:
    """Env steps/s of one plain process stepping the example's env copies with its policy (module docstring)."""
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "peers.py"), "--plain-worker", case],
        cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": THREADS}, stdout=subprocess.PIPE, text=True, check=True,
        timeout=PLAIN_SECONDS * 10,
    )  # fmt: skip
    return float(proc.stdout.split()[-1])


def plain_worker(case: str) -> int:
    """Step the example's env copies with a fresh policy's rollout path for `PLAIN_SECONDS`; print env steps/s."""
    import torch

    from rlightning.config import PolicyGroupSpec
    from rlightning.policy import EnvMeta, PolicyRole, load_policy_class
    from rlightning.runtime.collector import RolloutCollector

    torch.set_num_threads(int(THREADS))
    spec = PolicyGroupSpec.model_validate(manifest(case, 1, 0, SAMPLES_PER_UPDATE, {})["spec"])
    policy = load_policy_class(spec.policy.policy_class)(spec.policy, PolicyRole.EVAL)
    policy.init_eval(EnvMeta.from_env_config(spec.env))
    rollouts = RolloutCollector(spec.env, policy, seed=0)
    rollouts.collect(spec.train.rollout_steps)  # warm-up
    started, steps = time.monotonic(), 0
    while time.monotonic() - started < PLAIN_SECONDS:
        rollouts.collect(spec.train.rollout_steps)
        steps += spec.train.rollout_steps * spec.env.num_envs
    print(steps / (time.monotonic() - started), flush=True)
    rollouts.close()
    return 0


def spread(values: list[float], fmt: str) -> str:
    """`median (min-max)` of `values`, formatted; `-` when empty."""
    if not values:
        return "-"
    return f"{statistics.median(values):{fmt}} ({min(values):{fmt}}-{max(values):{fmt}})"


def print_table(outcomes: list[WorkloadOutcome], plain: dict[str, float]) -> list[dict[str, Any]]:
    """Print one row per case, system and evaluator count (medians with min-max over the seeds); return the rows."""
    rows: list[dict[str, Any]] = []
    keys = dict.fromkeys((o.case, o.system, o.evaluators) for o in outcomes)
    for case, system, evaluators in keys:
        runs = [o for o in outcomes if (o.case, o.system, o.evaluators) == (case, system, evaluators)]
        base = [o.wall_seconds for o in outcomes if o.case == case and o.system == "sb3" and o.wall_seconds]
        walls = [o.wall_seconds for o in runs if o.wall_seconds is not None]
        rates = [o.env_steps / o.wall_seconds for o in runs if o.env_steps and o.wall_seconds]
        cpus = [o.cpu_seconds for o in runs if o.cpu_seconds is not None]
        per_eval = [o.steps_per_evaluator_per_second for o in runs if o.steps_per_evaluator_per_second]
        plain_x = statistics.median(per_eval) / plain[case] if per_eval and case in plain else None
        row = {
            "case": case, "system": system, "evaluators": "-" if system == "sb3" else evaluators,
            "runs": len(runs), "wall_seconds": spread(walls, ".0f"),
            "wall_x_sb3": statistics.median(walls) / statistics.median(base) if walls and base else None,
            "env_steps_per_second": spread(rates, ".0f"), "cpu_seconds": spread(cpus, ".0f"),
            "train_return": spread([o.train_return for o in runs if o.train_return is not None], ".0f"),
            "eval_return": spread([o.eval_return for o in runs if o.eval_return is not None], ".0f"),
            "per_evaluator_x_plain": plain_x,
        }  # fmt: skip
        rows.append(row)
    print(f"{'case':<12} {'system':<15} {'evals':>5} {'runs':>4} {'wall s (min-max)':>20} {'x SB3':>6} "
          f"{'steps/s (min-max)':>20} {'train return (min-max)':>26} {'eval return (min-max)':>26} "
          f"{'per eval x plain':>16} {'CPU s (min-max)':>20}")  # fmt: skip
    for r in rows:
        wall_x = "-" if r["wall_x_sb3"] is None else f"{r['wall_x_sb3']:.2f}"
        x_plain = "-" if r["per_evaluator_x_plain"] is None else f"{r['per_evaluator_x_plain']:.2f}"
        print(f"{r['case']:<12} {r['system']:<15} {r['evaluators']:>5} {r['runs']:>4} {r['wall_seconds']:>20} "
              f"{wall_x:>6} {r['env_steps_per_second']:>20} {r['train_return']:>26} {r['eval_return']:>26} "
              f"{x_plain:>16} {r['cpu_seconds']:>20}")  # fmt: skip
    for case, rate in plain.items():
        print(f"plain process, {case}: {rate:.0f} env steps/s ({NUM_ENVS} env copies, the policy's rollout path)")
    return rows


def figures_line(rows: list[dict[str, Any]], plain: dict[str, float]) -> str:
    """The rows of `print_table` as one line for `benchmarks/_record.append_row`."""
    parts = []
    for r in rows:
        who = "SB3" if r["system"] == "sb3" else f"{r['system']} {r['evaluators']} evaluators"
        ratio = "" if r["wall_x_sb3"] is None or r["system"] == "sb3" else f" ({r['wall_x_sb3']:.2f}x SB3)"
        parts.append(f"{r['case']}, {who}, {r['runs']} seeds: wall {r['wall_seconds']} s{ratio}, "
                     f"{r['env_steps_per_second']} env steps/s, CPU {r['cpu_seconds']} s, "
                     f"train return {r['train_return']}, eval return {r['eval_return']}")  # fmt: skip
    parts += [f"plain process {case}: {rate:.0f} env steps/s" for case, rate in plain.items()]
    return "; ".join(parts)
