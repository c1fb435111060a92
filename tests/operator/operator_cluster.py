"""Helpers for the operator's integration tests: the CRD, the operator as a subprocess, polling, kubectl JSON.

The operator runs as `rlightning-operator` (the real entry point) in its own process, so a test can kill it
with SIGKILL and start it again. Its liveness and metrics ports are the OPERATOR block of tests/_ports.py, two per
devcluster slot, so that sessions on different slots do not collide.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import yaml
from devcluster._ports import slot_from_env
from tests import _polling
from tests._ports import OPERATOR

REPO = Path(__file__).resolve().parents[2]
CRD_FILE = REPO / "crds" / "policygroups.rlightning.io.yaml"
EXAMPLE = REPO / "examples" / "cartpole.yaml"
WAIT_SECONDS = 90.0
"""Bound for each condition awaited in these tests."""
OPERATOR_START_SECONDS = 60.0
"""Bound for the operator's liveness endpoint to answer after start."""


def wait_for(what: str, check, timeout: float = WAIT_SECONDS, interval: float = 0.3):
    """`tests._polling.wait_for` with this module's default bound (WAIT_SECONDS)."""
    return _polling.wait_for(what, check, timeout, interval)


def get_json(cluster, *args: str) -> dict:
    """`kubectl get ... -o json` as a dict."""
    return json.loads(cluster.kubectl("get", *args, "-o", "json").stdout)


def items(cluster, *args: str) -> list[dict]:
    """The items of `kubectl get <list> -o json`."""
    return get_json(cluster, *args)["items"]


def install_crd(cluster) -> None:
    """Apply crds/ and wait until the API serves PolicyGroups."""
    cluster.kubectl("apply", "-f", str(CRD_FILE))
    wait_for("the CRD to be Established", lambda: cluster.kubectl(
        "get", "crd/policygroups.rlightning.io", "-o", 'jsonpath={.status.conditions[?(@.type=="Established")].status}',
        check=False).stdout.strip() == "True")
    wait_for("policygroups to be served", lambda: cluster.kubectl("get", "pg", "-A", check=False).returncode == 0)


def example(name: str = "cartpole", **paths) -> dict:
    """examples/cartpole.yaml with a name and dotted-path edits, e.g. example(**{"spec.eval.replicas": 10})."""
    document = yaml.safe_load(EXAMPLE.read_text())
    document["metadata"]["name"] = name
    for path, value in paths.items():
        node = document
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return document


def small(name: str = "cartpole", replicas: int = 2, **paths) -> dict:
    """The example with tiny resource requests (fits hundreds of pods on the fake nodes)."""
    tiny = {"resources": {"requests": {"cpu": "10m", "memory": "16Mi"}}}
    return example(name, **{"spec.train.pod": tiny, "spec.eval.pod": tiny, "spec.eval.replicas": replicas, **paths})


def apply(cluster, namespace: str, document: dict, check: bool = True) -> subprocess.CompletedProcess:
    """`kubectl apply -n namespace -f -` of one document."""
    return cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document), check=check)


def pods(cluster, namespace: str, role: str | None = None) -> list[dict]:
    """Pods of the namespace, optionally of one role."""
    selector = ["-l", f"rlightning.io/role={role}"] if role else []
    return items(cluster, "pods", "-n", namespace, *selector)


def running(pod_list: list[dict]) -> int:
    """How many pods are Running and not being deleted."""
    return sum(
        1 for p in pod_list if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")
    )


def condition(group: dict, type_: str) -> dict:
    """A condition of a PolicyGroup's status ({} when absent)."""
    for item in (group.get("status") or {}).get("conditions") or []:
        if item["type"] == type_:
            return item
    return {}


class OperatorProcess:
    """`rlightning-operator --namespace NS` as a child process, logging to a file.

    Args:
        cluster: The devcluster (for its admin kubeconfig).
        namespace (str): The namespace to serve.
        log_path (Path): Where stdout and stderr go (appended across restarts).
        ports (tuple[int, int] | None, optional): (health, metrics) ports; metrics 0 disables it. Defaults to the
            slot's two ports of the OPERATOR block.
        args (tuple[str, ...], optional): Extra command-line arguments. Defaults to ().
        env (dict[str, str] | None, optional): Extra environment variables. Defaults to None.
        kubeconfig (Path | None, optional): Defaults to the cluster's admin kubeconfig.
    """

    def __init__(
        self,
        cluster,
        namespace: str,
        log_path: Path,
        ports: tuple[int, int] | None = None,
        args: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        kubeconfig: Path | None = None,
    ) -> None:
        self.cluster, self.namespace, self.log_path = cluster, namespace, log_path
        self.health_port, self.metrics_port = ports or (OPERATOR.port(2 * slot_from_env()),
                                                        OPERATOR.port(2 * slot_from_env() + 1))
        self.args, self.env = args, env or {}
        self.kubeconfig = kubeconfig or cluster.kubeconfig
        self.process: subprocess.Popen | None = None

    def start(self) -> OperatorProcess:
        """Start it and wait until its liveness endpoint answers."""
        command = [
            sys.executable, "-m", "rlightning_operator", "--namespace", self.namespace,
            "--kubeconfig", str(self.kubeconfig), "--health-port", str(self.health_port),
            "--metrics-port", str(self.metrics_port), *self.args,
        ]
        with open(self.log_path, "a") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=REPO,
                                            env={**os.environ, **self.env})
        wait_for("the operator's liveness endpoint", self._healthy, timeout=OPERATOR_START_SECONDS)
        return self

    def health(self) -> tuple[int, dict]:
        """(HTTP status, JSON body) of its /healthz; (0, {}) when it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as response:
                return response.status, json.loads(response.read())
        except urllib.error.HTTPError as error:
            return error.code, json.loads(error.read() or b"{}")
        except (urllib.error.URLError, OSError):
            return 0, {}

    def _healthy(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"operator exited with {self.process.returncode}:\n{self.log()[-3000:]}")
        return self.health()[0] == 200

    def kill(self) -> None:
        """SIGKILL: no graceful shutdown, as when a node dies."""
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        """SIGTERM and wait (kill after 30 s); returns the exit code."""
        if self.process is None or self.process.poll() is not None:
            return self.process.returncode if self.process else 0
        self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(timeout=30)

    def log(self) -> str:
        """Everything it logged so far."""
        return self.log_path.read_text() if self.log_path.exists() else ""

    def metrics(self) -> dict[str, float]:
        """Its Prometheus samples, `name{labels}` -> value."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        samples = {}
        for line in text.splitlines():
            match = re.match(r"^([a-zA-Z_:][\w:]*(?:\{[^}]*\})?) (\S+)$", line)
            if match:
                samples[match.group(1)] = float(match.group(2))
        return samples

    def counter(self, name: str, **labels: str) -> float:
        """Sum of a counter's samples whose labels include `labels`."""
        total = 0.0
        for sample, value in self.metrics().items():
            if not sample.startswith(name + "{") and sample != name:
                continue
            if all(f'{key}="{value_}"' in sample for key, value_ in labels.items()):
                total += value
        return total
