"""Trainer rank 0 writes a checkpoint when asked: real trainer processes (torchrun, as `rlightning run` starts them)
report status.training to a real API server (the devcluster's, through $KUBECONFIG); the PolicyGroup's
checkpoint-request annotation, set as the operator sets it when a trainer's node is marked for disruption, is
answered by a checkpoint between two periodic ones, and status.training.lastCheckpoint says which request it answered
and how long it took."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from rlightning import contract
from rlightning.runtime.local import LocalRun
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.validate import validate_file
from tests import _polling

pytestmark = pytest.mark.slow

WAIT_SECONDS = 120.0
INTERVAL = 1000
"""spec.train.checkpoint.intervalIterations: no periodic checkpoint comes within the test."""


def training(cluster, namespace: str) -> dict:
    group = json.loads(cluster.kubectl("get", "pg", "tiny", "-n", namespace, "-o", "json").stdout)
    return (group.get("status") or {}).get("training") or {}


def test_a_checkpoint_request_is_answered_by_a_checkpoint_between_periodic_ones(
    crd, namespace, tmp_path: Path, write_manifest, run_helpers
) -> None:
    tiny_manifest, _, _ = run_helpers
    document = tiny_manifest(total_env_steps=10_000_000, eval={"replicas": 0},
                             train={"procsPerNode": 1, "checkpoint": {"intervalIterations": INTERVAL, "keep": 5}})
    crd.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(document))
    manifest = write_manifest(document)
    run = LocalRun(validate_file(manifest), manifest.read_text(), RunDir(tmp_path / "run"))
    run.run_dir.create()
    run.run_dir.spec_path.write_text(run.manifest_text)
    trainer = run.child("trainer", contract.PolicyRole.TRAIN)
    trainer.env.update({contract.ENV_REPORT_STATUS: "1", contract.ENV_NAMESPACE: namespace,
                        "KUBECONFIG": str(crd.kubeconfig)})
    trainer.start()

    def log() -> str:
        return trainer.log_path.read_text()[-4000:] if trainer.log_path.exists() else ""

    try:
        _polling.wait_for("rank 0 reporting iterations", lambda: training(crd, namespace).get("iteration", 0) >= 2,
                          WAIT_SECONDS, interval=0.5, explain=log)
        assert run.run_dir.checkpoints() == [], "no periodic checkpoint yet"
        request = "2026-12-06T12:00:00Z node spot-1: Karpenter disrupts the node (taint karpenter.sh/disrupted)"
        crd.kubectl("annotate", "pg", "tiny", "-n", namespace, f"{contract.ANNOTATION_CHECKPOINT_REQUEST}={request}")
        answered = _polling.wait_for(
            "the request answered", lambda: (training(crd, namespace).get("lastCheckpoint") or {}).get("request")
            == request and training(crd, namespace)["lastCheckpoint"], WAIT_SECONDS, interval=0.5, explain=log)
        assert 0 < answered["iteration"] < INTERVAL and answered["seconds"] > 0, answered
        (written,) = run.run_dir.checkpoints()
        assert f"{answered['iteration']}" in written.name, (written, answered)
        assert f"a checkpoint is asked for: {request}" in trainer.log_path.read_text()
    finally:
        trainer.stop(30)
    # the stop on SIGTERM writes its final checkpoint too, answering no request, and reports it
    final = training(crd, namespace)["lastCheckpoint"]
    assert final.get("request") is None and final["iteration"] >= answered["iteration"], final
