"""Behaviour 5 of issue 8 on the real node: checkpoints on a PersistentVolumeClaim outlive the PolicyGroup.

A test-created local PersistentVolume (a folder under the node's work folder, node affinity to the real node,
reserved for one claim) backs the claim that `spec.train.checkpoint.persistentVolumeClaim` names. The group
trains a few iterations, writing checkpoints to it; it is deleted (its pods go, the claim stays) and applied again
with the same claim and a larger step budget: the new trainer pod resumes from the newest checkpoint, so its
iterations and weight versions continue where the first run stopped instead of starting again from 0.
"""

from __future__ import annotations

import json

from realpods_helpers import CLAIM, WAIT_SECONDS, real_cartpole, wait_for, wait_until_succeeded
from rlightning.runtime.rundir import RunDir
from tests.operator.operator_cluster import apply, get_json

FIRST_ENV_STEPS = 1024
"""Step budget of the first run: 4 iterations (one rank learning from 2 batches of 4 envs x 32 steps: 256 env
steps each)."""
SECOND_ENV_STEPS = 2048
"""Step budget when applied again: 4 more iterations if it resumes (8 from scratch would also reach it)."""


def _succeeded(cluster, namespace: str, name: str) -> dict:
    """Wait until the PolicyGroup is Succeeded (failing on Failed or Invalid); its status.training."""
    return wait_until_succeeded(cluster, namespace, name)["training"]


def test_policygroup_applied_again_with_the_same_claim_resumes_from_its_checkpoint(
    cluster, real_namespace, real_operator, checkpoint_claim
):
    run_dir = checkpoint_claim
    edits = {
        "spec.train.checkpoint": {"persistentVolumeClaim": CLAIM, "intervalIterations": 2},
        "spec.train.targetEvalReturn": None,  # stop on the step budget only
        "spec.eval.replicas": 1,
    }
    apply(cluster, real_namespace, real_cartpole("resumed", **edits, **{"spec.train.totalEnvSteps": FIRST_ENV_STEPS}))
    first = _succeeded(cluster, real_namespace, "resumed")
    assert first["iteration"] == 4 and first["weightVersion"] > 0
    newest = RunDir(run_dir).newest_checkpoint()
    assert newest is not None and newest.name.startswith("iter-00000004-epoch-"), list(run_dir.glob("checkpoints/*"))
    first_epoch = RunDir(run_dir).marked_epoch()
    first_summary = json.loads((run_dir / "summary.json").read_text())
    assert first_summary["resumed_from"] is None

    cluster.kubectl("delete", "pg", "resumed", "-n", real_namespace, "--wait=true", f"--timeout={WAIT_SECONDS:.0f}s")
    wait_for("the first run's pods to be gone",
             lambda: not get_json(cluster, "pods", "-n", real_namespace)["items"], timeout=180.0)
    assert get_json(cluster, "pvc", CLAIM, "-n", real_namespace)["status"]["phase"] == "Bound"

    apply(cluster, real_namespace, real_cartpole("resumed", **edits, **{"spec.train.totalEnvSteps": SECOND_ENV_STEPS}))
    second = _succeeded(cluster, real_namespace, "resumed")
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"] is not None and summary["resumed_from"].endswith(newest.name)
    assert RunDir(run_dir).marked_epoch() > first_epoch  # applied again: a later creation, a higher epoch
    assert second["iteration"] == 8 and second["envSteps"] == SECOND_ENV_STEPS
    assert second["weightVersion"] > first["weightVersion"]
    # One metrics row per iteration over both runs: the second run's rows continue the count, none restarts it.
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [row["iteration"] for row in rows] == list(range(1, 9))
    versions = [row["weight_version"] for row in rows]
    assert versions == sorted(versions) and versions[4] > first["weightVersion"]  # published every iteration
