"""`rlightning validate` on invalid manifests: exit code 2, one `error: <field>: <rule>` line, no traceback."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cartpole.yaml"


def rlightning(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "rlightning", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=REPO,
    )


def example() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def edited(**changes) -> dict:
    """The example with `changes` applied; keys are dotted camelCase paths, value None deletes."""
    doc = example()
    for path, value in changes.items():
        *parents, leaf = path.split(".")
        node = doc
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(leaf, None)
        else:
            node[leaf] = value
    return doc


def _dump(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "manifest.yaml"
    path.write_text(text)
    return path


CASES = {
    "unknown field": (lambda: yaml.safe_dump(edited(**{"spec.train.numGpus": 2})), "spec.train.numGpus"),
    "negative replicas": (lambda: yaml.safe_dump(edited(**{"spec.eval.replicas": -1})), "spec.eval.replicas"),
    "unknown env id": (lambda: yaml.safe_dump(edited(**{"spec.env.id": "NoSuchEnv-v9"})), "spec.env.id"),
    "unknown policy class": (
        lambda: yaml.safe_dump(edited(**{"spec.policy.policyClass": "rlightning.policy.ppo:NoSuchPolicy"})),
        "spec.policy.policyClass",
    ),
    "unknown policy module": (
        lambda: yaml.safe_dump(edited(**{"spec.policy.policyClass": "no_such_module.sub:Policy"})),
        "spec.policy.policyClass",
    ),
    "not a policy class": (
        lambda: yaml.safe_dump(edited(**{"spec.policy.policyClass": "collections:OrderedDict"})),
        "spec.policy.policyClass",
    ),
    "bad policy kwargs": (
        lambda: yaml.safe_dump(edited(**{"spec.policy.policyKwargs.clipCoeff": 0.2})),
        "spec.policy.policyKwargs.clipCoeff",
    ),
    "bad YAML": (lambda: "apiVersion: rlightning.io/v1alpha1\nkind: [PolicyGroup\n", "not valid YAML"),
    "two documents": (lambda: EXAMPLE.read_text() + "\n---\n" + EXAMPLE.read_text(), "expected one YAML document"),
    "wrong kind": (lambda: yaml.safe_dump(edited(kind="Deployment")), "kind"),
    "wrong apiVersion": (lambda: yaml.safe_dump(edited(apiVersion="rlightning.io/v1")), "apiVersion"),
    "missing env": (lambda: yaml.safe_dump(edited(**{"spec.env": None})), "spec.env"),
    "integer as a string": (lambda: yaml.safe_dump(edited(**{"spec.env.numEnvs": "4"})), "spec.env.numEnvs"),
    "integer as a boolean": (lambda: yaml.safe_dump(edited(**{"spec.env.numEnvs": True})), "spec.env.numEnvs"),
    "continuous-action policy, Discrete env": (
        lambda: yaml.safe_dump(
            edited(**{"spec.policy.policyClass": "rlightning.policy.sac:SACPolicy", "spec.policy.policyKwargs": {}})
        ),
        "spec.policy.policyClass: SACPolicy supports action spaces Box, got Discrete(2) (CartPole-v1)",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_invalid_manifest_exits_2_naming_the_field(case: str, tmp_path: Path) -> None:
    make_text, needle = CASES[case]
    result = rlightning("validate", str(_dump(tmp_path, make_text())))
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "Traceback" not in output
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors, output
    assert any(needle in line for line in errors), output


def test_missing_file(tmp_path: Path) -> None:
    result = rlightning("validate", str(tmp_path / "absent.yaml"))
    assert result.returncode == 2
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.startswith("error: ") and "absent.yaml: no such file" in result.stderr


def test_run_validates_first(tmp_path: Path) -> None:
    path = _dump(tmp_path, yaml.safe_dump(edited(**{"spec.env.id": "NoSuchEnv-v9"})))
    result = rlightning("run", str(path), "--run-dir", str(tmp_path / "run"))
    assert result.returncode == 2
    assert "error: spec.env.id:" in result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert not (tmp_path / "run").exists()


def test_every_problem_gets_a_line(tmp_path: Path) -> None:
    doc = edited(**{"spec.eval.replicas": -1, "spec.train.rolloutSteps": 0, "spec.extra": 1})
    result = rlightning("validate", str(_dump(tmp_path, yaml.safe_dump(doc))))
    assert result.returncode == 2
    errors = result.stderr.splitlines()
    for field in ("spec.eval.replicas", "spec.train.rolloutSteps", "spec.extra"):
        assert any(line.startswith(f"error: {field}:") for line in errors), result.stderr


NOT_MANIFESTS = {
    "Latin-1": (EXAMPLE.read_text().replace("# CartPole", "# Caf\u00e9 CartPole").encode("latin-1"), "not UTF-8 text"),
    "binary": (bytes(range(256)) * 8, "not UTF-8 text"),
    "binary that is UTF-8": (b"\x7fELF\x02\x01\x01\x00\x00\x00", "not valid YAML at line 1: control character"),
    "not YAML": (b"spec: {env: [\n", "not valid YAML"),
    "a scalar": (b"hello\n", "<root>: expected a mapping"),
}


@pytest.mark.parametrize("command", ["validate", "run"])
@pytest.mark.parametrize("case", sorted(NOT_MANIFESTS))
def test_a_file_of_any_encoding_or_content_gets_one_error_line(case: str, command: str, tmp_path: Path) -> None:
    content, needle = NOT_MANIFESTS[case]
    path = tmp_path / "manifest.yaml"
    path.write_bytes(content)
    result = rlightning(command, str(path), *(["--run-dir", str(tmp_path / "run")] if command == "run" else []))
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stdout + result.stderr
    assert result.stderr.splitlines() == [result.stderr.splitlines()[0]] and result.stderr.startswith("error: ")
    assert needle in result.stderr, result.stderr
    assert not (tmp_path / "run").exists()


def test_a_paused_fleet_is_valid_but_not_runnable_locally(tmp_path: Path) -> None:
    # train.dataSource fleet (the example's) with no evaluator: in a cluster a paused fleet, locally a hang.
    path = _dump(tmp_path, yaml.safe_dump(edited(**{"spec.eval.replicas": 0})))
    checked = rlightning("validate", str(path))
    assert checked.returncode == 0, checked.stderr
    notes = [line for line in checked.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and "spec.eval.replicas" in notes[0] and "paused fleet" in notes[0], checked.stdout
    ran = rlightning("run", str(path), "--run-dir", str(tmp_path / "run"))
    assert ran.returncode == 2 and "Traceback" not in ran.stdout + ran.stderr
    assert ran.stderr.startswith("error: spec.eval.replicas: 0 evaluators") and "wait for data forever" in ran.stderr
    assert not (tmp_path / "run").exists()


def test_a_local_run_says_it_ignores_pod_templates(tmp_path: Path) -> None:
    # Notes come before the local checks: a paused fleet ends the run before anything starts.
    template = {"spec": {"volumes": [{"name": "assets", "configMap": {"name": "assets"}}]}}
    path = _dump(tmp_path, yaml.safe_dump(edited(**{"spec.eval.replicas": 0, "spec.eval.template": template})))
    ran = rlightning("run", str(path), "--run-dir", str(tmp_path / "run"))
    assert ran.returncode == 2
    notes = [line for line in ran.stdout.splitlines() if line.startswith("note: ")]
    assert len(notes) == 1 and notes[0].startswith("note: spec.eval.template: pods only; `rlightning run` ignores it")
