"""What the pods are doing, on the real control plane: pod status written as a kubelet would (kwok runs the pods),
the scheduler's own verdicts; status, Events and `kubectl get pg` follow."""

from __future__ import annotations

import json

from rlightning import contract

from operator_cluster import apply, condition, get_json, items, pods, running, small, wait_for

TINY = {"requests": {"cpu": "10m", "memory": "16Mi"}}


def reason_of(cluster, namespace, type_, reason):
    """The PolicyGroup when its condition `type_` has `reason`, else None."""
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    return group if condition(group, type_).get("reason") == reason else None


def warnings(cluster, namespace, reason):
    return [e for e in items(cluster, "events", "-n", namespace, "--field-selector",
                             f"involvedObject.kind={contract.KIND},type=Warning") if e["reason"] == reason]


def ready(cluster, namespace):
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    return condition(group, "Ready").get("status") == "True"


EVALUATOR_ERROR = 'RuntimeError: act() got NaN logits\n  at File "policy.py", line 40, in act (evaluator 1)'
"""The termination message an evaluator whose policy raises writes (`rlightning.runtime._errors`)."""


def test_a_crash_looping_evaluator_is_reported_with_its_exit_code_and_exception(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    crashing = {"status": {
        "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"},
                       {"type": "ContainersReady", "status": "False", "reason": "ContainersNotReady"}],
        "containerStatuses": [{
            "name": "eval", "image": contract.DEFAULT_IMAGE, "imageID": "", "ready": False, "started": False,
            "restartCount": 5, "state": {"waiting": {"reason": "CrashLoopBackOff",
                                                     "message": "back-off 2m40s restarting failed container"}},
            "lastState": {"terminated": {"exitCode": 1, "reason": "Error", "startedAt": "2026-12-01T07:00:00Z",
                                         "finishedAt": "2026-12-01T07:00:01Z", "message": EVALUATOR_ERROR}}}]}}
    crd.kubectl("patch", "pod", "cartpole-eval-1", "-n", namespace, "--subresource=status", "--type=merge",
                "-p", json.dumps(crashing))
    group = wait_for("EvaluatorsReady=False, CrashLoopBackOff",
                     lambda: reason_of(crd, namespace, "EvaluatorsReady", "CrashLoopBackOff"))
    message = condition(group, "EvaluatorsReady")["message"]
    for words in ("cartpole-eval-1", "container eval", "exit code 1 (Error)", "5 restarts"):
        assert words in message, message
    assert message.endswith(" ".join(EVALUATOR_ERROR.split())), "what the evaluator wrote, on one line"
    assert condition(group, "Ready")["reason"] == "CrashLoopBackOff"
    (event,) = wait_for("one CrashLoopBackOff Warning", lambda: warnings(crd, namespace, "CrashLoopBackOff"))
    assert "cartpole-eval-1" in event["message"] and "exit code 1" in event["message"]
    table = crd.kubectl("get", "pg", "cartpole", "-n", namespace).stdout
    assert "REASON" in table.splitlines()[0] and "CrashLoopBackOff" in table.splitlines()[1], table


def test_unschedulable_evaluators_carry_the_schedulers_message(crd, namespace, operator):
    apply(crd, namespace, small(replicas=1, **{"spec.eval.pod": {"resources": TINY,
                                                                 "nodeSelector": {"example.com/none": "x"}}}))
    group = wait_for("EvaluatorsReady=False, Unschedulable",
                     lambda: reason_of(crd, namespace, "EvaluatorsReady", "Unschedulable"))
    message = condition(group, "EvaluatorsReady")["message"]
    assert "cartpole-eval-0" in message and "0/4 nodes are available" in message, message
    assert wait_for("one Unschedulable Warning", lambda: warnings(crd, namespace, "Unschedulable"))


def test_a_rollout_stuck_on_a_revision_that_cannot_run_is_reported(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    wait_for("Ready=True", lambda: ready(crd, namespace))
    revision = get_json(crd, "statefulset", "cartpole-eval", "-n", namespace)["status"]["currentRevision"]
    # An evaluator-only change whose pods can never be placed (the fake nodes are labelled type=kwok): the rolling
    # update replaces cartpole-eval-1 and waits for it forever.
    apply(crd, namespace, small(replicas=2, **{"spec.eval.pod": {"resources": TINY, "nodeSelector": {"type": "none"}}}))
    group = wait_for("EvaluatorsReady=False, RolloutStuck",
                     lambda: reason_of(crd, namespace, "EvaluatorsReady", "RolloutStuck"))
    message = condition(group, "EvaluatorsReady")["message"]
    update = get_json(crd, "statefulset", "cartpole-eval", "-n", namespace)["status"]["updateRevision"]
    assert update != revision and f"revision {update}" in message and "0/4 nodes are available" in message, message
    assert wait_for("one RolloutStuck Warning", lambda: warnings(crd, namespace, "RolloutStuck"))
    assert "delete pod cartpole-eval-1" in message, message
    # Fixed, and the stuck pod deleted as the message says (a StatefulSet's forced rollback): Ready again.
    apply(crd, namespace, small(replicas=2, **{"spec.eval.pod": {"resources": TINY, "nodeSelector": {"type": "kwok"}}}))
    wait_for("the StatefulSet off the broken revision", lambda: get_json(
        crd, "statefulset", "cartpole-eval", "-n", namespace)["status"].get("updateRevision") != update)
    crd.kubectl("delete", "pod", "cartpole-eval-1", "-n", namespace, "--wait=false")
    wait_for("Ready=True again", lambda: ready(crd, namespace))


def test_trainers_waiting_for_the_fleets_data_are_reported(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    wait_for("Ready=True", lambda: ready(crd, namespace))

    def report(waited):
        """Write status.training as trainer rank 0 does (a merge patch of the status subresource)."""
        training = {"iteration": 4, "envStepsPerSecond": 900.0, "waitingForDataSeconds": waited}
        crd.kubectl("patch", "pg", "cartpole", "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps({"status": {"training": training}}))

    report(None)
    wait_for("DataFlowing=True", lambda: reason_of(crd, namespace, "DataFlowing", "Flowing"))
    report(45.0)  # no child changes: the PolicyGroup's own event brings the refresh
    group = wait_for("DataFlowing=False", lambda: reason_of(crd, namespace, "DataFlowing", "WaitingForData"))
    assert "waited 45 s" in condition(group, "DataFlowing")["message"]
    assert condition(group, "Ready")["status"] == "True", "every pod is ready: the data is what is missing"
    (event,) = wait_for("one WaitingForData Warning", lambda: warnings(crd, namespace, "WaitingForData"))
    assert "2/2 evaluator pods ready" in event["message"]
    report(None)
    wait_for("DataFlowing=True again", lambda: reason_of(crd, namespace, "DataFlowing", "Flowing"))


def _quiet(operator):
    """(reconciles, status writes) once two readings 1 s apart agree: no pass is running or pending."""
    readings = []

    def settled():
        readings.append((operator.counter("rlightning_operator_reconciles_total"),
                         operator.counter("rlightning_operator_api_requests_total", kind=contract.KIND, verb="patch")))
        return readings[-1] if len(readings) > 1 and readings[-1] == readings[-2] else None
    return wait_for("no pass running or pending", settled, interval=1.0)


def test_a_pod_field_the_status_does_not_read_changes_nothing(crd, namespace, operator):
    apply(crd, namespace, small(replicas=2))
    apply(crd, namespace, small("other", replicas=1))  # a second group must not start a second pod watch
    wait_for("Ready=True", lambda: ready(crd, namespace))
    wait_for("other Ready=True", lambda: condition(get_json(crd, "pg", "other", "-n", namespace), "Ready").get(
        "status") == "True")
    before = _quiet(operator)
    ignored = operator.counter("rlightning_operator_watch_events_total", kind="Pod", outcome="ignored")
    crd.kubectl("label", "pod", "cartpole-eval-1", "-n", namespace, "example.com/team=a")
    crd.kubectl("annotate", "pod", "cartpole-eval-1", "-n", namespace, "example.com/note=x")
    wait_for("both pod events seen by the operator", lambda: operator.counter(
        "rlightning_operator_watch_events_total", kind="Pod", outcome="ignored") >= ignored + 2)
    assert _quiet(operator) == before, "no reconcile, no status write"
    assert operator.counter("rlightning_operator_watch_events_total", kind="Pod", outcome="ignored") == ignored + 2, \
        "each pod event handled once: one pod watch"
    # The status still follows what it reads of the same pod.
    crd.kubectl("patch", "pod", "cartpole-eval-1", "-n", namespace, "--subresource=status", "--type=merge", "-p",
                json.dumps({"status": {"conditions": [{"type": "Ready", "status": "False"}], "containerStatuses": [{
                    "name": "eval", "image": contract.DEFAULT_IMAGE, "imageID": "", "ready": False,
                    "restartCount": 1, "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                    "lastState": {"terminated": {"exitCode": 3, "reason": "Error"}}}]}}))
    wait_for("EvaluatorsReady=False, CrashLoopBackOff",
             lambda: reason_of(crd, namespace, "EvaluatorsReady", "CrashLoopBackOff"))


GPU = "nvidia.com/gpu"


def test_a_gpu_group_with_pod_templates_runs_one_rank_per_gpu(crd, namespace, operator):
    # Two trainer pods of 4 ranks and 4 GPUs each, one GPU per evaluator: the fake GPU nodes hold 8 GPUs each. The
    # templates' fields pass the API server's own PodSpec validation in the Job and StatefulSet and reach the pods.
    gpus = {"requests": {"cpu": "10m", "memory": "16Mi"}, "limits": {GPU: "4"}}
    template = {
        "metadata": {"labels": {"team": "rl"}},
        "spec": {
            "imagePullSecrets": [{"name": "registry"}],
            "volumes": [{"name": "assets", "configMap": {"name": "sim-assets"}}],
            "containers": [{"name": "train", "envFrom": [{"secretRef": {"name": "s3"}}],
                            "volumeMounts": [{"name": "assets", "mountPath": "/assets"}]},
                           {"name": "sidecar", "image": "busybox", "command": ["sleep", "infinity"]}],
        },
    }
    apply(crd, namespace, small(replicas=2, **{
        "spec.train.nodes": 2, "spec.train.procsPerNode": 4, "spec.train.pod": {"resources": gpus},
        "spec.train.template": template, "spec.eval.pod": {"resources": {"limits": {GPU: "1"}}, "shmSize": "2Gi"},
        "spec.eval.template": {"spec": {"imagePullSecrets": [{"name": "registry"}]}},
        "spec.nccl": {"NCCL_DEBUG": "INFO"},
    }))
    wait_for("2 trainers and 2 evaluators Running", lambda: running(pods(crd, namespace, "train")) == 2
             and running(pods(crd, namespace, "eval")) == 2)
    capacity = {n["metadata"]["name"]: int(n["status"]["allocatable"].get(GPU, "0")) for n in items(crd, "nodes")}
    used: dict[str, int] = {}
    for pod in pods(crd, namespace):
        role = pod["metadata"]["labels"][contract.LABEL_ROLE]
        runtime = next(c for c in pod["spec"]["containers"] if c["name"] == role)
        env = {e["name"]: e.get("value") for e in runtime["env"]}
        volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
        assert env["NCCL_DEBUG"] == "INFO" and pod["spec"]["imagePullSecrets"] == [{"name": "registry"}]
        assert volumes[contract.SHM_VOLUME]["emptyDir"] == {
            "medium": "Memory", "sizeLimit": "2Gi" if role == "eval" else "1Gi"}
        used[pod["spec"]["nodeName"]] = used.get(pod["spec"]["nodeName"], 0) + int(runtime["resources"]["limits"][GPU])
        if role == "train":
            assert "--nproc-per-node=4" in runtime["command"] and runtime["resources"]["limits"][GPU] == "4"
            assert pod["metadata"]["labels"]["team"] == "rl" and "assets" in volumes
            assert runtime["envFrom"] == [{"secretRef": {"name": "s3"}}]
            assert [c["name"] for c in pod["spec"]["containers"]] == ["train", "sidecar"]
    assert all(capacity[node] >= count for node, count in used.items()), (used, capacity)
    assert sum(used.values()) == 2 * 4 + 2
