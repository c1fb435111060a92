"""The user's flow against a real control plane: apply, get, describe, scale, delete."""

from __future__ import annotations

import json

from rlightning import contract

from operator_cluster import apply, condition, example, get_json, items, pods, running, small, wait_for

EXPECTED_CHILDREN = {
    ("ConfigMap", "cartpole-spec"),
    ("ServiceAccount", "cartpole-runtime"),
    ("Role", "cartpole-runtime"),
    ("RoleBinding", "cartpole-runtime"),
    ("PodDisruptionBudget", "cartpole-train"),
    ("PodDisruptionBudget", "cartpole-eval"),
    ("NetworkPolicy", "cartpole-train"),
    ("Service", "cartpole-train"),
    ("Service", "cartpole-eval"),
    ("Job", "cartpole-train"),
    ("StatefulSet", "cartpole-eval"),
}
KINDS = ("configmaps,serviceaccounts,roles,rolebindings,poddisruptionbudgets,networkpolicies,services,jobs,"
         "statefulsets")


def owned_children(cluster, namespace, uid):
    """(kind, name) of every object in the namespace controlled by the PolicyGroup with `uid`."""
    found = set()
    for item in items(cluster, KINDS, "-n", namespace):
        for reference in item["metadata"].get("ownerReferences") or []:
            if reference["uid"] == uid:
                assert reference["controller"] is True and reference["blockOwnerDeletion"] is True
                found.add((item["kind"], item["metadata"]["name"]))
    return found


def ready(cluster, namespace, name="cartpole"):
    group = get_json(cluster, "pg", name, "-n", namespace)
    return group if condition(group, "Ready").get("status") == "True" else None


def test_apply_creates_exactly_the_children_and_status_follows_the_pods(crd, namespace, operator):
    apply(crd, namespace, example())
    uid = get_json(crd, "pg", "cartpole", "-n", namespace)["metadata"]["uid"]
    wait_for("11 owned children", lambda: owned_children(crd, namespace, uid) == EXPECTED_CHILDREN)
    policy = get_json(crd, "networkpolicy", "cartpole-train", "-n", namespace)["spec"]  # the operator's default: on
    assert policy["podSelector"]["matchLabels"] == {contract.LABEL_GROUP: "cartpole", contract.LABEL_ROLE: "train"}
    assert policy["ingress"][0]["from"] == [{"podSelector": {"matchLabels": {contract.LABEL_GROUP: "cartpole"}}}]

    job = get_json(crd, "job", "cartpole-train", "-n", namespace)
    assert (job["spec"]["completionMode"], job["spec"]["completions"], job["spec"]["parallelism"]) == ("Indexed", 1, 1)
    assert job["spec"]["template"]["spec"]["subdomain"] == "cartpole-train"
    command = job["spec"]["template"]["spec"]["containers"][0]["command"]
    assert f"--master-addr=cartpole-train-0.cartpole-train.{namespace}.svc" in command
    sts = get_json(crd, "statefulset", "cartpole-eval", "-n", namespace)
    assert sts["spec"]["replicas"] == 2 and sts["spec"]["podManagementPolicy"] == "Parallel"
    service = get_json(crd, "service", "cartpole-train", "-n", namespace)
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["publishNotReadyAddresses"] is True
    spec_file = get_json(crd, "configmap", "cartpole-spec", "-n", namespace)["data"][contract.SPEC_FILE_NAME]
    assert "CartPole-v1" in spec_file

    # kwok runs the pods; the status follows through the child watches.
    wait_for("1 trainer and 2 evaluators Running",
             lambda: running(pods(crd, namespace, "train")) == 1 and running(pods(crd, namespace, "eval")) == 2)
    trainer = pods(crd, namespace, "train")[0]
    assert trainer["spec"]["hostname"] == "cartpole-train-0" and trainer["spec"]["subdomain"] == "cartpole-train"
    group = wait_for("Ready=True", lambda: ready(crd, namespace))
    status = group["status"]
    assert status["phase"] == "Running" and status["observedGeneration"] == group["metadata"]["generation"]
    assert (status["train"]["summary"], status["eval"]["summary"], status["replicas"]) == ("1/1", "2/2", 2)
    assert status["selector"] == "rlightning.io/policy-group=cartpole,rlightning.io/role=eval"
    assert {c["type"]: c["status"] for c in status["conditions"]} == {
        "Valid": "True", "TrainersReady": "True", "EvaluatorsReady": "True", "CheckpointsPersistent": "False",
        "TrainingProgressing": "True", "Ready": "True"}
    assert condition(group, "TrainingProgressing")["reason"] == "Starting"  # kwok runs no trainer that reports
    assert "kopf" not in status, "kopf's bookkeeping lives in annotations"

    table = crd.kubectl("get", "pg", "-n", namespace).stdout.splitlines()
    assert table[0].split() == [
        "NAME", "PHASE", "TRAINERS", "EVALUATORS", "RESTARTS", "WEIGHTS", "CONSISTENT", "STEPS/S", "LAG", "REASON",
        "AGE",
    ]  # fmt: skip
    assert table[1].split()[:5] == ["cartpole", "Running", "1/1", "2/2", "0"] and "AllReady" in table[1].split()
    described = crd.kubectl("describe", "pg", "cartpole", "-n", namespace).stdout
    assert "Created" in described and "StatefulSet cartpole-eval" in described

    # Trainer rank 0's part of status survives the operator's writes.
    crd.kubectl("patch", "pg", "cartpole", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps({"status": {"training": {"weightVersion": 7, "consistent": True}}}))
    crd.kubectl("scale", "pg", "cartpole", "-n", namespace, "--replicas=3")
    wait_for("3 evaluators ready", lambda: (ready(crd, namespace) or {}).get("status", {}).get("replicas") == 3)
    row = crd.kubectl("get", "pg", "-n", namespace).stdout.splitlines()[1].split()
    assert row[1:7] == ["Running", "1/1", "3/3", "0", "7", "true"]


def test_scale_subresource_and_scale_down_deletes_exactly_one_pod(crd, namespace, operator):
    apply(crd, namespace, small(replicas=10))
    wait_for("10 evaluators Running", lambda: running(pods(crd, namespace, "eval")) == 10)
    wait_for("Ready=True", lambda: ready(crd, namespace))
    scale = json.loads(crd.kubectl("get", "--raw",
                                   f"/apis/rlightning.io/v1alpha1/namespaces/{namespace}/policygroups/cartpole/scale")
                       .stdout)
    assert scale["kind"] == "Scale" and scale["spec"]["replicas"] == 10 and scale["status"]["replicas"] == 10
    assert scale["status"]["selector"] == "rlightning.io/policy-group=cartpole,rlightning.io/role=eval"

    job_uid = get_json(crd, "job", "cartpole-train", "-n", namespace)["metadata"]["uid"]
    sts_before = get_json(crd, "statefulset", "cartpole-eval", "-n", namespace)
    before = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(crd, namespace, "eval")}
    crd.kubectl("scale", "pg", "cartpole", "-n", namespace, "--replicas=9")
    wait_for("9 evaluator pods", lambda: len(pods(crd, namespace, "eval")) == 9)
    after = {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods(crd, namespace, "eval")}
    assert set(before) - set(after) == {"cartpole-eval-9"}
    assert all(before[name] == uid for name, uid in after.items()), "the other evaluators keep their UIDs"
    sts_after = get_json(crd, "statefulset", "cartpole-eval", "-n", namespace)
    assert sts_after["spec"]["replicas"] == 9
    assert sts_after["spec"]["template"] == sts_before["spec"]["template"], "scaling never patches the template"
    assert get_json(crd, "job", "cartpole-train", "-n", namespace)["metadata"]["uid"] == job_uid, "Job kept"
    wait_for("status.replicas 9", lambda: get_json(crd, "pg", "cartpole", "-n", namespace)["status"]["replicas"] == 9)


def test_template_change_rolls_pods_and_recreates_the_job(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    job_uid = get_json(crd, "job", "cartpole-train", "-n", namespace)["metadata"]["uid"]
    eval_uids = {p["metadata"]["uid"] for p in pods(crd, namespace, "eval")}
    apply(crd, namespace, small(replicas=2, **{"spec.image": "example.com/rlightning:2"}))

    def rolled():
        found = crd.kubectl("get", "job", "cartpole-train", "-n", namespace, "-o", "json", check=False)
        job = json.loads(found.stdout) if found.returncode == 0 else None  # absent while being recreated
        evals = pods(crd, namespace, "eval")
        return (job is not None and job["metadata"]["uid"] != job_uid
                and all(p["spec"]["containers"][0]["image"] == "example.com/rlightning:2" for p in evals)
                and len(evals) == 2 and not eval_uids & {p["metadata"]["uid"] for p in evals})

    wait_for("new Job and rolled evaluators", rolled)
    wait_for("Ready=True after the roll", lambda: ready(crd, namespace))
    trainers = pods(crd, namespace, "train")
    assert [p["spec"]["containers"][0]["image"] for p in trainers] == ["example.com/rlightning:2"]


def test_delete_removes_every_child(crd, namespace, operator):
    apply(crd, namespace, small(replicas=3))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    crd.kubectl("delete", "pg", "cartpole", "-n", namespace, "--wait=true", "--timeout=60s")

    def gone():
        left = [f"{i['kind']}/{i['metadata']['name']}" for i in items(crd, KINDS, "-n", namespace)
                if i["metadata"].get("labels", {}).get(contract.LABEL_GROUP) == "cartpole"]
        return not left and not pods(crd, namespace)

    wait_for("garbage collection of every child and pod", gone)


def test_a_setting_dropped_from_the_spec_is_removed_from_the_children(crd, namespace, operator):
    tiny = {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
    apply(crd, namespace, small(**{"spec.eval.pod": {**tiny, "nodeSelector": {"pool": "cpu"}}}))

    def evaluators(node_selector, budget):
        """The eval StatefulSet's node selector and PDB spec are these (None: not created yet)."""
        found = {item["kind"]: item for item in items(crd, "statefulsets,poddisruptionbudgets", "-n", namespace)
                 if item["metadata"]["name"] == "cartpole-eval"}
        if set(found) != {"StatefulSet", "PodDisruptionBudget"}:
            return False
        budget_seen = {k: v for k, v in found["PodDisruptionBudget"]["spec"].items() if k != "selector"}
        return found["StatefulSet"]["spec"]["template"]["spec"].get("nodeSelector") == node_selector and \
            budget_seen == budget

    wait_for("pinned evaluators, all evictable", lambda: evaluators({"pool": "cpu"}, {"maxUnavailable": "100%"}))
    # the user drops the node selector and sets a budget of the other form than the default (one with both fields
    # is refused, by the CRD's rule and by the API server in a PDB)
    apply(crd, namespace, small(**{"spec.eval.disruptionBudget": {"minAvailable": 1}}))
    wait_for("no node selector, a budget of the other form", lambda: evaluators(None, {"minAvailable": 1}))
