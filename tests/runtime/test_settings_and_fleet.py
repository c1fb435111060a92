"""The process environment (role, expected evaluators) and how trainer rank 0 counts its evaluator fleet."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlightning import contract
from rlightning.config import PolicyGroupManifest
from rlightning.runtime import eval as eval_mod
from rlightning.runtime import _fleet, local
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings, SettingsError

REPO = Path(__file__).resolve().parents[2]


def test_role_and_expected_evaluators_are_read_and_checked() -> None:
    base = {contract.ENV_SPEC_PATH: "/x.yaml"}
    settings = ProcessSettings.from_env(base)
    assert settings.role is None and settings.expected_evaluators is None  # pods: the fleet counts itself
    settings.require_role(contract.PolicyRole.TRAIN)  # unset role: started by hand, accepted
    settings = ProcessSettings.from_env({**base, contract.ENV_ROLE: "eval", contract.ENV_EXPECTED_EVALUATORS: "8"})
    assert settings.expected_evaluators == 8
    settings.require_role(contract.PolicyRole.EVAL)
    with pytest.raises(SettingsError, match=f"{contract.ENV_ROLE}: is 'eval' but this is the 'train' entrypoint"):
        settings.require_role(contract.PolicyRole.TRAIN)
    with pytest.raises(SettingsError, match=contract.ENV_ROLE):
        ProcessSettings.from_env({**base, contract.ENV_ROLE: "trainer"})
    with pytest.raises(SettingsError, match=contract.ENV_EXPECTED_EVALUATORS):
        ProcessSettings.from_env({**base, contract.ENV_EXPECTED_EVALUATORS: "-1"})


def test_torchruns_variables_are_read_with_defaults_and_checked() -> None:
    base = {contract.ENV_SPEC_PATH: "/x.yaml"}
    assert ProcessSettings.from_env(base).torchrun == contract.TorchrunEnv(0, 0, None, False)  # started by hand
    ranked = {**base, "RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", "TORCHELASTIC_RUN_ID": "x"}
    assert ProcessSettings.from_env(ranked).torchrun == contract.TorchrunEnv(3, 1, 4, True)
    for name, raw in (("WORLD_SIZE", "0"), ("WORLD_SIZE", "two"), ("RANK", "-1"), ("LOCAL_RANK", "")):
        with pytest.raises(SettingsError, match=f"{name} must be a"):
            ProcessSettings.from_env({**base, name: raw})


def test_fleet_data_and_trajectory_endpoints_are_read_and_checked() -> None:
    base = {contract.ENV_SPEC_PATH: "/x.yaml"}
    settings = ProcessSettings.from_env(base)
    assert settings.fleet_data is False and settings.trajectory_endpoints == ()
    settings = ProcessSettings.from_env(
        {**base, contract.ENV_FLEET_DATA: "1", contract.ENV_TRAJECTORY_ENDPOINTS: "a-0.a.ns.svc:29700,10.0.0.2:29701"}
    )
    assert settings.fleet_data is True
    assert settings.trajectory_endpoints == ("a-0.a.ns.svc:29700", "10.0.0.2:29701")
    for bad in ("a-0:x", "no-port", "a:1,,b c:2"):
        with pytest.raises(SettingsError, match=contract.ENV_TRAJECTORY_ENDPOINTS):
            ProcessSettings.from_env({**base, contract.ENV_TRAJECTORY_ENDPOINTS: bad})


@pytest.mark.timeout(120)
def test_an_entrypoint_started_as_the_other_role_exits_with_a_clear_error(tmp_path: Path, run_helpers) -> None:
    tiny_manifest = run_helpers[0]
    spec = tmp_path / contract.SPEC_FILE_NAME
    spec.write_text(yaml.safe_dump(tiny_manifest()))
    env = {**os.environ, contract.ENV_SPEC_PATH: str(spec), contract.ENV_ROLE: contract.PolicyRole.TRAIN,
           contract.ENV_EVAL_ORDINAL: "0", "OMP_NUM_THREADS": "1"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "rlightning.runtime.eval"],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=100,
    )
    assert result.returncode == contract.EXIT_BAD_MANIFEST, result.stderr
    assert f"{contract.ENV_ROLE}: is 'train' but this is the 'eval' entrypoint" in result.stderr


def test_the_launcher_tells_the_trainer_how_many_evaluators_it_starts(tmp_path: Path, run_helpers) -> None:
    tiny_manifest = run_helpers[0]
    manifest = PolicyGroupManifest.model_validate(tiny_manifest(eval={"replicas": 3}))
    run = local.LocalRun(manifest, "", RunDir(tmp_path))
    *evals, trainer = run.children()
    assert trainer.env[contract.ENV_EXPECTED_EVALUATORS] == "3"
    assert trainer.env[contract.ENV_ROLE] == contract.PolicyRole.TRAIN
    assert [child.env[contract.ENV_ROLE] for child in evals] == [contract.PolicyRole.EVAL] * 3
    assert RunDir(tmp_path).spec_path.name == contract.SPEC_FILE_NAME
    # An evaluator's grace is the pod's (timeoutSeconds + 15 s), well above its bounded shutdown.
    assert evals[0].grace_seconds == manifest.spec.weight_sync.timeout_seconds + 15
    assert evals[0].grace_seconds > eval_mod.SHUTDOWN_JOIN_SECONDS + 5


class _Fleet:
    """Stands in for a WeightSender's membership: evaluators that register one by one, `gap` seconds apart."""

    def __init__(self, count: int, gap: float) -> None:
        self.count, self.gap, self.start = count, gap, time.monotonic()

    @property
    def members(self) -> list[int]:
        return list(range(min(self.count, 1 + int((time.monotonic() - self.start) / self.gap))))


def _coordinator(fleet: _Fleet, expected: int | None) -> _fleet.Fleet:
    coordinator = object.__new__(_fleet.Fleet)  # only the membership logic; no store, no policy
    coordinator.sender, coordinator.expected = fleet, expected
    return coordinator


@pytest.mark.timeout(60)
def test_in_pods_the_registered_fleet_counts_not_the_spec_replicas() -> None:
    # A pod's spec has no eval.replicas (it validates to 1); 8 evaluators register.
    coordinator = _coordinator(_Fleet(8, gap=0.2), expected=None)
    members = coordinator.settle(timeout=20.0)
    assert members == list(range(8))
    assert coordinator.expected_count() == 8  # consistency needs all 8 on the final weights, not 1


@pytest.mark.timeout(60)
def test_locally_the_launchers_count_counts() -> None:
    coordinator = _coordinator(_Fleet(3, gap=0.2), expected=2)
    assert len(coordinator.settle(timeout=20.0)) >= 2
    assert coordinator.expected_count() == 2
    slow = _coordinator(_Fleet(1, gap=0.2), expected=2)  # one never comes: bounded wait
    started = time.monotonic()
    assert slow.settle(timeout=1.0) == [0]
    assert time.monotonic() - started < 10


def test_the_fencing_epoch_is_the_operators_else_the_attempt() -> None:
    base = {contract.ENV_SPEC_PATH: "/x.yaml", contract.ENV_TRAIN_ATTEMPT: "2"}
    assert ProcessSettings.from_env({contract.ENV_SPEC_PATH: "/x.yaml"}).epoch == 0  # a local run
    assert ProcessSettings.from_env(base).epoch == 2
    stamped = {**base, contract.ENV_TRAIN_EPOCH: str(contract.train_epoch(1796271000, 2))}
    assert ProcessSettings.from_env(stamped).epoch == 1796271000000002
