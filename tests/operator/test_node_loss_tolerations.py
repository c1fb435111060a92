"""The pods tolerate a node that stopped answering for their role's short `unreachableTolerationSeconds` (30 s for
trainers, 60 s for evaluators by default) instead of Kubernetes' 300 s, unless the user's tolerations say otherwise."""

from __future__ import annotations

import pytest

from rlightning.config import ManifestError, parse_manifest
from rlightning_operator import _builders as builders
from rlightning_operator import build_children

from operator_manifests import edited, example_document

NS = "team-a"
UNREACHABLE, NOT_READY = "node.kubernetes.io/unreachable", "node.kubernetes.io/not-ready"


def tolerations(**paths) -> dict[str, list[dict]]:
    """The tolerations of the trainer and evaluator pod templates, by role, for the example edited at `paths`."""
    children = {c["kind"]: c for c in build_children(parse_manifest(edited(example_document(), **paths)), NS)}
    return {
        role: children[kind]["spec"]["template"]["spec"].get("tolerations", [])
        for role, kind in (("train", "Job"), ("eval", "StatefulSet"))
    }


def node_loss(found: list[dict]) -> dict[str, int]:
    """`{taint key: tolerationSeconds}` of the NoExecute tolerations of the node-loss taints in `found`."""
    return {t["key"]: t.get("tolerationSeconds") for t in found if t.get("key") in builders.NODE_LOSS_TAINTS}


# (name, edits, expected {role: {taint: seconds}}, expected first toleration by role when the user gave one)
CASES = [
    ("defaults: trainers 30 s, evaluators 60 s", {},
     {"train": {UNREACHABLE: 30, NOT_READY: 30}, "eval": {UNREACHABLE: 60, NOT_READY: 60}}),
    ("set per role", {"spec.train.unreachableTolerationSeconds": 5, "spec.eval.unreachableTolerationSeconds": 0},
     {"train": {UNREACHABLE: 5, NOT_READY: 5}, "eval": {UNREACHABLE: 0, NOT_READY: 0}}),
    ("the user's toleration of one taint wins; the other is still added",
     {"spec.train.pod": {"tolerations": [{"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute",
                                          "tolerationSeconds": 600}]}},
     {"train": {UNREACHABLE: 600, NOT_READY: 30}, "eval": {UNREACHABLE: 60, NOT_READY: 60}}),
    ("a toleration of every taint adds none (the shortest matching one would win)",
     {"spec.eval.pod": {"tolerations": [{"operator": "Exists"}]}},
     {"train": {UNREACHABLE: 30, NOT_READY: 30}, "eval": {}}),
]  # fmt: skip


@pytest.mark.parametrize(("name", "edits", "expected"), CASES, ids=[c[0] for c in CASES])
def test_node_loss_tolerations_table(name, edits, expected):
    found = tolerations(**edits)
    assert {role: node_loss(found[role]) for role in found} == expected


def test_the_operators_tolerations_are_of_the_noexecute_taints_by_key():
    assert tolerations()["train"] == [
        {"key": NOT_READY, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
        {"key": UNREACHABLE, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30},
    ]


def test_the_users_tolerations_come_first_and_are_kept_as_written():
    gpu = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}
    found = tolerations(**{"spec.train.pod": {"tolerations": [gpu]}})
    assert found["train"][0] == gpu and len(found["train"]) == 3


@pytest.mark.parametrize("role", ["train", "eval"])
def test_a_negative_toleration_is_refused_naming_the_field(role):
    with pytest.raises(ManifestError, match=rf"spec\.{role}\.unreachableTolerationSeconds"):
        parse_manifest(edited(example_document(), **{f"spec.{role}.unreachableTolerationSeconds": -1}))
