"""Operator restarts, handler bookkeeping, edit bursts, and objects it cannot handle."""

from __future__ import annotations

import json
import random
import threading
import time

import kubernetes
import yaml

from rlightning import contract
from rlightning.config import build_crd

from operator_cluster import (
    OperatorProcess,
    apply,
    condition,
    get_json,
    install_crd,
    items,
    pods,
    running,
    small,
    wait_for,
)

KINDS = "configmaps,serviceaccounts,roles,rolebindings,services,jobs,statefulsets"


def children(cluster, namespace, group="cartpole"):
    """Kind/name of every object labelled as a child of `group`."""
    return sorted(f"{i['kind']}/{i['metadata']['name']}" for i in items(cluster, KINDS, "-n", namespace)
                  if i["metadata"].get("labels", {}).get(contract.LABEL_GROUP) == group)


def ready(cluster, namespace, name="cartpole"):
    group = get_json(cluster, "pg", name, "-n", namespace)
    return group if condition(group, "Ready").get("status") == "True" else None


def handled(cluster, namespace, name="cartpole"):
    """The object as kopf last finished handling it (its last-handled-configuration), or None.

    kopf writes it once every handler of a change is done, succeeded or failed permanently, and never while
    a retry is pending (kopf/_core/reactor/processing.py): so it proves the operator processed that change.
    """
    annotations = get_json(cluster, "pg", name, "-n", namespace)["metadata"].get("annotations") or {}
    encoded = annotations.get(f"{contract.API_GROUP}/last-handled-configuration")
    return json.loads(encoded) if encoded else None


def label_and_wait_handled(cluster, namespace, value, name="cartpole"):
    """Set the label `team=value` (not a spec change) and wait until kopf has handled that event."""
    cluster.kubectl("label", "--overwrite", "pg", name, "-n", namespace, f"team={value}")
    wait_for(f"kopf to handle the label team={value}",
             lambda: ((handled(cluster, namespace, name) or {}).get("metadata", {}).get("labels") or {})
             .get("team") == value)


def test_killed_operator_restarts_and_converges(crd, namespace, tmp_path):
    operator = OperatorProcess(crd, namespace, tmp_path / "operator.log").start()
    try:
        apply(crd, namespace, small(replicas=3))
        wait_for("a first child", lambda: children(crd, namespace), interval=0.02)
        operator.kill()
        created_before_kill = children(crd, namespace)
        operator.start()
        wait_for("Ready=True after restart", lambda: ready(crd, namespace))
        assert len(children(crd, namespace)) == 8, created_before_kill
        assert len(items(crd, "jobs", "-n", namespace)) == 1
        wait_for("exactly 1 trainer and 3 evaluator pods",
                 lambda: running(pods(crd, namespace, "train")) == 1 and len(pods(crd, namespace, "eval")) == 3)
        assert operator.counter("rlightning_operator_reconcile_errors_total") == 0
        assert "Traceback" not in operator.log()
    finally:
        operator.stop()
        print(operator.log()[-20000:])


def test_partial_state_from_before_is_adopted(crd, namespace, tmp_path):
    apply(crd, namespace, small(replicas=2))
    stale = {"apiVersion": "v1", "kind": "ConfigMap",
             "metadata": {"name": "cartpole-spec", "labels": {contract.LABEL_GROUP: "cartpole"}},
             "data": {"policygroup.yaml": "stale"}}
    crd.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(stale))
    operator = OperatorProcess(crd, namespace, tmp_path / "operator.log").start()
    try:
        wait_for("Ready=True", lambda: ready(crd, namespace))
        config = get_json(crd, "configmap", "cartpole-spec", "-n", namespace)
        assert config["data"][contract.SPEC_FILE_NAME] != "stale"
        uid = get_json(crd, "pg", "cartpole", "-n", namespace)["metadata"]["uid"]
        assert config["metadata"]["ownerReferences"][0]["uid"] == uid
    finally:
        operator.stop()


def test_each_handler_runs_once_per_change(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    group = get_json(crd, "pg", "cartpole", "-n", namespace)
    annotations = group["metadata"]["annotations"]
    assert f"{contract.API_GROUP}/last-handled-configuration" in annotations
    crd.kubectl("scale", "pg", "cartpole", "-n", namespace, "--replicas=4")
    wait_for("4 evaluators ready", lambda: (ready(crd, namespace) or {}).get("status", {}).get("eval", {})
             .get("ready") == 4)
    # Not spec changes. The second label is handled only after every earlier event of the object, including
    # those of kopf's own bookkeeping patch for the first: a re-run that pruned bookkeeping caused shows by then.
    label_and_wait_handled(crd, namespace, "a")
    label_and_wait_handled(crd, namespace, "b")
    assert operator.counter("rlightning_operator_reconciles_total", trigger="create") == 1
    assert operator.counter("rlightning_operator_reconciles_total", trigger="update") == 1
    assert operator.counter("rlightning_operator_reconciles_total", trigger="resume") == 0
    assert operator.log().count("Handler 'reconcile-create' succeeded") == 1, operator.log()[-5000:]
    assert operator.log().count("Handler 'reconcile-update/spec' succeeded") == 1, operator.log()[-5000:]
    assert operator.counter("rlightning_operator_reconcile_errors_total") == 0


def test_burst_of_edits_never_exceeds_desired_pods(crd, namespace, operator):
    apply(crd, namespace, small(replicas=3))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    client = crd.api_client()
    core = kubernetes.client.CoreV1Api(client)
    live: dict[str, dict[str, str]] = {"train": {}, "eval": {}}
    peak = {"train": 0, "eval": 0}
    stop, started = threading.Event(), threading.Event()

    def watch():
        watcher = kubernetes.watch.Watch()
        for event in watcher.stream(core.list_namespaced_pod, namespace, timeout_seconds=120):
            started.set()  # the stream opens with an ADDED event per existing pod
            pod = event["object"]
            role = (pod.metadata.labels or {}).get(contract.LABEL_ROLE)
            if role in live:
                if event["type"] == "DELETED":
                    live[role].pop(pod.metadata.name, None)
                else:
                    live[role][pod.metadata.name] = pod.metadata.uid
                peak[role] = max(peak[role], len(live[role]))
            if stop.is_set():
                watcher.stop()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    assert started.wait(timeout=30), "the pod watch delivered no event"
    rng = random.Random(7)
    desired = [rng.randint(1, 6) for _ in range(15)]
    image = contract.DEFAULT_IMAGE
    for index, replicas in enumerate(desired):
        if index in (5, 10):  # two template changes inside the burst: Job recreated, evaluators rolled
            image = f"example.com/rlightning:{index}"
        apply(crd, namespace, small(replicas=replicas, **{"spec.image": image}))
        time.sleep(0.1)  # pacing: separate edits in quick succession, as a script would send them
    final = desired[-1]
    wait_for(f"{final} evaluators and 1 trainer Running, image of the last edit",
             lambda: running(pods(crd, namespace, "eval")) == final and len(pods(crd, namespace, "eval")) == final
             and running(pods(crd, namespace, "train")) == 1
             and pods(crd, namespace, "train")[0]["spec"]["containers"][0]["image"] == "example.com/rlightning:10",
             timeout=120)
    wait_for("Ready=True", lambda: ready(crd, namespace))
    stop.set()
    crd.kubectl("annotate", "pods", "--all", "-n", namespace, "poke=1")  # one more pod event ends the watch
    thread.join(timeout=130)
    client.close()
    assert peak["train"] <= 1, peak
    assert peak["eval"] <= max(desired), (peak, desired)
    assert len(items(crd, "jobs", "-n", namespace)) == 1


def test_operator_survives_what_it_cannot_handle(crd, namespace, operator):
    crd.kubectl("create", "configmap", "someone", "-n", namespace)  # a live owner, or GC would collect it
    owner_uid = get_json(crd, "configmap", "someone", "-n", namespace)["metadata"]["uid"]
    foreign = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {
        "name": "taken-spec", "ownerReferences": [{"apiVersion": "v1", "kind": "ConfigMap", "name": "someone",
                                                   "uid": owner_uid, "controller": True}]}, "data": {"mine": "yes"}}
    crd.kubectl("create", "-n", namespace, "-f", "-", input=yaml.safe_dump(foreign))
    apply(crd, namespace, small("taken", replicas=1))
    group = wait_for("Ready=False with reason Conflict",
                     lambda: (lambda g: g if condition(g, "Ready").get("reason") == "Conflict" else None)(
                         get_json(crd, "pg", "taken", "-n", namespace)))
    assert "ConfigMap/taken-spec" in condition(group, "Ready")["message"]
    assert get_json(crd, "configmap", "taken-spec", "-n", namespace)["data"] == {"mine": "yes"}
    events = crd.kubectl("get", "events", "-n", namespace, "--field-selector", "involvedObject.name=taken",
                         "-o", "json").stdout
    assert "Conflict" in events
    apply(crd, namespace, small("other", replicas=1))  # the operator still serves other PolicyGroups
    wait_for("the other PolicyGroup Ready", lambda: ready(crd, namespace, "other"))
    assert operator.process.poll() is None


def test_invalid_spec_past_the_schema_is_reported_once_not_retried(crd, namespace, operator):
    # The real schema rejects everything pydantic rejects (test_cluster_rejects), so loosen it for this
    # session's cluster to let an invalid spec reach the operator, as an older CRD would.
    loose = build_crd()
    schema = loose["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    schema["properties"]["spec"] = {"type": "object", "x-kubernetes-preserve-unknown-fields": True}
    del schema["x-kubernetes-validations"]
    invalid = small("bad", replicas=1, **{"spec.train.nodes": 0})
    try:
        crd.kubectl("apply", "-f", "-", input=yaml.safe_dump(loose))
        wait_for("the loose schema to accept the invalid spec",
                 lambda: apply(crd, namespace, invalid, check=False).returncode == 0)
        group = wait_for("phase Invalid", lambda: (lambda g: g if (g.get("status") or {}).get("phase") == "Invalid"
                                                   else None)(get_json(crd, "pg", "bad", "-n", namespace)))
        valid = condition(group, "Valid")
        assert valid["status"] == "False" and valid["reason"] == "InvalidSpec"
        assert "spec.train.nodes" in valid["message"]
        # kopf records the creation as handled only when no retry is pending (see `handled`)
        wait_for("kopf to finish the creation", lambda: handled(crd, namespace, "bad"))
        assert operator.counter("rlightning_operator_reconciles_total", trigger="create") == 1
        assert operator.log().count("Handler 'reconcile-create' failed permanently") == 1, operator.log()[-3000:]
        events = crd.kubectl("get", "events", "-n", namespace, "--field-selector",
                             "involvedObject.name=bad,type=Warning", "-o", "json").stdout
        assert "InvalidSpec" in events and "spec.train.nodes" in events
        assert children(crd, namespace, "bad") == []

        crd.kubectl("patch", "pg", "bad", "-n", namespace, "--type=merge", "-p",
                    json.dumps({"spec": {"train": {"nodes": 1}}}))  # fixed: the update handler takes over
        wait_for("Ready=True after the fix", lambda: ready(crd, namespace, "bad"))
        assert operator.process.poll() is None
    finally:
        install_crd(crd)
