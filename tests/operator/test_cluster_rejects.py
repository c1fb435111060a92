"""The API server rejects invalid PolicyGroups with a message naming the field; pydantic agrees on each."""

from __future__ import annotations

import pytest

from rlightning.config import ManifestError, parse_manifest

from operator_cluster import apply, example

GPU = "nvidia.com/gpu"
# (case, edits of examples/cartpole.yaml, text the API server's message contains)
INVALID = [
    ("negative replicas", {"spec.eval.replicas": -1}, "spec.eval.replicas"),
    ("replicas above max", {"spec.eval.replicas": 5, "spec.eval.maxReplicas": 3}, "minReplicas <= replicas"),
    ("replicas below min", {"spec.eval.replicas": 1, "spec.eval.minReplicas": 2}, "spec.eval.replicas"),
    ("zero trainer nodes", {"spec.train.nodes": 0}, "spec.train.nodes"),
    ("too many procs per node", {"spec.train.procsPerNode": 65}, "spec.train.procsPerNode"),
    ("unknown pull policy", {"spec.imagePullPolicy": "Sometimes"}, "spec.imagePullPolicy"),
    ("missing env", {"spec.env": None}, "spec.env"),
    ("empty env id", {"spec.env.id": ""}, "spec.env.id"),
    ("env count not a number", {"spec.env.numEnvs": "eight"}, "spec.env.numEnvs"),
    ("policy class not an import path", {"spec.policy.policyClass": "not a path"}, "spec.policy.policyClass"),
    ("zero learning rate", {"spec.policy.optim.lr": 0}, "spec.policy.optim.lr"),
    ("unknown optimizer", {"spec.policy.optim.name": "rmsprop"}, "spec.policy.optim.name"),
    ("port out of range", {"spec.ports": {"torchrun": 70000}}, "spec.ports.torchrun"),
    ("clashing ports", {"spec.ports": {"torchrun": 29600, "weightSync": 29600}}, "distinct ports"),
    ("cpu not a quantity", {"spec.train.pod.resources.requests.cpu": "two"}, "spec.train.pod.resources.requests.cpu"),
    ("quantity too long", {"spec.train.pod.resources.limits.cpu": "1" * 65}, "spec.train.pod.resources.limits.cpu"),
    ("memory request above limit",
     {"spec.train.pod.resources": {"requests": {"memory": "2Gi"}, "limits": {"memory": "1Gi"}}},
     "each request must not exceed the limit"),
    ("cpu request above limit in other units",
     {"spec.eval.pod.resources": {"requests": {"cpu": "1500m"}, "limits": {"cpu": "1"}}},
     "spec.eval.pod.resources.requests"),
    ("gpu request differs from limit", {"spec.train.pod.resources": {"requests": {GPU: "1"}, "limits": {GPU: "2"}}},
     "spec.train.pod.resources.requests"),
    ("more GPUs than ranks per trainer pod", {"spec.train.pod.resources": {"limits": {GPU: "4"}}},
     "procsPerNode must equal pod.resources.limits.nvidia.com/gpu"),
    ("an owned field in a pod template", {"spec.eval.template": {"spec": {"containers": [{"name": "eval",
                                                                                          "command": ["sh"]}]}}},
     "spec.eval.template.spec.containers"),
    ("unknown field", {"spec.bogus": 1}, "spec.bogus"),
    ("unknown nested field", {"spec.train.gpus": 1}, "spec.train.gpus"),
    ("zero group size", {"spec.weightSync.groupSize": 0}, "spec.weightSync.groupSize"),
    ("unknown backend", {"spec.weightSync.backend": "mpi"}, "spec.weightSync.backend"),
    ("node selector value not a string", {"spec.eval.pod.nodeSelector": {"pool": 1}},
     "spec.eval.pod.nodeSelector.pool"),
    ("name too long for children", {"metadata.name": "a" * 41}, "metadata.name"),
    ("name not a DNS label", {"metadata.name": "cart.pole"}, "metadata.name"),
]


@pytest.mark.parametrize(("case", "edits", "message"), INVALID, ids=[case for case, _, _ in INVALID])
def test_api_server_rejects_with_the_field(crd, namespace, case, edits, message):
    document = example(**edits)
    result = apply(crd, namespace, document, check=False)
    assert result.returncode != 0, f"{case}: accepted by the API server"
    assert message in result.stderr, f"{case}: {result.stderr}"
    assert crd.kubectl("get", "pg", "-n", namespace, "-o", "name").stdout.strip() == ""
    with pytest.raises(ManifestError):
        parse_manifest(document)


def test_request_equal_to_its_limit_in_other_units_is_accepted(crd, namespace):
    resources = {"requests": {"cpu": "1000m", "memory": "1024Mi"}, "limits": {"cpu": "1", "memory": "1Gi"}}
    document = example(**{"spec.eval.pod.resources": resources})
    parse_manifest(document)
    apply(crd, namespace, document)
    stored = crd.kubectl("get", "pg", "cartpole", "-n", namespace, "-o",
                         "jsonpath={.spec.eval.pod.resources.limits.cpu}")
    assert stored.stdout == "1"


def test_defaults_are_filled_by_the_api_server(crd, namespace):
    apply(crd, namespace, example(**{"spec.weightSync": None, "spec.policy": None}))
    stored = crd.kubectl("get", "pg", "cartpole", "-n", namespace, "-o", "jsonpath={.spec.weightSync.groupSize} "
                         "{.spec.policy.optim.name} {.spec.eval.maxReplicas} {.spec.ports.torchrun}").stdout
    assert stored.split() == ["16", "adam", "1000", "29500"]


def test_explain_describes_fields(crd):
    text = crd.kubectl("explain", "pg.spec.train.nodes").stdout
    assert "Trainer pods (torchrun nodes)" in text
