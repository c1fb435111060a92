"""Controllers, scheduler and kwok act together: Deployments run, garbage collection and namespace deletion work."""

from __future__ import annotations

import json
import time

import pytest

pytestmark = pytest.mark.cluster

WAIT_SECONDS = 90.0
"""Bound for each condition awaited below."""

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
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.5)


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
