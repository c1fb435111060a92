"""Behaviour 6 of issue 8 on the real node: the operator installed by the Helm chart runs as a real pod.

The chart is installed unchanged but for values (the local image with pullPolicy Never, a nodeSelector for the
real node, the test's namespace to watch), so its Deployment, probes, ServiceAccount, RBAC and security context
(non-root UID 10001, read-only root filesystem, no capabilities, RuntimeDefault seccomp) all act for real; the
operator pod then reconciles a small PolicyGroup, whose trainer and evaluator pods train it to Succeeded.
"""

from __future__ import annotations

import json

import yaml

import devcluster
from realpods_helpers import ON_REAL_NODE, TRAIN_SECONDS, WAIT_SECONDS, real_cartpole, wait_for
from tests.helm.helm_chart import CHART, RELEASE, Helm
from tests.operator.operator_cluster import apply, get_json

PROCESS_CHECK = """
import json, os
try:
    open("/written-by-operator", "w")
    root_writable = True
except OSError:
    root_writable = False
status = dict(line.split(":", 1) for line in open("/proc/self/status"))
print(json.dumps({"uid": os.getuid(), "gid": os.getgid(), "root_writable": root_writable,
                  "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
                  "seccomp": status["Seccomp"].strip()}))
"""
"""Run in the operator's container: what its security context made of the process."""


def test_helm_installed_operator_runs_as_a_real_pod_and_reconciles_a_policygroup(
    cluster, real_crd, real_node, real_namespace, tmp_path
):
    helm = Helm(cluster.bin("helm"), tmp_path / "helm-home", cluster.kubeconfig)
    repository, tag = devcluster.IMAGE.rsplit(":", 1)
    values = {
        "image": {"repository": repository, "tag": tag, "pullPolicy": "Never"},
        "nodeSelector": dict(ON_REAL_NODE),
        "watchNamespaces": [real_namespace],
    }
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    helm("install", RELEASE, str(CHART), "-n", real_namespace, "-f", str(tmp_path / "values.yaml"),
         "--wait", "--timeout", f"{WAIT_SECONDS:.0f}s")
    selector = f"app.kubernetes.io/instance={RELEASE},app.kubernetes.io/component=operator"
    try:
        (pod,) = get_json(cluster, "pods", "-n", real_namespace, "-l", selector)["items"]
        name = pod["metadata"]["name"]
        assert pod["spec"]["nodeName"] == devcluster.NODE_NAME
        # Ready means the kubelet's readiness probe got 200 from kopf's /healthz on the pod's address.
        assert {c["type"]: c["status"] for c in pod["status"]["conditions"]}["Ready"] == "True"
        probed = pod["spec"]["containers"][0]
        assert probed["readinessProbe"]["httpGet"]["path"] == "/healthz" and "livenessProbe" in probed
        inside = json.loads(cluster.kubectl("exec", name, "-n", real_namespace, "--", "python", "-c",
                                            PROCESS_CHECK).stdout)
        assert (inside["uid"], inside["gid"]) == (10001, 10001)
        assert inside["root_writable"] is False
        assert int(inside["cap_eff"], 16) == 0 and inside["no_new_privs"] == "1"
        assert inside["seccomp"] == "2"  # filter mode: the runtime's default profile

        apply(cluster, real_namespace, real_cartpole("helm-cartpole"))

        def succeeded() -> bool:
            group = get_json(cluster, "pg", "helm-cartpole", "-n", real_namespace)
            phase = (group.get("status") or {}).get("phase", "")
            assert phase not in {"Failed", "Invalid"}, f"PolicyGroup went {phase}: {group.get('status')}"
            return phase == "Succeeded"

        wait_for("PolicyGroup helm-cartpole to succeed under the operator pod", succeeded,
                 timeout=TRAIN_SECONDS, interval=2.0,
                 explain=lambda: cluster.kubectl("logs", name, "-n", real_namespace, "--tail=40", check=False).stdout)
        training = get_json(cluster, "pg", "helm-cartpole", "-n", real_namespace)["status"]["training"]
        assert training["consistent"] is True and training["weightVersion"] > 0
        operator_pod = get_json(cluster, "pod", name, "-n", real_namespace)
        assert operator_pod["status"]["containerStatuses"][0]["restartCount"] == 0  # liveness held throughout
        log = cluster.kubectl("logs", name, "-n", real_namespace).stdout
        assert "helm-cartpole" in log
    finally:
        helm("uninstall", RELEASE, "-n", real_namespace, "--wait", "--timeout", f"{WAIT_SECONDS:.0f}s", check=False)
