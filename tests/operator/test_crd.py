"""The generated CRD: shape, structural-schema rules, descriptions, CEL rules, and drift of the checked-in copy."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from rlightning import contract
from rlightning.config import build_crd, crd_yaml

CHECKED_IN = Path(__file__).resolve().parents[2] / "crds" / f"{contract.CRD_NAME}.yaml"


def _walk(node, path="$"):
    """Yield (path, schema node) for every node of an OpenAPI schema."""
    yield path, node
    for name, child in (node.get("properties") or {}).items():
        yield from _walk(child, f"{path}.{name}")
    if isinstance(node.get("items"), dict):
        yield from _walk(node["items"], f"{path}[]")
    if isinstance(node.get("additionalProperties"), dict):
        yield from _walk(node["additionalProperties"], f"{path}{{}}")


@pytest.fixture(scope="module")
def version():
    return build_crd()["spec"]["versions"][0]


def test_checked_in_crd_matches_the_models():
    assert CHECKED_IN.read_text() == crd_yaml(), "crds/ is stale: run `make crd`"


def test_names_group_and_version():
    crd = build_crd()
    assert crd["metadata"]["name"] == "policygroups.rlightning.io"
    spec = crd["spec"]
    assert spec["group"] == "rlightning.io" and spec["scope"] == "Namespaced"
    assert spec["names"] == {
        "kind": "PolicyGroup",
        "listKind": "PolicyGroupList",
        "plural": "policygroups",
        "singular": "policygroup",
        "shortNames": ["pg"],
        "categories": ["rlightning"],
    }
    assert [(v["name"], v["served"], v["storage"]) for v in spec["versions"]] == [("v1alpha1", True, True)]


def test_subresources_and_printer_columns(version):
    assert version["subresources"] == {
        "status": {},
        "scale": {
            "specReplicasPath": ".spec.eval.replicas",
            "statusReplicasPath": ".status.replicas",
            "labelSelectorPath": ".status.selector",
        },
    }
    columns = {c["name"]: c["jsonPath"] for c in version["additionalPrinterColumns"]}
    assert columns == {
        "Phase": ".status.phase",
        "Trainers": ".status.train.summary",
        "Evaluators": ".status.eval.summary",
        "Restarts": ".status.restarts.total",
        "Weights": ".status.training.weightVersion",
        "Consistent": ".status.training.consistent",
        "Steps/s": ".status.training.envStepsPerSecond",
        "Lag": ".status.training.policyLagMean",
        "Reason": '.status.conditions[?(@.type=="Ready")].reason',
        "Age": ".metadata.creationTimestamp",
    }


def test_schema_is_structural(version):
    schema = version["schema"]["openAPIV3Schema"]
    text = yaml.safe_dump(schema)
    assert "$ref" not in text and "anyOf" not in text and "title" not in text and "const" not in text
    for path, node in _walk(schema):
        if path == "$.metadata":
            continue
        if node.get("x-kubernetes-int-or-string"):  # Kubernetes IntOrString: the one kind without a type
            assert "type" not in node, path
            continue
        assert "type" in node, f"{path} has no type"
        if node["type"] == "object" and "properties" not in node:
            assert node.get("x-kubernetes-preserve-unknown-fields") or "additionalProperties" in node, path
        if "exclusiveMinimum" in node:
            assert node["exclusiveMinimum"] is True and "minimum" in node, path


def test_every_field_is_described(version):
    schema = version["schema"]["openAPIV3Schema"]
    for path, node in _walk(schema):
        if path.endswith("[]") or path.endswith("{}") or path == "$.metadata":
            continue
        assert node.get("description"), f"{path} has no description (kubectl explain shows nothing)"


def test_free_form_maps_only_where_expected(version):
    schema = version["schema"]["openAPIV3Schema"]
    preserved = sorted(path for path, node in _walk(schema) if node.get("x-kubernetes-preserve-unknown-fields"))
    # A pod template declares only what its CEL rules read and keeps the rest of a PodTemplateSpec as written.
    templates = [path for path in preserved if ".template.spec" in path]
    assert "$.spec.train.template.spec" in templates and "$.spec.eval.template.spec.containers[]" in templates
    assert not any(".template.metadata" in path for path in preserved), "template metadata is labels and annotations"
    assert [path for path in preserved if path not in templates] == [
        "$.spec.env.kwargs",
        "$.spec.eval.pod.affinity",
        "$.spec.eval.pod.tolerations[]",
        "$.spec.policy.policyKwargs",
        "$.spec.train.pod.affinity",
        "$.spec.train.pod.tolerations[]",
    ]


def test_defaults_ranges_enums_and_nullable(version):
    spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
    replicas = spec["properties"]["eval"]["properties"]["replicas"]
    assert replicas["default"] == 1 and replicas["minimum"] == 0
    assert spec["properties"]["eval"]["default"]["replicas"] == 1, "nested defaults need a present parent"
    assert spec["properties"]["eval"]["default"]["pod"]["resources"] == {}
    assert "default" not in spec["properties"]["env"], "a required field has no default"
    assert spec["required"] == ["env"]
    assert spec["properties"]["imagePullPolicy"]["enum"] == ["Always", "IfNotPresent", "Never"]
    lr = spec["properties"]["policy"]["properties"]["optim"]["properties"]["lr"]
    assert lr["minimum"] == 0 and lr["exclusiveMinimum"] is True
    steps = spec["properties"]["env"]["properties"]["maxEpisodeSteps"]
    assert steps["nullable"] is True and steps["type"] == "integer" and "default" not in steps
    status = version["schema"]["openAPIV3Schema"]["properties"]["status"]
    assert not any("default" in node for _, node in _walk(status)), "status holds only what its writers wrote"


def test_cel_rules_cover_cross_field_checks(version):
    schema = version["schema"]["openAPIV3Schema"]
    rules = {path: [r["rule"] for r in node["x-kubernetes-validations"]]
             for path, node in _walk(schema) if "x-kubernetes-validations" in node}
    assert "minReplicas <= self.replicas" in rules["$.spec.eval"][0]
    assert "nvidia.com/gpu" in rules["$.spec.train.pod.resources"][0]
    assert "quantity(self.requests[name]).isGreaterThan" in rules["$.spec.train.pod.resources"][1]
    assert "self.torchrun != self.weightSync" in rules["$.spec.ports"][0]
    assert any("size(self.metadata.name)" in rule for rule in rules["$"])
    assert "self.ports.trajectories + self.train.procsPerNode" in rules["$.spec"][0]  # the intakes' port range
    assert "self.policy.rolloutMode == 'async'" in rules["$.spec"][1] and "self.env.numEnvs" in rules["$.spec"][2]
    assert "name.matches('^NCCL_" in rules["$.spec"][3]
    assert any("asInteger() == self.procsPerNode" in rule for rule in rules["$.spec.train"])
    for role in ("train", "eval"):
        assert any(f"c.name != '{role}'" in rule and "!has(c.command)" in rule for rule in rules[f"$.spec.{role}"])
