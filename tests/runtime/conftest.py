"""Fixtures of the runtime tests: tiny manifests on distinct ports, `rlightning run` as a subprocess, and an
evaluator in this process."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from rlightning import weights
from rlightning.config import parse_manifest
from rlightning.runtime.eval import Evaluator
from rlightning.runtime.settings import ProcessSettings
from tests._ports import RUNTIME_RUNS

REPO = Path(__file__).resolve().parents[2]
_MANIFESTS = itertools.count()
PORTS_PER_MANIFEST = 4
"""torchrun, weightSync and two trainer ranks' trajectory intakes: manifest i gets ports 4i..4i+3 of RUNTIME_RUNS."""


def tiny_manifest(name: str = "tiny", total_env_steps: int = 3000, **spec_overrides: dict) -> dict:
    """A CartPole manifest that trains for seconds: 2 trainer ranks, 2 evaluators producing the data, its own four
    ports of RUNTIME_RUNS."""
    first = PORTS_PER_MANIFEST * next(_MANIFESTS)
    torchrun, weight_sync, trajectories = (RUNTIME_RUNS.port(first + i) for i in range(3))
    spec = {
        "env": {"id": "CartPole-v1", "numEnvs": 4},
        "policy": {"policyClass": "rlightning.policy.ppo:PPOPolicy", "policyKwargs": {"hiddenSizes": [16, 16]}},
        "train": {
            "nodes": 1,
            "procsPerNode": 2,
            "totalEnvSteps": total_env_steps,
            "rolloutSteps": 64,
            "checkpoint": {"intervalIterations": 3, "keep": 2},
        },
        "eval": {"replicas": 2, "episodesPerReport": 2},
        "weightSync": {"timeoutSeconds": 10},
        "ports": {"torchrun": torchrun, "weightSync": weight_sync, "trajectories": trajectories, "metrics": 0},
    }
    for key, value in spec_overrides.items():
        spec[key] = {**spec.get(key, {}), **value}
    return {"apiVersion": "rlightning.io/v1alpha1", "kind": "PolicyGroup", "metadata": {"name": name}, "spec": spec}


@pytest.fixture
def write_manifest(tmp_path: Path) -> Callable[[dict], Path]:
    """Write a manifest dict to a YAML file in the test's directory; returns the path."""
    counter = itertools.count()

    def write(doc: dict) -> Path:
        path = tmp_path / f"manifest-{next(counter)}.yaml"
        path.write_text(yaml.safe_dump(doc))
        return path

    return write


def start_run(manifest: Path, run_dir: Path, *extra: str) -> subprocess.Popen:
    """`rlightning run MANIFEST --run-dir RUN_DIR --plain`, stdout and stderr captured as text."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "rlightning", "run", str(manifest), "--run-dir", str(run_dir), "--plain", *extra],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def finish(proc: subprocess.Popen, timeout: float = 240) -> tuple[int, str]:
    """Wait for a run; kill its process group on timeout. Returns (exit code, output)."""
    try:
        out, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGINT)  # twice: the launcher kills its children at once
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, _ = proc.communicate()
        pytest.fail(f"rlightning run did not finish within {timeout} s:\n{out}")
    return proc.returncode, out


@pytest.fixture
def run_helpers() -> tuple:
    """(tiny_manifest, start_run, finish), for tests that drive `rlightning run`."""
    return tiny_manifest, start_run, finish


InProcessEvaluator = Callable[..., tuple[Evaluator, weights.WeightSender, threading.Thread]]
"""`evaluator_in_process(name, **spec_overrides)` -> (evaluator, sender, runner)."""


@pytest.fixture
def evaluator_in_process(tmp_path: Path) -> Iterator[InProcessEvaluator]:
    """A factory of evaluators of the tiny manifest run in this process: `make(name, **spec_overrides)` returns the
    `Evaluator` (ordinal 0, its readiness file `tmp_path / "ready"`), a real `WeightSender` on its weight-sync port and
    the thread that runs it (not started). At teardown each is stopped as SIGTERM would, its sender closed, the
    signal handlers the evaluators installed restored, and every runner must have ended.
    """
    handlers = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    made: list[tuple[Evaluator, weights.WeightSender, threading.Thread]] = []

    def make(name: str, **spec_overrides: dict) -> tuple[Evaluator, weights.WeightSender, threading.Thread]:
        spec = parse_manifest(tiny_manifest(name, **spec_overrides)).spec
        settings = ProcessSettings(
            group_name=name, namespace=None, spec_path=tmp_path / "unused.yaml", run_dir=tmp_path,
            master_addr="127.0.0.1", weight_sync_port=spec.ports.weight_sync, metrics_port=0, report_status=False,
            role="eval", health_file=tmp_path / "ready",
        )  # fmt: skip
        evaluator = Evaluator(spec, settings, ordinal=0)
        sender = weights.WeightSender(spec.weight_sync, "127.0.0.1", spec.ports.weight_sync)
        made.append((evaluator, sender, threading.Thread(target=evaluator.run, daemon=True)))
        return made[-1]

    try:
        yield make
    finally:
        for evaluator, sender, runner in made:
            evaluator.stop._handle(signal.SIGTERM, None)
            if runner.ident is not None:
                runner.join(30.0)
            sender.close()
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
    assert not any(runner.is_alive() for _, _, runner in made)
