"""Builders: pure, deterministic manifests of every child, with the fields the runtime and Kubernetes need."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from rlightning import contract
from rlightning.config import ManifestError, parse_manifest
from rlightning_operator import _builders as builders
from rlightning_operator import build_children, with_owner

from operator_manifests import edited, example, example_document  # noqa: F401 (fixture)

NS = "team-a"


_ONE_PER_ROLE = ("Service", "PodDisruptionBudget")


def _by_kind(children):
    return {child["kind"]: child for child in children if child["kind"] not in _ONE_PER_ROLE} | {
        f"{child['kind']}/{child['metadata']['name']}": child for child in children if child["kind"] in _ONE_PER_ROLE
    }


def _container(workload):
    return workload["spec"]["template"]["spec"]["containers"][0]


def _env(workload):
    return {item["name"]: item.get("value", item.get("valueFrom")) for item in _container(workload)["env"]}


def test_children_names_kinds_and_labels(example):
    children = build_children(example, NS)
    assert [(c["kind"], c["metadata"]["name"]) for c in children] == [
        ("ConfigMap", "cartpole-spec"),
        ("ServiceAccount", "cartpole-runtime"),
        ("Role", "cartpole-runtime"),
        ("RoleBinding", "cartpole-runtime"),
        ("PodDisruptionBudget", "cartpole-train"),
        ("PodDisruptionBudget", "cartpole-eval"),
        ("Service", "cartpole-train"),
        ("Job", "cartpole-train"),
        ("Service", "cartpole-eval"),
        ("StatefulSet", "cartpole-eval"),
    ]
    for child in children:
        assert child["metadata"]["namespace"] == NS
        assert child["metadata"]["labels"][contract.LABEL_GROUP] == "cartpole"
        assert child["metadata"]["labels"][contract.LABEL_MANAGED_BY] == contract.MANAGED_BY_VALUE
        assert child["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH]


def _rich_document(reverse: bool) -> dict:
    """The example with mappings a user writes in any order (metadata, node selector, resources), in file order or
    reversed."""

    def order(mapping: dict) -> dict:
        return dict(reversed(mapping.items())) if reverse else mapping

    document = example_document()
    document["metadata"]["labels"] = order({"team": "rl", "app": "cartpole", "tier": "train"})
    document["metadata"]["annotations"] = order({"owner": "a@example.com", "budget": "b-1"})
    pod = document["spec"]["train"]["pod"]
    pod["nodeSelector"] = order({"pool": "cpu", "zone": "z1", "arch": "amd64"})
    pod["resources"] = {name: order(value) for name, value in order(pod["resources"]).items()}
    return document


_BUILD_IN_A_PROCESS = """
import json, sys
from rlightning.config import parse_manifest
from rlightning_operator import build_children
print(json.dumps(build_children(parse_manifest(json.loads(sys.stdin.read())), sys.argv[1])))
"""


def test_deterministic_whatever_the_input_order_and_the_hash_seed():
    # Byte-for-byte (dict order included): a rebuilt child that differs only in order is still a change to
    # the API server, and a list or mapping built from a set or from the user's order would show here.
    forward = json.dumps(build_children(parse_manifest(_rich_document(reverse=False)), NS))
    assert json.dumps(build_children(parse_manifest(_rich_document(reverse=True)), NS)) == forward
    for seed, reverse in (("1", False), ("2", True)):
        built = subprocess.run(
            [sys.executable, "-c", _BUILD_IN_A_PROCESS, NS], input=json.dumps(_rich_document(reverse)),
            capture_output=True, text=True, timeout=60, check=True, env={**os.environ, "PYTHONHASHSEED": seed},
        )
        assert built.stdout.strip() == forward, f"PYTHONHASHSEED={seed} builds other children"


def test_children_are_plain_data(example):
    import yaml

    children = build_children(example, NS)
    assert yaml.safe_load(yaml.safe_dump(children)) == children  # no enum or other object leaks into a manifest


def test_config_map_holds_the_validated_manifest(example):
    import yaml

    data = _by_kind(build_children(example, NS))["ConfigMap"]["data"]
    document = yaml.safe_load(data[contract.SPEC_FILE_NAME])
    expected = example.spec.model_copy(update={"eval": example.spec.eval.model_copy(update={"replicas": 1})})
    assert parse_manifest(document).spec == expected
    scaling = {"replicas", "minReplicas", "maxReplicas"}
    assert not scaling & set(document["spec"]["eval"]), "scaling is not in the spec file"


def test_role_grants_only_this_groups_status(example):
    children = _by_kind(build_children(example, NS))
    assert children["Role"]["rules"] == [
        {"apiGroups": ["rlightning.io"], "resources": ["policygroups/status"], "resourceNames": ["cartpole"],
         "verbs": ["get", "patch"]}
    ]
    subject = {"kind": "ServiceAccount", "name": "cartpole-runtime", "namespace": NS}
    assert children["RoleBinding"]["subjects"] == [subject]
    assert children["RoleBinding"]["roleRef"]["name"] == "cartpole-runtime"


def test_trainer_job_and_headless_service(example):
    children = _by_kind(build_children(example, NS))
    job, service = children["Job"], children["Service/cartpole-train"]
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    assert service["spec"]["selector"] == {contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "train"}
    assert {p["name"]: p["port"] for p in service["spec"]["ports"]} == {"torchrun": 29500, "weight-sync": 29600,
                                                                      "trajectories": 29700, "metrics": 9400}
    spec = job["spec"]
    counts = (spec["completionMode"], spec["completions"], spec["parallelism"], spec["backoffLimit"],
              spec["podReplacementPolicy"])
    assert counts == ("Indexed", 1, 1, 0, "Failed")  # no retry inside an attempt: the operator restarts the gang
    pod = spec["template"]["spec"]
    assert pod["subdomain"] == "cartpole-train" and pod["restartPolicy"] == "Never"
    assert pod["serviceAccountName"] == "cartpole-runtime"
    master = "cartpole-train-0.cartpole-train.team-a.svc"
    assert _container(job)["command"] == [
        "python", "-m", "torch.distributed.run", "--nnodes=1", "--nproc-per-node=1",
        "--node-rank=$(JOB_COMPLETION_INDEX)", f"--master-addr={master}", "--master-port=29500", "--max-restarts=0",
        "--monitor-interval=0.5", "-m", "rlightning.runtime.train",
    ]
    env = _env(job)
    assert env[contract.ENV_TRAIN_MASTER_ADDR] == master
    assert env[contract.ENV_ROLE] == "train" and env[contract.ENV_REPORT_STATUS] == "1"
    assert env[contract.ENV_SPEC_PATH] == f"{contract.SPEC_MOUNT_DIR}/{contract.SPEC_FILE_NAME}"
    mounts = {m["name"]: m["mountPath"] for m in _container(job)["volumeMounts"]}
    assert mounts["spec"] == contract.SPEC_MOUNT_DIR
    assert _container(job)["resources"] == {"requests": {"cpu": "1", "memory": "2Gi"}, "limits": {"memory": "2Gi"}}
    template_annotations = spec["template"]["metadata"]["annotations"]
    assert template_annotations[contract.ANNOTATION_SPEC_HASH] == job["metadata"]["annotations"][
        contract.ANNOTATION_SPEC_HASH]


def test_evaluator_statefulset(example):
    children = _by_kind(build_children(example, NS))
    sts = children["StatefulSet"]
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert sts["spec"]["serviceName"] == "cartpole-eval"
    assert sts["spec"]["selector"]["matchLabels"] == {contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "eval"}
    assert _container(sts)["command"] == ["python", "-m", "rlightning.runtime.eval"]
    env = _env(sts)
    assert env[contract.ENV_POD_NAME] == {"fieldRef": {"fieldPath": "metadata.name"}}
    assert env[contract.ENV_TRAIN_MASTER_ADDR] == "cartpole-train-0.cartpole-train.team-a.svc"
    assert contract.ENV_REPORT_STATUS not in env


# (edit, does the trainers' template change?, does the evaluators' template change?)
HASH_CASES = [
    ({"spec.eval.replicas": 7}, False, False),
    ({"spec.eval.maxReplicas": 50}, False, False),
    ({"spec.eval.minReplicas": 1}, False, False),
    ({"spec.policy.optim": {"lr": 0.00123}}, True, True),
    ({"spec.image": "example.com/rl:2"}, True, True),
    ({"spec.train.nodes": 2}, True, True),
    ({"spec.eval.pod": {"nodeSelector": {"pool": "cpu"}}}, False, True),
    ({"spec.train.pod": {"nodeSelector": {"pool": "gpu"}}}, True, False),
    ({"spec.eval.episodesPerReport": 9}, True, True),
    ({"spec.eval.disruptionBudget": {"minAvailable": "50%"}}, False, False),
    ({"spec.eval.pod": {"priorityClassName": "rl-eval"}}, False, True),
    ({"spec.train.pod": {"priorityClassName": "rl-train"}}, True, False),
    ({"metadata.labels": {contract.LABEL_KUEUE_QUEUE: "team-a"}}, True, False),
]


@pytest.mark.parametrize(("edit", "train_changes", "eval_changes"), HASH_CASES)
def test_template_hash_ignores_scaling_only(example, edit, train_changes, eval_changes):
    before = _by_kind(build_children(example, NS))
    after = _by_kind(build_children(parse_manifest(edited(example_document(), **edit)), NS))

    def template_hash(child):  # the hash the planner compares is the Job's, the same as its template's
        return child["spec"]["template"]["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH]

    assert (template_hash(before["Job"]) != template_hash(after["Job"])) == train_changes
    assert (template_hash(before["StatefulSet"]) != template_hash(after["StatefulSet"])) == eval_changes


# (edit, check on the built children)
SPEC_CASES = [
    ({"spec.ports": {"metrics": 0}, "spec.train.procsPerNode": 2},  # one intake port a rank
     lambda c: [p["name"] for p in c["Service/cartpole-train"]["spec"]["ports"]]
     == ["torchrun", "weight-sync", "trajectories", "trajectories-1"]
     and "ports" not in c["Service/cartpole-eval"]["spec"]),
    ({"spec.ports": {"torchrun": 1234}}, lambda c: "--master-port=1234" in _container(c["Job"])["command"]),
    ({"spec.train.nodes": 3},
     lambda c: (c["Job"]["spec"]["completions"], c["Job"]["spec"]["parallelism"]) == (3, 3)
     and "--nnodes=3" in _container(c["Job"])["command"]),
    ({"spec.imagePullPolicy": "Always"}, lambda c: _container(c["StatefulSet"])["imagePullPolicy"] == "Always"),
    ({"spec.eval.pod": {"image": "eval:1"}},
     lambda c: _container(c["StatefulSet"])["image"] == "eval:1"
     and _container(c["Job"])["image"] == contract.DEFAULT_IMAGE),
    ({"spec.train.pod": {"tolerations": [{"key": "gpu", "operator": "Exists"}], "nodeSelector": {"b": "2", "a": "1"},
                         "affinity": {"nodeAffinity": {}}}},
     lambda c: c["Job"]["spec"]["template"]["spec"]["tolerations"][0] == {"key": "gpu", "operator": "Exists"}
     and list(c["Job"]["spec"]["template"]["spec"]["nodeSelector"]) == ["a", "b"]
     and c["Job"]["spec"]["template"]["spec"]["affinity"] == {"nodeAffinity": {}}
     and "gpu" not in str(c["StatefulSet"]["spec"]["template"]["spec"]["tolerations"])),
    ({"spec.train.procsPerNode": 1, "spec.train.pod": {"resources": {"limits": {"nvidia.com/gpu": "1"}}}},
     lambda c: _container(c["Job"])["resources"] == {"limits": {"nvidia.com/gpu": "1"}}),
    ({"spec.eval.replicas": 0}, lambda c: c["StatefulSet"]["spec"]["replicas"] == 0),
]


@pytest.mark.parametrize(
    ("edit", "check"), SPEC_CASES, ids=[str(list(e)) + str(i) for i, (e, _) in enumerate(SPEC_CASES)]
)
def test_spec_fields_reach_the_children(edit, check):
    manifest = parse_manifest(edited(example_document(), **edit))
    assert check(_by_kind(build_children(manifest, NS)))


def _volumes(workload):
    return {v["name"]: v for v in workload["spec"]["template"]["spec"]["volumes"]}


def test_run_dir_is_an_empty_dir_by_default(example):
    children = _by_kind(build_children(example, NS))
    for kind in ("Job", "StatefulSet"):
        assert _volumes(children[kind])[contract.RUN_DIR_VOLUME] == {"name": contract.RUN_DIR_VOLUME, "emptyDir": {}}


def test_checkpoint_claim_is_mounted_at_the_trainers_run_dir_only():
    document = edited(example_document(), **{"spec.train.checkpoint": {"persistentVolumeClaim": "ckpt.team-a"}})
    children = _by_kind(build_children(parse_manifest(document), NS))
    job, sts = children["Job"], children["StatefulSet"]
    assert _volumes(job)[contract.RUN_DIR_VOLUME] == {
        "name": contract.RUN_DIR_VOLUME, "persistentVolumeClaim": {"claimName": "ckpt.team-a"}
    }
    mounts = {m["name"]: m["mountPath"] for m in _container(job)["volumeMounts"]}
    assert mounts[contract.RUN_DIR_VOLUME] == contract.DEFAULT_RUN_DIR_IN_POD == _env(job)[contract.ENV_RUN_DIR]
    assert _volumes(sts)[contract.RUN_DIR_VOLUME]["emptyDir"] == {}  # evaluators keep no checkpoints
    assert "persistentVolumeClaim" not in _volumes(sts)[contract.RUN_DIR_VOLUME]


@pytest.mark.parametrize("claim", ["Ckpt", "ckpt_1", "-ckpt", "ckpt-", "a..b", "", "a" * 254])
def test_checkpoint_claim_must_be_a_dns_1123_name(claim):
    document = edited(example_document(), **{"spec.train.checkpoint": {"persistentVolumeClaim": claim}})
    with pytest.raises(ManifestError, match="persistentVolumeClaim"):
        parse_manifest(document)


def test_with_owner_sets_a_blocking_controller_reference(example):
    owner = {
        "apiVersion": "rlightning.io/v1alpha1", "kind": "PolicyGroup", "metadata": {"name": "cartpole", "uid": "u-1"}
    }
    child = build_children(example, NS)[0]
    owned = with_owner(child, owner)
    assert owned["metadata"]["ownerReferences"] == [
        {"apiVersion": "rlightning.io/v1alpha1", "kind": "PolicyGroup", "name": "cartpole", "uid": "u-1",
         "controller": True, "blockOwnerDeletion": True}
    ]
    assert "ownerReferences" not in child["metadata"], "with_owner copies"


def test_selector_string():
    assert builders.selector_string("g", "eval") == "rlightning.io/policy-group=g,rlightning.io/role=eval"


@pytest.mark.parametrize(("timeout", "grace"), [(None, 75), (1, 16), (0.5, 16), (12.2, 28), (600, 615)])
def test_grace_period_covers_a_clean_leave(timeout, grace):
    edit = {} if timeout is None else {"spec.weightSync.timeoutSeconds": timeout}
    children = _by_kind(build_children(parse_manifest(edited(example_document(), **edit)), NS))
    for kind in ("Job", "StatefulSet"):
        assert children[kind]["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] == grace, kind


def test_trainers_validate_the_spec_before_torchrun_and_fail_the_job_on_a_bad_manifest(example):
    job = _by_kind(build_children(example, NS))["Job"]
    pod = job["spec"]["template"]["spec"]
    (init,) = pod["initContainers"]
    spec_file = f"{contract.SPEC_MOUNT_DIR}/{contract.SPEC_FILE_NAME}"
    assert init["command"] == ["python", "-m", "rlightning.cli", "validate", spec_file]
    assert (init["image"], init["resources"]) == (_container(job)["image"], _container(job)["resources"])
    assert [m["mountPath"] for m in init["volumeMounts"]] == [contract.SPEC_MOUNT_DIR]
    fail_job = [rule["onExitCodes"] for rule in job["spec"]["podFailurePolicy"]["rules"] if rule["action"] == "FailJob"]
    assert {r["containerName"] for r in fail_job} == {contract.VALIDATE_CONTAINER, contract.PolicyRole.TRAIN}
    assert all(r["operator"] == "In" and r["values"] == [contract.EXIT_BAD_MANIFEST] for r in fail_job)
    assert "initContainers" not in _by_kind(build_children(example, NS))["StatefulSet"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("kind", ["Job", "StatefulSet"])
def test_the_failing_process_exception_is_the_containers_termination_message(example, kind):
    child = _by_kind(build_children(example, NS))[kind]
    main = _container(child)
    assert (main["terminationMessagePath"], main["terminationMessagePolicy"]) == (
        contract.TERMINATION_LOG_IN_POD, "FallbackToLogsOnError")
    assert _env(child)[contract.ENV_ERROR_FILE] == contract.TERMINATION_LOG_IN_POD  # the rank or evaluator writes it


@pytest.mark.parametrize(("metrics_namespace", "metrics_port", "scrapers"), [
    ("", 9400, {"podSelector": {}}),
    ("monitoring", 9400, {"namespaceSelector": {"matchLabels": {builders.NAMESPACE_NAME_LABEL: "monitoring"}}}),
    ("", 0, None),
], ids=["scrapers of the namespace", "scrapers of another namespace", "no metrics port"])
def test_network_policy_admits_only_the_groups_pods_and_the_scrapers(metrics_namespace, metrics_port, scrapers):
    manifest = parse_manifest(edited(example_document(), **{"spec.ports.metrics": metrics_port}))
    options = builders.NetworkPolicyOptions(metrics_namespace=metrics_namespace)
    children = build_children(manifest, NS, options)
    policy = _by_kind(children)["NetworkPolicy"]
    assert [c["kind"] for c in children].index("NetworkPolicy") < [c["kind"] for c in children].index("Job")
    assert policy["metadata"]["name"] == "cartpole-train" and policy["apiVersion"] == "networking.k8s.io/v1"
    spec = policy["spec"]
    assert spec["podSelector"] == {"matchLabels": {contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "train"}}
    assert spec["policyTypes"] == ["Ingress"]  # egress untouched: trainers reach the API server and the evaluators
    own, *metrics = spec["ingress"]
    assert own == {"from": [{"podSelector": {"matchLabels": {contract.LABEL_GROUP: "cartpole"}}}]}  # every port
    expected = [] if scrapers is None else [{"from": [scrapers], "ports": [{"protocol": "TCP", "port": 9400}]}]
    assert metrics == expected
    assert policy["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH]
    assert "NetworkPolicy" not in _by_kind(build_children(manifest, NS))  # switched off: none


def test_pods_probe_weights_held_and_a_moving_training_loop(example):
    children = _by_kind(build_children(example, NS))
    evaluator, trainer = _container(children["StatefulSet"]), _container(children["Job"])
    assert "livenessProbe" not in evaluator and "readinessProbe" not in trainer
    ready, alive = evaluator["readinessProbe"], trainer["livenessProbe"]
    for probe in (ready, alive):
        assert probe["exec"]["command"][:2] == ["python", "-c"]
        assert contract.HEALTH_FILE_IN_POD in probe["exec"]["command"][2]
        assert probe["periodSeconds"] > 0 and probe["failureThreshold"] >= 1
    env = {e["name"]: e.get("value") for e in evaluator["env"]}
    assert env[contract.ENV_HEALTH_FILE] == contract.HEALTH_FILE_IN_POD


def test_trainer_pods_keep_node_autoscalers_away_and_evaluator_pods_do_not(example):
    children = _by_kind(build_children(example, NS))
    trainer = children["Job"]["spec"]["template"]["metadata"]["annotations"]
    assert trainer["karpenter.sh/do-not-disrupt"] == "true"
    assert trainer["cluster-autoscaler.kubernetes.io/safe-to-evict"] == "false"
    evaluator = children["StatefulSet"]["spec"]["template"]["metadata"]["annotations"]
    assert set(evaluator) == {contract.ANNOTATION_SPEC_HASH}, "evaluators leave cleanly: node autoscalers may move them"


@pytest.mark.parametrize("nodes", [1, 3])
def test_trainer_disruption_budget_allows_no_eviction(nodes):
    children = _by_kind(build_children(parse_manifest(edited(example_document(), **{"spec.train.nodes": nodes})), NS))
    budget = children["PodDisruptionBudget/cartpole-train"]
    assert budget["apiVersion"] == "policy/v1"
    # minAvailable = every trainer pod: maxUnavailable 0 in the form the disruption controller accepts for a Job.
    selected = {"matchLabels": builders.selector("cartpole", "train")}
    assert budget["spec"] == {"minAvailable": nodes, "selector": selected}
    assert budget["metadata"]["labels"][contract.LABEL_ROLE] == "train"


@pytest.mark.parametrize(("written", "expected"), [
    (None, {"maxUnavailable": "100%"}),
    ({"maxUnavailable": 1}, {"maxUnavailable": 1}),
    ({"minAvailable": "50%"}, {"minAvailable": "50%"}),
    ({"minAvailable": 0}, {"minAvailable": 0}),
])
def test_evaluator_disruption_budget_follows_the_spec(written, expected):
    document = example_document()
    if written is not None:
        document = edited(document, **{"spec.eval.disruptionBudget": written})
    budget = _by_kind(build_children(parse_manifest(document), NS))["PodDisruptionBudget/cartpole-eval"]
    assert budget["spec"] == {**expected, "selector": {"matchLabels": builders.selector("cartpole", "eval")}}


@pytest.mark.parametrize(("budget", "message"), [
    ({}, "exactly one of maxUnavailable and minAvailable"),
    ({"maxUnavailable": 1, "minAvailable": 1}, "exactly one of maxUnavailable and minAvailable"),
    ({"maxUnavailable": "101%"}, "maxUnavailable"),
    ({"maxUnavailable": "half"}, "maxUnavailable"),
    ({"minAvailable": -1}, "minAvailable"),
])
def test_evaluator_disruption_budget_is_checked(budget, message):
    with pytest.raises(ManifestError, match=message):
        parse_manifest(edited(example_document(), **{"spec.eval.disruptionBudget": budget}))


def test_priority_class_per_role():
    pods = {"spec.train.pod": {"priorityClassName": "rl-train"}, "spec.eval.pod": {"priorityClassName": "rl-eval"}}
    children = _by_kind(build_children(parse_manifest(edited(example_document(), **pods)), NS))
    assert children["Job"]["spec"]["template"]["spec"]["priorityClassName"] == "rl-train"
    assert children["StatefulSet"]["spec"]["template"]["spec"]["priorityClassName"] == "rl-eval"
    unset = _by_kind(build_children(parse_manifest(example_document()), NS))
    assert "priorityClassName" not in unset["Job"]["spec"]["template"]["spec"]


@pytest.mark.parametrize("name", ["High", "rl_train", "-x", "a" * 254])
def test_priority_class_must_be_a_dns_subdomain(name):
    with pytest.raises(ManifestError, match="priorityClassName"):
        parse_manifest(edited(example_document(), **{"spec.train.pod": {"priorityClassName": name}}))


def test_a_queue_label_makes_a_suspended_trainer_job_for_kueue():
    labelled = edited(example_document(), **{"metadata.labels": {contract.LABEL_KUEUE_QUEUE: "team-a"}})
    job = _by_kind(build_children(parse_manifest(labelled), NS))["Job"]
    assert job["metadata"]["labels"][contract.LABEL_KUEUE_QUEUE] == "team-a"
    assert job["spec"]["suspend"] is True
    assert list(job["metadata"]["labels"]) == sorted(job["metadata"]["labels"])
    assert job["metadata"]["annotations"] == {
        contract.ANNOTATION_SPEC_HASH: job["spec"]["template"]["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH]
    }
    plain = _by_kind(build_children(parse_manifest(example_document()), NS))["Job"]
    assert "suspend" not in plain["spec"] and contract.LABEL_KUEUE_QUEUE not in plain["metadata"]["labels"]
    other = edited(example_document(), **{"metadata.labels": {contract.LABEL_KUEUE_QUEUE: "team-b"}})
    moved = _by_kind(build_children(parse_manifest(other), NS))["Job"]
    assert moved["metadata"]["annotations"] != job["metadata"]["annotations"], "another queue: a new Job"


def _job(manifest, state=None):
    return _by_kind(build_children(manifest, NS, state=state or builders.RunState()))["Job"]


def test_an_attempt_is_a_label_an_env_var_and_part_of_the_hash(example):
    jobs = {attempt: _job(example, builders.RunState(attempt=attempt)) for attempt in (0, 1)}
    for attempt, built in jobs.items():
        assert built["metadata"]["labels"][contract.LABEL_ATTEMPT] == str(attempt)
        assert built["spec"]["template"]["metadata"]["labels"][contract.LABEL_ATTEMPT] == str(attempt)
        assert _env(built)[contract.ENV_TRAIN_ATTEMPT] == str(attempt)
        assert builders.attempt_of(built) == attempt
        pod_annotations = built["spec"]["template"]["metadata"]["annotations"]
        assert built["metadata"]["annotations"].items() <= pod_annotations.items()  # the Job's hash is its pods' one
    assert _job(example) == jobs[0]  # attempt 0 unless told
    hashes = {b["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH] for b in jobs.values()}
    assert len(hashes) == 2  # the planner replaces a Job of another attempt
    queued = parse_manifest(edited(example_document(), **{"metadata.labels": {contract.LABEL_KUEUE_QUEUE: "a"}}))
    queued_jobs = [_job(queued, builders.RunState(attempt=attempt)) for attempt in (0, 1)]
    assert [builders.attempt_of(job) for job in queued_jobs] == [0, 1]
    assert all(job["spec"]["suspend"] for job in queued_jobs)
    assert len({j["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH] for j in queued_jobs} | hashes) == 4
    assert builders.attempt_of(None) == 0 and builders.attempt_of({"metadata": {"labels": {}}}) == 0


def test_an_attempts_epoch_rises_across_attempts_and_across_a_group_applied_again(example):
    created = builders.created_seconds({"metadata": {"creationTimestamp": "2026-12-03T04:10:00Z"}})
    applied_again = builders.created_seconds({"metadata": {"creationTimestamp": "2026-12-03T04:10:01Z"}})
    epochs = [int(_env(_job(example, builders.RunState(attempt, at)))[contract.ENV_TRAIN_EPOCH])
              for at, attempt in ((created, 0), (created, 5), (applied_again, 0))]

    assert epochs == sorted(epochs) and len(set(epochs)) == 3  # a group applied again fences its predecessor
    assert epochs[1] - epochs[0] == 5
    hashes = {_job(example, builders.RunState(1, at))["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH]
              for at in (created, applied_again)}
    assert len(hashes) == 1  # the epoch follows from the attempt: no Job is replaced for it
    assert builders.created_seconds({}) == 0 and builders.created_seconds({"metadata": {"creationTimestamp": "x"}}) == 0


def test_stopped_evaluators_are_a_statefulset_of_zero_replicas_and_no_template_change(example):
    running = build_children(example, NS, state=builders.RunState(attempt=2))
    stopped = build_children(example, NS, state=builders.RunState(attempt=2, evaluators_stopped=True))
    differ = [(a["kind"], a["metadata"]["name"]) for a, b in zip(running, stopped, strict=True) if a != b]
    assert differ == [("StatefulSet", "cartpole-eval")]  # nothing else: the trainers' Job stays the same
    sts_running, sts_stopped = _by_kind(running)["StatefulSet"], _by_kind(stopped)["StatefulSet"]
    assert (sts_running["spec"]["replicas"], sts_stopped["spec"]["replicas"]) == (example.spec.eval.replicas, 0)
    assert {**sts_stopped["spec"], "replicas": example.spec.eval.replicas} == sts_running["spec"]
    assert sts_stopped["metadata"] == sts_running["metadata"]  # same hash: the planner scales, never replaces
    workloads = builders.build_workloads(example, NS, builders.RunState(attempt=2, evaluators_stopped=True))
    assert workloads == [_by_kind(stopped)["Job"], sts_stopped]
