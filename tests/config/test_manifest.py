"""Loading PolicyGroup manifests: defaults, both key spellings, and one named line per problem."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rlightning.config import ManifestError, PolicyGroupSpec, load_manifest, parse_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml"


@pytest.fixture
def document() -> dict:
    return yaml.safe_load(EXAMPLE.read_text())


def test_example_loads_with_defaults(document):
    manifest = parse_manifest(document)
    assert manifest.metadata.name == "cartpole"
    assert manifest.spec.train.world_size == 1
    assert manifest.spec.eval.replicas == 2
    assert manifest.spec.weight_sync.backend == "auto"  # default filled in
    assert manifest.spec.policy.optim_cfg is manifest.spec.policy.optim


def test_snake_case_and_camel_case_are_the_same_field():
    camel = PolicyGroupSpec.model_validate({"env": {"id": "CartPole-v1", "numEnvs": 3}})
    snake = PolicyGroupSpec.model_validate({"env": {"id": "CartPole-v1", "num_envs": 3}})
    assert camel == snake
    assert camel.model_dump(by_alias=True)["env"]["numEnvs"] == 3


def test_policy_kwargs_stay_free_form(document):
    document["spec"]["policy"]["policyKwargs"]["anythingGoes"] = {"nested": [1, 2]}
    assert parse_manifest(document).spec.policy.policy_kwargs["anythingGoes"] == {"nested": [1, 2]}


@pytest.mark.parametrize(
    ("path", "value", "expected"),
    [
        (("spec", "train", "nodez"), 1, "spec.train.nodez: unknown field"),
        (("spec", "eval", "replicas"), -1, "spec.eval.replicas: Input should be greater than or equal to 0"),
        (("spec", "eval", "replicas"), 2000, "spec.eval.replicas: must satisfy minReplicas"),
        (("spec", "train", "nodes"), 0, "spec.train.nodes: Input should be greater than or equal to 1"),
        (("spec", "weightSync", "backend"), "mpi", "spec.weightSync.backend: Input should be 'auto', 'gloo' or 'nccl'"),
        (("spec", "policy", "policyClass"), "no colon", "spec.policy.policyClass: String should match pattern"),
        (("spec", "train", "pod", "tolerations"), [1],
         "spec.train.pod.tolerations[0]: Input should be a valid dictionary"),
        (("spec", "eval", "pod", "resources", "limits"), {"cpu": "lots"},
         "spec.eval.pod.resources.limits.cpu: 'lots' is not a Kubernetes quantity"),
        (("spec", "eval", "pod", "resources", "limits"), {"cpu": "1.2.3"},
         "spec.eval.pod.resources.limits.cpu: '1.2.3'"),
        (("spec", "eval", "pod", "resources", "limits"), {"cpu": "1" * 65},
         "spec.eval.pod.resources.limits.cpu: '111"),
        (("spec", "eval", "pod", "resources", "requests"), {f"example.com/r{i}": "1" for i in range(33)},
         "spec.eval.pod.resources.requests: Dictionary should have at most 32 items"),
        (("spec", "train", "pod", "resources", "limits"), {"memory": "1Gi"},
         "spec.train.pod.resources.requests.memory: must not exceed limits.memory"),
        (("spec", "ports"), {"trajectories": 29500}, "spec.ports.trajectories: ports 29500.."),
        (("spec", "train", "maxPolicyLag"), -1, "spec.train.maxPolicyLag: Input should be greater than or equal to 0"),
        (("spec", "train", "batchesPerUpdate"), 0,
         "spec.train.batchesPerUpdate: Input should be greater than or equal to 1"),
        (("spec", "eval", "evaluationIntervalSeconds"), -1,
         "spec.eval.evaluationIntervalSeconds: Input should be greater than or equal to 0"),
        (("metadata", "name"), "Bad_Name", "metadata.name: String should match pattern"),
        (("kind",), "Deployment", "kind: Input should be 'PolicyGroup', got string \"Deployment\""),
        (("apiVersion",), "rlightning.io/v2", "apiVersion: Input should be 'rlightning.io/v1alpha1'"),
    ],
)
def test_each_problem_names_its_field(document, path, value, expected):
    broken = copy.deepcopy(document)
    target = broken
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(ManifestError) as raised:
        parse_manifest(broken)
    assert any(line.startswith(expected) for line in raised.value.problems), raised.value.problems


def test_every_problem_is_reported_at_once(document):
    document["spec"]["train"]["nodez"] = 1
    document["spec"]["eval"]["replicas"] = -1
    with pytest.raises(ManifestError) as raised:
        parse_manifest(document)
    assert len(raised.value.problems) == 2


def test_missing_file_and_bad_yaml_and_two_documents(tmp_path):
    with pytest.raises(ManifestError, match="no such file"):
        load_manifest(tmp_path / "absent.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("spec: [unclosed\n")
    with pytest.raises(ManifestError, match="not valid YAML at line"):
        load_manifest(bad)
    two = tmp_path / "two.yaml"
    two.write_text(EXAMPLE.read_text() + "\n---\n" + EXAMPLE.read_text())
    with pytest.raises(ManifestError, match="expected one YAML document, found 2"):
        load_manifest(two)
    scalar = tmp_path / "scalar.yaml"
    scalar.write_text("42\n")
    with pytest.raises(ManifestError, match="expected a mapping"):
        load_manifest(scalar)
