"""A real pod finds the project at fixed paths of its own: with the host's checkout and virtualenv paths hidden (as
the chart's emptyDir at /tmp hides a clone under /tmp), `rlightning-operator` is on PATH and the checkout's code
is imported."""

from __future__ import annotations

import pathlib
import sys

import yaml

from devcluster import _realnode
from realpods_helpers import pod_phase, python_pod, wait_for

CODE = (
    "import subprocess, rlightning, rlightning_operator;"
    "print(rlightning.__file__, rlightning_operator.__file__);"
    "subprocess.run(['rlightning-operator', '--help'], check=True, stdout=subprocess.DEVNULL)"
)


def test_the_operator_and_the_checkouts_code_are_found_with_the_host_paths_hidden(cluster, real_namespace):
    hidden = sorted({"/tmp", str(_realnode.repository_root()), str(pathlib.Path(sys.prefix).resolve())})
    pod = python_pod("paths", CODE)
    pod["spec"]["restartPolicy"] = "Never"
    pod["spec"]["volumes"] = [{"name": f"hide-{i}", "emptyDir": {}} for i in range(len(hidden))]
    pod["spec"]["containers"][0]["volumeMounts"] = [
        {"name": f"hide-{i}", "mountPath": path} for i, path in enumerate(hidden)
    ]
    cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=yaml.safe_dump(pod))

    wait_for("the pod to end", lambda: pod_phase(cluster, real_namespace, "paths") in {"Succeeded", "Failed"})
    log = cluster.kubectl("logs", "paths", "-n", real_namespace, check=False)
    assert pod_phase(cluster, real_namespace, "paths") == "Succeeded", log.stdout + log.stderr
    library, operator = log.stdout.split()[:2]
    assert library == "/opt/rlightning/src/rlightning/__init__.py"
    assert operator == "/opt/rlightning/src/operator/rlightning_operator/__init__.py"
