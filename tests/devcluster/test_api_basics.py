"""The control plane serves the pinned version and enforces RBAC for ServiceAccounts."""

from __future__ import annotations

import json
import subprocess

import kubernetes
import pytest

import devcluster

pytestmark = pytest.mark.cluster


def test_version_endpoint_reports_pinned_release(cluster):
    version = json.loads(cluster.kubectl("get", "--raw", "/version").stdout)
    assert version["gitVersion"] == devcluster.KUBERNETES
    assert (version["major"], version["minor"]) == ("1", devcluster.KUBERNETES.split(".")[1])


def test_api_client_is_admin(cluster):
    with cluster.api_client() as api:
        nodes = kubernetes.client.CoreV1Api(api).list_node(label_selector="type=kwok").items
        review = kubernetes.client.AuthenticationV1Api(api).create_self_subject_review(
            {"apiVersion": "authentication.k8s.io/v1", "kind": "SelfSubjectReview"}
        )
    assert sorted(n.metadata.name for n in nodes) == [f"kwok-node-{i}" for i in range(4)]
    assert "system:masters" in review.status.user_info.groups


def test_kubectl_and_helm_report_pinned_versions(cluster):
    client = json.loads(cluster.kubectl("version", "-o", "json").stdout)
    assert client["clientVersion"]["gitVersion"] == devcluster.KUBERNETES
    assert client["serverVersion"]["gitVersion"] == devcluster.KUBERNETES
    helm = subprocess.run([str(cluster.bin("helm")), "version", "--short"], capture_output=True, text=True, timeout=60)
    assert helm.stdout.startswith(devcluster.HELM), helm.stdout + helm.stderr


def test_fake_nodes_are_ready_with_capacity(cluster):
    nodes = json.loads(cluster.kubectl("get", "nodes", "-l", "type=kwok", "-o", "json").stdout)["items"]
    assert len(nodes) == 4
    for node in nodes:
        ready = [c for c in node["status"]["conditions"] if c["type"] == "Ready"]
        assert ready and ready[0]["status"] == "True", node["metadata"]["name"]
        assert node["status"]["allocatable"]["pods"] == "500"
        assert node["status"]["allocatable"]["cpu"] == "32"
    gpus = sorted(int(n["status"]["allocatable"].get("nvidia.com/gpu", "0")) for n in nodes)
    assert gpus == [0, 0, 8, 8]
    # Node leases keep the nodes Ready past the node lifecycle controller's grace period (no flapping).
    leases = json.loads(cluster.kubectl("get", "leases", "-n", "kube-node-lease", "-o", "json").stdout)["items"]
    assert sorted(lease["metadata"]["name"] for lease in leases) == sorted(n["metadata"]["name"] for n in nodes)


def test_service_account_is_limited_to_its_role(cluster, namespace):
    cluster.kubectl("create", "serviceaccount", "reader", "-n", namespace)
    cluster.kubectl("create", "role", "cm-reader", "--verb=get,list", "--resource=configmaps", "-n", namespace)
    cluster.kubectl(
        "create", "rolebinding", "reader-cm", "--role=cm-reader", f"--serviceaccount={namespace}:reader",
        "-n", namespace,
    )
    kubeconfig = cluster.service_account_kubeconfig(namespace, "reader")
    kubectl = str(cluster.bin("kubectl"))
    def as_reader(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [kubectl, f"--kubeconfig={kubeconfig}", "-n", namespace, *args], capture_output=True, text=True, timeout=60
        )

    allowed = as_reader("get", "configmaps", "-o", "name")
    assert allowed.returncode == 0, allowed.stderr
    assert "configmap/kube-root-ca.crt" in allowed.stdout  # published by the root-CA controller

    denied = as_reader("create", "configmap", "x", "--from-literal=a=b")
    assert denied.returncode != 0
    assert "forbidden" in denied.stderr.lower()
    assert f"system:serviceaccount:{namespace}:reader" in denied.stderr

    whoami = as_reader("auth", "whoami", "-o", "json")
    assert json.loads(whoami.stdout)["status"]["userInfo"]["username"] == f"system:serviceaccount:{namespace}:reader"
