"""Controllers, scheduler and kwok act together: Deployments run, garbage collection and namespace deletion work.

Deleted pods become terminal before they go (kwok's ``pod-kill-on-delete`` stage stands in for the kubelet), so
the Job controller's tracking finalizer on pods of a Job with a podFailurePolicy never blocks a deletion.
"""

from __future__ import annotations

import json
import uuid

import pytest

from tests._polling import wait_for

pytestmark = pytest.mark.cluster

WAIT_SECONDS = 90.0
"""Bound for each condition awaited below."""

DELETE_SECONDS = 60.0
"""Bound for a deletion that waits on pods becoming terminal (seconds on a real cluster too)."""

JOB_TRACKING_FINALIZER = "batch.kubernetes.io/job-tracking"
"""Finalizer the Job controller puts on its pods; with a podFailurePolicy it stays until the pod is terminal."""

INDEXED_JOB = """
apiVersion: batch/v1
kind: Job
metadata:
  name: trainer
spec:
  completionMode: Indexed
  completions: 2
  parallelism: 2
  backoffLimit: 0
  podFailurePolicy:
    rules:
    - action: FailJob
      onExitCodes: {containerName: train, operator: In, values: [2]}
    - action: Ignore
      onPodConditions:
      - type: DisruptionTarget
  template:
    metadata:
      labels: {app: trainer}
    spec:
      restartPolicy: Never
      containers:
      - name: train
        image: registry.invalid/trainer:1
        resources:
          requests: {cpu: "1", memory: 1Gi}
"""

STATEFUL_SET = """
apiVersion: apps/v1
kind: StatefulSet
metadata:
  name: db
spec:
  replicas: 2
  serviceName: db
  selector:
    matchLabels: {app: db}
  template:
    metadata:
      labels: {app: db}
    spec:
      containers:
      - name: db
        image: registry.invalid/db:1
"""

DEPLOYMENT = """
apiVersion: apps/v1
kind: Deployment
metadata:
  name: web
spec:
  replicas: 3
  selector:
    matchLabels: {app: web}
  template:
    metadata:
      labels: {app: web}
    spec:
      containers:
      - name: web
        image: registry.invalid/web:1
        resources:
          requests: {cpu: "1", memory: 1Gi}
"""


def _wait_for(what: str, check, timeout: float = WAIT_SECONDS):
    return wait_for(what, check, timeout, interval=0.5)


def _items(cluster, *args: str) -> list[dict]:
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)["items"]


def test_deployment_runs_on_fake_nodes_and_is_garbage_collected(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=DEPLOYMENT)

    def running_pods():
        pods = _items(cluster, "pods", "-n", namespace, "-l", "app=web")
        return pods if len(pods) == 3 and all(p["status"].get("phase") == "Running" for p in pods) else None

    pods = _wait_for("3 Running pods", running_pods)
    nodes = {n["metadata"]["name"] for n in _items(cluster, "nodes", "-l", "type=kwok")}
    for pod in pods:
        assert pod["spec"]["nodeName"] in nodes
        assert pod["status"]["podIP"]
    assert len(_items(cluster, "replicasets", "-n", namespace)) == 1

    cluster.kubectl("delete", "deployment", "web", "-n", namespace, "--wait=false")
    _wait_for(
        "ReplicaSet and pods to be garbage-collected",
        lambda: not _items(cluster, "replicasets", "-n", namespace) and not _items(cluster, "pods", "-n", namespace),
    )


def test_namespace_deletion_removes_namespace_and_contents(cluster):
    name = "t-delete-me"
    cluster.kubectl("create", "namespace", name)
    cluster.kubectl("create", "configmap", "c", "--from-literal=a=b", "-n", name)
    cluster.kubectl("delete", "namespace", name, "--wait=false")
    _wait_for(
        f"namespace {name} to disappear",
        lambda: cluster.kubectl("get", "namespace", name, check=False).returncode != 0,
    )
    gone = cluster.kubectl("get", "namespace", name, check=False)
    assert "NotFound" in gone.stderr


def _running_job_pods(cluster, namespace: str) -> list[dict]:
    """Start :data:`INDEXED_JOB` in ``namespace`` and return its 2 pods once both run and carry the finalizer."""
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=INDEXED_JOB)

    def running():
        pods = _items(cluster, "pods", "-n", namespace, "-l", "app=trainer")
        ok = len(pods) == 2 and all(
            p["status"].get("phase") == "Running" and JOB_TRACKING_FINALIZER in p["metadata"].get("finalizers", [])
            for p in pods
        )
        return pods if ok else None

    return _wait_for("2 Running trainer pods with the job-tracking finalizer", running)


def test_namespace_with_running_job_with_pod_failure_policy_is_deleted(cluster):
    name = f"t-job-{uuid.uuid4().hex[:8]}"
    cluster.kubectl("create", "namespace", name)
    try:
        _running_job_pods(cluster, name)
        cluster.kubectl("delete", "namespace", name, "--wait=false")
        _wait_for(
            f"namespace {name} (Running Job pods with a podFailurePolicy) to disappear",
            lambda: cluster.kubectl("get", "namespace", name, check=False).returncode != 0,
            timeout=DELETE_SECONDS,
        )
    finally:
        cluster.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found", check=False)


@pytest.mark.parametrize("cascade", ["foreground", "background"])
def test_job_deletion_removes_running_pods(cluster, namespace, cascade):
    _running_job_pods(cluster, namespace)
    cluster.kubectl("delete", "job", "trainer", "-n", namespace, f"--cascade={cascade}", "--wait=false")
    _wait_for(
        f"Job trainer and its Running pods to be deleted (--cascade={cascade})",
        lambda: not _items(cluster, "jobs", "-n", namespace) and not _items(cluster, "pods", "-n", namespace),
        timeout=DELETE_SECONDS,
    )


def test_deleted_pod_of_running_job_counts_as_failed(cluster, namespace):
    pods = _running_job_pods(cluster, namespace)
    cluster.kubectl("delete", "pod", pods[0]["metadata"]["name"], "-n", namespace, "--wait=false")

    def failed_job():
        job = json.loads(cluster.kubectl("get", "job", "trainer", "-n", namespace, "-o", "json").stdout)
        conditions = {c["type"]: c for c in job["status"].get("conditions", []) if c["status"] == "True"}
        return job if "Failed" in conditions else None

    job = _wait_for("Job trainer to fail (backoffLimit 0) after one Running pod was deleted", failed_job,
                    timeout=DELETE_SECONDS)
    assert job["status"]["failed"] >= 1
    reasons = {c["reason"] for c in job["status"]["conditions"] if c["type"] == "Failed"}
    assert reasons == {"BackoffLimitExceeded"}


def test_deleted_pod_turns_failed_with_killed_containers_like_a_kubelet(cluster, namespace):
    held = "example.com/held"
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "held", "finalizers": [held]},
        "spec": {
            "restartPolicy": "Always",
            "initContainers": [
                {"name": "setup", "image": "registry.invalid/setup:1"},
                {"name": "sidecar", "image": "registry.invalid/sidecar:1", "restartPolicy": "Always"},
            ],
            "containers": [{"name": "main", "image": "registry.invalid/main:1"}],
        },
    }
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=json.dumps(pod))

    def get():
        return json.loads(cluster.kubectl("get", "pod", "held", "-n", namespace, "-o", "json").stdout)

    running = _wait_for("pod held Running", lambda: (p := get())["status"].get("phase") == "Running" and p)
    setup_before = running["status"]["initContainerStatuses"][0]["state"]["terminated"]
    cluster.kubectl("delete", "pod", "held", "-n", namespace, "--wait=false")
    try:
        failed = _wait_for(
            "deleted pod held to turn Failed", lambda: (p := get())["status"].get("phase") == "Failed" and p
        )
        killed = [*failed["status"]["containerStatuses"], failed["status"]["initContainerStatuses"][1]]
        assert [c["name"] for c in killed] == ["main", "sidecar"]
        for status in killed:
            assert not status["ready"]
            assert status["state"]["terminated"]["exitCode"] == 137
            assert status["state"]["terminated"]["reason"] == "Error"
        setup = failed["status"]["initContainerStatuses"][0]
        assert setup["name"] == "setup" and setup["state"]["terminated"] == setup_before
        ready = {c["type"]: c["status"] for c in failed["status"]["conditions"]}
        assert ready["Ready"] == ready["ContainersReady"] == "False"
    finally:
        cluster.kubectl("patch", "pod", "held", "-n", namespace, "--type=json",
                        "--patch", '[{"op": "remove", "path": "/metadata/finalizers"}]', check=False)
    _wait_for("pod held to be removed once its finalizer is gone",
              lambda: cluster.kubectl("get", "pod", "held", "-n", namespace, check=False).returncode != 0)


def test_deleted_stateful_set_pod_is_replaced(cluster, namespace):
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=STATEFUL_SET)

    def running(exclude_uid: str = ""):
        pods = _items(cluster, "pods", "-n", namespace, "-l", "app=db")
        ok = len(pods) == 2 and all(
            p["status"].get("phase") == "Running" and p["metadata"]["uid"] != exclude_uid for p in pods
        )
        return {p["metadata"]["name"]: p["metadata"]["uid"] for p in pods} if ok else None

    before = _wait_for("2 Running StatefulSet pods", running)
    cluster.kubectl("delete", "pod", "db-0", "-n", namespace, "--wait=false")
    after = _wait_for("db-0 replaced by a new Running pod", lambda: running(exclude_uid=before["db-0"]))
    assert after["db-1"] == before["db-1"]
