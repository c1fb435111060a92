"""A user's own policy package (examples/custom_policy): validated, trained with evaluators in sync, and rejected
with one line naming spec.policy.policyClass when the class path is wrong or the class is not a BasePolicy.

The package is made importable with PYTHONPATH, as README.md describes for a local run (never pip-installed here).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from rlightning.runtime.rundir import RunDir, read_jsonl

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "examples" / "custom_policy"
MANIFEST = PACKAGE / "policygroup.yaml"
POLICY_CLASS = "reinforce_policy.policy:ReinforcePolicy"


@pytest.fixture
def package_on_path(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """PYTHONPATH with the example package, for this process's children (rlightning and the pods it starts)."""
    path = os.pathsep.join(p for p in (str(PACKAGE), os.environ.get("PYTHONPATH", "")) if p)
    monkeypatch.setenv("PYTHONPATH", path)
    return {**os.environ, "PYTHONPATH": path}


def _rlightning(env: dict[str, str], *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlightning", *args], capture_output=True, text=True, timeout=120, cwd=REPO, env=env
    )


def test_the_package_manifest_validates(package_on_path: dict[str, str]) -> None:
    result = _rlightning(package_on_path, "validate", str(MANIFEST))
    assert result.returncode == 0, result.stdout + result.stderr
    assert POLICY_CLASS in result.stdout


WRONG_CLASSES = {
    "missing class": ("reinforce_policy.policy:NoSuchPolicy", "has no attribute 'NoSuchPolicy'"),
    "missing module": ("reinforce_policy.no_such:ReinforcePolicy", "cannot import module 'reinforce_policy.no_such'"),
    "not a BasePolicy": ("reinforce_policy.policy:PolicyNetwork", "is not a subclass of rlightning.policy.BasePolicy"),
    "no colon": ("reinforce_policy.policy.ReinforcePolicy", "String should match pattern"),
}


@pytest.mark.parametrize(
    ("command", "case"),
    [("validate", case) for case in WRONG_CLASSES] + [("run", "missing class"), ("run", "not a BasePolicy")],
)
def test_a_wrong_policy_class_is_one_line_and_exit_2(
    command: str, case: str, package_on_path: dict[str, str], tmp_path: Path
) -> None:
    policy_class, rule = WRONG_CLASSES[case]
    doc = yaml.safe_load(MANIFEST.read_text())
    doc["spec"]["policy"]["policyClass"] = policy_class
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(doc))
    args = ["--run-dir", str(tmp_path / "run"), "--plain"] if command == "run" else []
    result = _rlightning(package_on_path, command, str(path), *args)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    errors = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(errors) == 1 and errors[0].startswith("error: spec.policy.policyClass: ") and rule in errors[0], errors
    assert not (tmp_path / "run").exists()  # nothing was started


def test_a_package_that_fails_to_import_is_one_line_too(package_on_path: dict[str, str], tmp_path: Path) -> None:
    (tmp_path / "broken_policy.py").write_text('raise RuntimeError("first line\\nsecond line")\n')
    doc = yaml.safe_load(MANIFEST.read_text())
    doc["spec"]["policy"]["policyClass"] = "broken_policy:Policy"
    path = tmp_path / "manifest.yaml"
    path.write_text(yaml.safe_dump(doc))
    env = {**package_on_path, "PYTHONPATH": os.pathsep.join([str(tmp_path), package_on_path["PYTHONPATH"]])}
    result = _rlightning(env, "validate", str(path))
    assert result.returncode == 2 and "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == ["error: spec.policy.policyClass: first line second line"], result.stderr


@pytest.mark.slow
def test_the_package_policy_trains_with_evaluators_in_sync(
    tmp_path: Path, write_manifest, run_helpers, package_on_path: dict[str, str]
) -> None:
    tiny_manifest, start_run, finish = run_helpers
    package_spec = yaml.safe_load(MANIFEST.read_text())["spec"]
    doc = tiny_manifest(
        name="reinforce", total_env_steps=2048, policy=package_spec["policy"], eval={"evaluationIntervalSeconds": 0}
    )
    run = RunDir(tmp_path / "run")
    code, out = finish(start_run(write_manifest(doc), run.root))
    assert code == 0, out
    summary, rows = json.loads(run.summary_path.read_text()), read_jsonl(run.metrics_path)
    assert summary["stop_reason"] == "total_env_steps" and summary["iterations"] >= 4, summary
    assert summary["consistent"] is True, str(summary)  # every evaluator holds the final weights bit for bit
    assert all(row["consistent"] is not False for row in rows), rows  # no iteration found a mismatch
    assert sum(summary["env_steps_by_evaluator"].values()) == summary["env_steps"]  # the evaluators' data
    assert {e["applied_version"] for e in summary["evaluators"].values()} == {summary["weight_version"]}
    checkpoint = max(run.root.glob("checkpoints/*"))
    assert torch.load(checkpoint, weights_only=True)["policy_class"] == POLICY_CLASS
