"""Planner: observed children + desired manifests -> the minimal actions, by table."""

from __future__ import annotations

import copy

import pytest

from rlightning import contract
from rlightning.config import parse_manifest
from rlightning_operator import build_children, plan, with_owner
from rlightning_operator._planner import key

from operator_manifests import edited, example_document

OWNER = {"apiVersion": "rlightning.io/v1alpha1", "kind": "PolicyGroup", "metadata": {"name": "cartpole", "uid": "u-1"}}


def desired(**edit):
    manifest = parse_manifest(edited(example_document(), **edit))
    return [with_owner(child, OWNER) for child in build_children(manifest, "ns")]


def as_observed(children):
    """What the API server returns for created children (plus server fields)."""
    result = {}
    for child in children:
        stored = copy.deepcopy(child)
        stored["metadata"]["uid"] = f"uid-{child['kind']}"
        stored["metadata"]["resourceVersion"] = "1"
        result[key(child)] = stored
    return result


def test_nothing_exists_creates_everything_in_order():
    children = desired()
    actions = plan(children, {})
    assert [(a.type, a.kind) for a in actions] == [("create", c["kind"]) for c in children]
    assert actions[0].body == children[0]


def test_everything_agrees_means_no_action():
    children = desired()
    assert plan(children, as_observed(children)) == []


def test_scaling_across_zero_without_a_data_source_rebuilds_the_trainers():
    # Unset, the data source follows eval.replicas: at 0 the trainers collect their own data (a new launch plan).
    observed = as_observed(desired(**{"spec.train.dataSource": None}))
    actions = plan(desired(**{"spec.train.dataSource": None, "spec.eval.replicas": 0}), observed)
    assert ("recreate", "Job") in [(a.type, a.kind) for a in actions]
    assert plan(desired(**{"spec.train.dataSource": None, "spec.eval.replicas": 7}), observed)[0].type == "scale"


def _observed_with(mutate):
    observed = as_observed(desired())
    mutate(observed)
    return observed


# (name, edit of the spec, mutation of the observed children, expected [(type, kind, body check)])
CASES = [
    ("scale up touches only the StatefulSet's replicas", {"spec.eval.replicas": 10}, None,
     [("scale", "StatefulSet", {"spec": {"replicas": 10}})]),
    ("scale to zero", {"spec.eval.replicas": 0}, None, [("scale", "StatefulSet", {"spec": {"replicas": 0}})]),
    ("max replicas change is not a template change", {"spec.eval.maxReplicas": 5}, None, []),
    ("lr change recreates the Job and rolls the StatefulSet, patches the ConfigMap",
     {"spec.policy.optim": {"lr": 0.00123}}, None, [("patch", "ConfigMap", None), ("recreate", "Job", None),
                                                  ("patch", "StatefulSet", None)]),
    ("eval scheduling change rolls only evaluators", {"spec.eval.pod": {"nodeSelector": {"pool": "cpu"}}}, None,
     [("patch", "ConfigMap", None), ("patch", "StatefulSet", None)]),
    ("a child being deleted is waited for", {},
     lambda o: o[("Job", "cartpole-train")]["metadata"].update(deletionTimestamp="2026-01-01T00:00:00Z"),
     [("wait", "Job", None)]),
    ("a deleted child is created again", {}, lambda o: o.pop(("Service", "cartpole-eval")),
     [("create", "Service", None)]),
    ("a child of another owner is a conflict", {},
     lambda o: o[("ConfigMap", "cartpole-spec")]["metadata"]["ownerReferences"][0].update(uid="other"),
     [("conflict", "ConfigMap", None)]),
    ("an orphan with our content is adopted", {},
     lambda o: o[("Role", "cartpole-runtime")]["metadata"].pop("ownerReferences"),
     [("patch", "Role", None)]),
    ("an orphan Job is adopted, not recreated", {},
     lambda o: o[("Job", "cartpole-train")]["metadata"].pop("ownerReferences"),
     [("patch", "Job", {"metadata": {"ownerReferences": [with_owner({"metadata": {}}, OWNER)["metadata"]
                                                          ["ownerReferences"][0]]}})]),
    ("an adopted Service with a cluster IP is recreated, not patched", {},
     lambda o: o[("Service", "cartpole-eval")]["spec"].update(clusterIP="10.0.0.7"),
     [("recreate", "Service", None)]),
    ("an orphan Service with a cluster IP is recreated on adoption", {},
     lambda o: (o[("Service", "cartpole-train")]["metadata"].pop("ownerReferences"),
                o[("Service", "cartpole-train")]["spec"].update(clusterIP="10.0.0.8")),
     [("recreate", "Service", None)]),
    ("a hand-edited Service is patched back", {},
     lambda o: o[("Service", "cartpole-train")]["metadata"]["annotations"].update({contract.ANNOTATION_SPEC_HASH: "x"}),
     [("patch", "Service", None)]),
]


@pytest.mark.parametrize(("name", "edit", "mutate", "expected"), CASES, ids=[c[0] for c in CASES])
def test_plan_table(name, edit, mutate, expected):
    observed = as_observed(desired())
    if mutate:
        mutate(observed)
    actions = plan(desired(**edit), observed)
    assert [(a.type, a.kind) for a in actions] == [(t, k) for t, k, _ in expected], name
    for action, (_, _, body) in zip(actions, expected, strict=True):
        if body is not None:
            assert action.body == body


def test_statefulset_patch_leaves_immutable_fields_out():
    actions = plan(desired(**{"spec.image": "x:2"}), as_observed(desired()))
    sts = next(a for a in actions if a.kind == "StatefulSet")
    assert sorted(sts.body["spec"]) == ["replicas", "template", "updateStrategy"]
    assert sts.body["metadata"]["ownerReferences"][0]["uid"] == "u-1"


def test_service_recreate_carries_the_headless_manifest():
    observed = as_observed(desired())
    observed[("Service", "cartpole-eval")]["spec"]["clusterIP"] = "10.0.0.7"
    (action,) = plan(desired(), observed)
    assert action.body == next(c for c in desired() if key(c) == ("Service", "cartpole-eval"))
    assert action.body["spec"]["clusterIP"] == "None"


def test_a_patch_removes_what_the_spec_dropped_where_only_the_operator_writes():
    observed = as_observed(desired(**{"spec.eval.pod": {"nodeSelector": {"pool": "cpu"}},
                                      "spec.eval.disruptionBudget": {"maxUnavailable": 1}}))
    service = observed[("Service", "cartpole-train")]
    service["spec"]["clusterIPs"] = ["None"]  # allocated by the API server
    service["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH] = "hand-edited"
    actions = {a.kind: a for a in plan(desired(**{"spec.eval.disruptionBudget": {"minAvailable": 1}}), observed)}
    assert actions["StatefulSet"].body["spec"]["template"]["spec"]["nodeSelector"] is None
    budget = actions["PodDisruptionBudget"].body["spec"]
    assert (budget["maxUnavailable"], budget["minAvailable"]) == (None, 1)
    assert "clusterIPs" not in actions["Service"].body["spec"]  # the server's allocation is kept
