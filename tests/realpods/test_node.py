"""The real node: Ready with its label, and a real pod's logs, exec, cluster DNS and API server access."""

from __future__ import annotations

import yaml

import devcluster
from realpods_helpers import pod_phase, python_pod, wait_for
from tests.operator.operator_cluster import get_json

LOG_LINE = "hello from a real pod"


def test_node_is_ready_with_its_label_and_the_machine_cpus(cluster, real_node):
    node = get_json(cluster, "node", devcluster.NODE_NAME)
    ready = {c["type"]: c["status"] for c in node["status"]["conditions"]}["Ready"]
    assert ready == "True"
    assert node["metadata"]["labels"][devcluster.NODE_LABEL] == "true"
    assert node["status"]["allocatable"]["cpu"] in {"1", "2", "1900m", "2000m"}
    kwok_nodes = [n for n in get_json(cluster, "nodes")["items"] if n["metadata"]["name"] != devcluster.NODE_NAME]
    assert kwok_nodes and all(devcluster.NODE_LABEL not in n["metadata"]["labels"] for n in kwok_nodes)


def test_logs_exec_dns_and_api_server_from_a_real_pod(cluster, real_namespace):
    code = f"import time; print({LOG_LINE!r}, flush=True); time.sleep(600)"
    cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=yaml.safe_dump(python_pod("probe", code)))
    wait_for("the pod to run", lambda: pod_phase(cluster, real_namespace, "probe") == "Running")

    wait_for("its log line", lambda: LOG_LINE in cluster.kubectl("logs", "probe", "-n", real_namespace).stdout)

    def exec_python(code: str) -> str:
        return cluster.kubectl("exec", "probe", "-n", real_namespace, "--", "python", "-c", code).stdout.strip()

    assert exec_python("import os; print(os.getpid())") != "1"  # a new process in the container, not its log
    address = exec_python("import socket; print(socket.gethostbyname('kubernetes.default.svc.cluster.local'))")
    assert address == "10.96.0.1"
    version = exec_python(
        "import json, ssl, urllib.request;"
        "d = '/var/run/secrets/kubernetes.io/serviceaccount';"
        "req = urllib.request.Request('https://kubernetes.default.svc/version',"
        " headers={'Authorization': 'Bearer ' + open(d + '/token').read()});"
        "ctx = ssl.create_default_context(cafile=d + '/ca.crt');"
        "print(json.load(urllib.request.urlopen(req, context=ctx, timeout=10))['gitVersion'])"
    )
    assert version == devcluster.KUBERNETES
