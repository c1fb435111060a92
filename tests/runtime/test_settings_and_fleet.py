"""The process environment (role, expected evaluators) and how trainer rank 0 counts its evaluator fleet."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from types import SimpleNamespace
from pathlib import Path

import pytest
import yaml

from rlightning import contract, launch
from rlightning.config import PolicyGroupManifest
from rlightning.runtime import eval as eval_mod
from rlightning.runtime import _datasets, _fleet, local
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
def test_an_evaluator_sends_batches_only_when_the_fleet_produces_the_data() -> None:
    base = {contract.ENV_SPEC_PATH: "/x.yaml", contract.ENV_TRAJECTORY_ENDPOINTS: "127.0.0.1:1,127.0.0.1:2"}

    def held() -> tuple[int, dict]:
        return 0, {}

    own = ProcessSettings.from_env({**base, contract.ENV_FLEET_DATA: "0"})
    assert _datasets.open_sink(own, 3, batch_credits=2, ack_timeout=5.0, held_weights=held) is None
    fleet = ProcessSettings.from_env({**base, contract.ENV_FLEET_DATA: "1"})
    sink = _datasets.open_sink(fleet, 3, batch_credits=1, ack_timeout=5.0, held_weights=held)
    assert sink is not None
    try:
        assert (sink.ordinal, sink.credits, sink.ack_timeout) == (3, 1, 5.0)
        assert [rank.endpoint for rank in sink._ranks] == ["127.0.0.1:1", "127.0.0.1:2"]
    finally:
        sink.close()


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


def test_local_children_give_up_on_a_lost_dns_reply_after_a_second_unless_told_otherwise(
    tmp_path: Path, run_helpers, monkeypatch
) -> None:
    manifest = PolicyGroupManifest.model_validate(run_helpers[0]())
    monkeypatch.delenv(launch.RESOLVER_ENV, raising=False)
    children = local.LocalRun(manifest, "", RunDir(tmp_path)).children()
    assert {child.env[launch.RESOLVER_ENV] for child in children} == {launch.LOCAL_RESOLVER_OPTIONS}
    monkeypatch.setenv(launch.RESOLVER_ENV, "timeout:3 attempts:4")  # the user's own resolver options stay
    children = local.LocalRun(manifest, "", RunDir(tmp_path)).children()
    assert {child.env[launch.RESOLVER_ENV] for child in children} == {"timeout:3 attempts:4"}


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


def test_an_evaluator_asked_for_its_share_reports_it_and_otherwise_a_whole_report() -> None:
    record = eval_mod.EvaluationRecord(episodes_per_report=5)
    assert record.add(400.0, before=3, after=3) is None  # 1 of 5, nothing asked
    assert record.missing(7, enough=1) == 1 and record.missing(3, enough=2) == 1 and record.missing(3) == 4
    report = record.add(500.0, before=7, after=7, enough=1)  # rank 0 asked 1 episode of version 7 of each
    assert report is not None and (report["return_version"], report["version_return"]) == (7.0, 500.0)
    assert report["version_episodes"] == 1.0 and record.complete(7, enough=1) and not record.complete(7)
    assert record.add(450.0, before=6, after=7) is None  # began on 6: not an episode of version 7 alone
    for episode_return in (300.0, 300.0, 300.0):
        report = record.add(episode_return, before=7, after=7)
    assert report is None  # 4 pure episodes of version 7: no whole report yet, and not the share asked before
    report = record.add(300.0, before=7, after=7)
    assert report is not None and report["version_episodes"] == 5.0 and report["version_return"] == 340.0


class _Reports:
    """Stands in for a WeightSender's version and its evaluators' reports."""

    def __init__(self, version: int, metrics: dict[int, dict[str, float]]) -> None:
        self.version, self.metrics = version, metrics

    def reports(self) -> dict[int, SimpleNamespace]:
        return {ordinal: SimpleNamespace(metrics=m) for ordinal, m in self.metrics.items()}


def test_rank_zero_splits_the_confirmation_over_the_fleet_and_weighs_each_report_by_its_episodes() -> None:
    reports = _Reports(9, {})
    fleet = _coordinator(reports, expected=None)
    fleet.live = [0, 1, 2]
    assert fleet.evaluation_share(5) == 2  # 3 evaluators x 2 >= 5 episodes of the version together
    fleet.live = []
    assert fleet.evaluation_share(5) == 5
    on_nine = {"return_version": 9.0, "version_return": 500.0, "version_episodes": 2.0}
    reports.metrics = {
        0: on_nine, 1: {**on_nine, "version_return": 200.0, "version_episodes": 5.0},  # a whole report counts too
        2: {**on_nine, "version_episodes": 1.0},  # fewer than its share: not yet
    }
    fleet.live = [0, 1, 2]
    assert fleet.wait_for_newest(timeout=0.3, share=2) is None
    reports.metrics[2] = {**on_nine, "return_version": 8.0}  # of an older version: not yet
    assert fleet.wait_for_newest(timeout=0.3, share=2) is None
    reports.metrics[2] = on_nine
    assert fleet.wait_for_newest(timeout=5.0, share=2) == (2 * 500 + 5 * 200 + 2 * 500) / 9
