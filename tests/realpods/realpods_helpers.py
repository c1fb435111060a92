"""Helpers of the real-node tests: pods, PolicyGroups and local volumes placed on the real node, kubectl JSON, host
checks."""

from __future__ import annotations

import contextlib
import json
import pathlib
import shutil
from collections.abc import Iterator

import devcluster
from tests import _polling
from tests.operator.operator_cluster import apply, example, get_json

WAIT_SECONDS = 120.0
"""Bound for a pod on the real node to start (image is local; python with torch imports in a few seconds)."""

TRAIN_SECONDS = 420.0
"""Bound for the small cartpole PolicyGroup to reach Succeeded on 2 shared cores (51 s seen on an idle machine)."""

ON_REAL_NODE = {devcluster.NODE_LABEL: "true"}
"""nodeSelector of every pod these tests start (kwok's nodes lack the label)."""

CLAIM = "cartpole-checkpoints"
"""The checkpoint claim of the `checkpoint_claim` fixture (conftest.py)."""

SMALL_REQUESTS = {"requests": {"cpu": "100m", "memory": "128Mi"}}
"""Requests that fit a 2-CPU node many times over; no limits (torch needs several hundred MiB per process)."""


def real_pod(**fields) -> dict:
    """`spec.<role>.pod` on the real node with `SMALL_REQUESTS`, plus `fields` (a PodConfig's, by their YAML names)."""
    return {"nodeSelector": dict(ON_REAL_NODE), "resources": SMALL_REQUESTS, **fields}


def real_cartpole(name: str, **paths) -> dict:
    """examples/cartpole.yaml (one trainer rank, 2 evaluators) on the real node with small requests.

    Args:
        name (str): metadata.name.
        **paths: More dotted-path edits, as `tests.operator.operator_cluster.example` takes them.
    """
    pod = real_pod()
    edits = {
        "spec.image": devcluster.IMAGE, "spec.imagePullPolicy": "Never", "spec.train.pod": pod, "spec.eval.pod": pod
    }
    return example(name, **{**edits, **paths})


def wait_for(what: str, check, timeout: float = WAIT_SECONDS, interval: float = 0.5, explain=None):
    """`tests._polling.wait_for` with this module's default bound."""
    return _polling.wait_for(what, check, timeout, interval, explain)


def wait_until_succeeded(cluster, namespace: str, name: str) -> dict:
    """Wait (up to `TRAIN_SECONDS`) until PolicyGroup `name` is Succeeded, failing at once on Failed or Invalid.

    Returns:
        dict: Its status.
    """

    def succeeded() -> bool:
        group = get_json(cluster, "pg", name, "-n", namespace)
        phase = (group.get("status") or {}).get("phase", "")
        assert phase not in {"Failed", "Invalid"}, f"PolicyGroup went {phase}: {group.get('status')}"
        return phase == "Succeeded"

    wait_for(f"PolicyGroup {name} to succeed", succeeded, timeout=TRAIN_SECONDS, interval=2.0)
    return get_json(cluster, "pg", name, "-n", namespace)["status"]


def python_pod(name: str, code: str) -> dict:
    """A pod on the real node running `python -c code` in the local runtime image."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "nodeSelector": dict(ON_REAL_NODE),
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "main",
                    "image": devcluster.IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", code],
                    "resources": SMALL_REQUESTS,
                }
            ],
        },
    }


def pod_phase(cluster, namespace: str, name: str) -> str:
    """The pod's phase ("" while it does not exist)."""
    proc = cluster.kubectl("get", "pod", name, "-n", namespace, "-o", "jsonpath={.status.phase}", check=False)
    return proc.stdout.strip() if proc.returncode == 0 else ""


def pods_on_host(node: devcluster.RealNode, uids: set[str]) -> list[str]:
    """What the node still holds on the host for the given pod UIDs: running containers, pod folders, cgroups.

    Args:
        node (devcluster.RealNode): The real node.
        uids (set[str]): Pod UIDs.

    Returns:
        list[str]: One line per leftover (empty when the pods left nothing).
    """
    left = [f"running container {task}" for task in node.tasks_of(uids)]
    pods_dir = node.layout.kubelet_root / "pods"
    left += [f"pod folder {pods_dir / uid}" for uid in uids if (pods_dir / uid).exists()]
    for hierarchy in pathlib.Path("/sys/fs/cgroup").iterdir():
        for uid in uids:
            left += [f"cgroup {path}" for path in hierarchy.glob(f"kubepods*/**/pod{uid}")]
    return left


def local_volume(name: str, path: pathlib.Path, namespace: str, claim: str) -> dict:
    """A local PersistentVolume at `path` on the real node, reserved for one claim (storage class "").

    Args:
        name (str): metadata.name of the volume.
        path (pathlib.Path): An existing folder on the host (the node's filesystem).
        namespace (str): Namespace of the claim it is reserved for.
        claim (str): Name of that claim (spec.claimRef: no other claim can take it).

    Returns:
        dict: A v1 PersistentVolume with node affinity to the real node (reclaim policy Retain).
    """
    on_node = {"key": devcluster.NODE_LABEL, "operator": "In", "values": ["true"]}
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolume",
        "metadata": {"name": name},
        "spec": {
            "capacity": {"storage": "1Gi"},
            "accessModes": ["ReadWriteOnce"],
            "persistentVolumeReclaimPolicy": "Retain",
            "storageClassName": "",
            "volumeMode": "Filesystem",
            "local": {"path": str(path)},
            "nodeAffinity": {"required": {"nodeSelectorTerms": [{"matchExpressions": [on_node]}]}},
            "claimRef": {"namespace": namespace, "name": claim},
        },
    }


def volume_claim(name: str, volume: str) -> dict:
    """A PersistentVolumeClaim of 1Gi bound to the named volume (storage class "", so no default class applies)."""
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {"name": name},
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": "",
            "volumeName": volume,
            "resources": {"requests": {"storage": "1Gi"}},
        },
    }


@contextlib.contextmanager
def local_claim(cluster, node: devcluster.RealNode, namespace: str, claim: str) -> Iterator[pathlib.Path]:
    """A Bound claim on a local volume under the real node's folder, for the namespace's PolicyGroups.

    Args:
        cluster: The devcluster.
        node (devcluster.RealNode): The real node (its folder holds the volume's).
        namespace (str): The claim's namespace.
        claim (str): The claim's name; the volume is ``<namespace>-<claim>``.

    Yields:
        pathlib.Path: The volume's folder on the host. On exit the namespace's PolicyGroups, their pods, the claim,
        the volume and the folder are removed.
    """
    volume = f"{namespace}-{claim}"
    folder = node.layout.root / "volumes" / volume
    folder.mkdir(parents=True)
    cluster.kubectl("apply", "-f", "-", input=json.dumps(local_volume(volume, folder, namespace, claim)))
    apply(cluster, namespace, volume_claim(claim, volume))
    wait_for(f"claim {claim} to bind to {volume}",
             lambda: get_json(cluster, "pvc", claim, "-n", namespace)["status"].get("phase") == "Bound")
    try:
        yield folder
    finally:
        # A completed trainer pod still uses the claim (pvc-protection), and a bound volume is not deleted
        # (pv-protection): the group and its pods go first, then the claim, then the volume.
        timeout = f"--timeout={WAIT_SECONDS:.0f}s"
        cluster.kubectl("delete", "pg", "--all", "-n", namespace, timeout, check=False)
        wait_for("the group's pods to be gone", lambda: not get_json(cluster, "pods", "-n", namespace)["items"],
                 timeout=180.0)
        cluster.kubectl("delete", "pvc", claim, "-n", namespace, timeout, check=False)
        cluster.kubectl("delete", "pv", volume, timeout, check=False)
        shutil.rmtree(folder, ignore_errors=True)


SIGNAL_TRAINER = """
import os, signal, sys
signum, workers_only = getattr(signal, sys.argv[1]), sys.argv[2] == "workers"
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        argv = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\\0")
    except OSError:
        continue
    if b"rlightning.runtime.train" in argv and not (workers_only and b"torch.distributed.run" in argv):
        os.kill(int(pid), signum)
        print("signalled", pid)
"""
"""Run in a trainer container: signal its training processes (torchrun's workers, and torchrun too unless
`workers`)."""


def signal_trainer(cluster, namespace: str, pod: str, signame: str, *, workers_only: bool) -> None:
    """Send `signame` (e.g. `SIGKILL`) to the training processes in `pod`'s `train` container; at least one must be
    found (AssertionError otherwise)."""
    which = "workers" if workers_only else "all"
    out = cluster.kubectl("exec", pod, "-n", namespace, "-c", "train", "--", "python", "-c", SIGNAL_TRAINER,
                          signame, which).stdout  # fmt: skip
    assert "signalled" in out, out
