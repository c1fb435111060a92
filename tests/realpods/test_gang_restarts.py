"""Issue 10 on the real node: a trainer gang that loses a pod mid-training restarts whole under the next attempt,
resumes from its newest checkpoint on the claim and trains to its target; evaluators keep their pods and weights
throughout, and the weight version never goes back: not in status, not in rank 0's /metrics (issue 26).

The observer also measures how far `status.training.weightVersion` trails rank 0's exported
`rlightning_weight_version` (docs/operator.md "How far status trails the pods": at most 5 s plus one iteration)
and prints it.

Two trainer pods with one rank each (DDP across pods). Rank 1 is lost twice in one run: once attempt 0 wrote a
checkpoint its trainer process is killed with SIGKILL (torchrun exits 1: a failure, counted against maxRestarts),
then, as soon as attempt 1 trains, its pod is deleted (a disruption; early, so attempt 1 cannot have finished).
The operator deletes the Job of the lost attempt (Foreground: both pods go) and creates the next attempt's Job only
then, so no pod of one attempt ever meets the next one's rendezvous.
"""

from __future__ import annotations

import http.client
import json
import re
import statistics
import subprocess
import time
import urllib.request
from pathlib import Path

from realpods_helpers import CLAIM, TRAIN_SECONDS, real_cartpole, signal_trainer, wait_for
from rlightning import contract
from tests import _json_stream
from tests.operator.operator_cluster import apply, get_json

NAME = "restarted"


STATUS_LAG_BOUND_SECONDS = 15.0
"""The documented 5 s report interval plus an iteration, a patch and this observer's 1 s polling, with room for
the real node's group running beside other test workers."""

METRIC_VERSION = re.compile(r"^rlightning_weight_version(?:\{[^}]*\})? (\S+)$", re.MULTILINE)


class Observer:
    """Polls the PolicyGroup and its pods, to wait for a moment of the run and to time status against rank 0's
    /metrics: keeps every weight version seen (status and /metrics, with the time each was first seen). What must
    hold at every moment is checked on `WatchEvents`, which a poll could miss."""

    def __init__(self, cluster, namespace: str) -> None:
        self.cluster, self.namespace = cluster, namespace
        self.versions: list[int] = []
        self.exported: list[int] = []
        # (attempt, version) -> when first seen, in status.training and in rank 0's /metrics
        self.first_seen: dict[str, dict[tuple[int, int], float]] = {"status": {}, "metrics": {}}

    def group(self) -> dict:
        group = get_json(self.cluster, "pg", NAME, "-n", self.namespace)
        training = (group.get("status") or {}).get("training") or {}
        if training.get("weightVersion") is not None:
            self.versions.append(int(training["weightVersion"]))
            key = (int(training.get("attempt", 0)), self.versions[-1])
            self.first_seen["status"].setdefault(key, time.monotonic())
        self._read_exported(self.pods("train"))
        return group

    def _read_exported(self, trainer_pods: list[dict]) -> None:
        """Read rank 0's `rlightning_weight_version` from its pod's /metrics (nothing while it is unreachable)."""
        ranks0 = [(int(p["metadata"]["labels"][contract.LABEL_ATTEMPT]), p["status"].get("podIP")) for p in trainer_pods
                  if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "0"]
        for attempt, ip in ranks0:
            if not ip:
                continue
            try:
                with urllib.request.urlopen(f"http://{ip}:{contract.METRICS_PORT}/metrics", timeout=2.0) as reply:
                    match = METRIC_VERSION.search(reply.read().decode())
            except (OSError, http.client.HTTPException):  # a pod killed while it answers cuts the reply short
                continue
            if match:
                self.exported.append(int(float(match.group(1))))
                self.first_seen["metrics"].setdefault((attempt, self.exported[-1]), time.monotonic())

    def status_lags(self) -> list[float]:
        """Seconds from rank 0 exporting each version to status first showing it (or a newer one of that attempt).

        A lost attempt's last versions are not lags: its last report may trail it by 5 s and never come
        (docs/operator.md), and the next attempt reports versions of its own.
        """
        lags = []
        for (attempt, version), exported_at in self.first_seen["metrics"].items():
            shown = [at for (by, seen), at in self.first_seen["status"].items() if by == attempt and seen >= version]
            if shown:
                lags.append(max(0.0, min(shown) - exported_at))
        return lags

    def pods(self, role: str) -> list[dict]:
        selector = f"{contract.LABEL_GROUP}={NAME},{contract.LABEL_ROLE}={role}"
        return get_json(self.cluster, "pods", "-n", self.namespace, "-l", selector)["items"]

    def phase(self, phase: str) -> dict | None:
        group = self.group()
        status = group.get("status") or {}
        assert status.get("phase") not in {"Failed", "Invalid"}, f"PolicyGroup went {status.get('phase')}: {status}"
        return group if status.get("phase") == phase else None


class WatchEvents:
    """Every event of `kubectl get ARGS -w -o json --output-watch-events` from now to `close`, in the API server's
    order: what held for a moment only is there too. Written to `path`, parsed on demand."""

    def __init__(self, cluster, path: Path, *args: str) -> None:
        self.path = path
        with path.open("w") as out:
            self.proc = subprocess.Popen(
                [str(cluster.bin("kubectl")), f"--kubeconfig={cluster.kubeconfig}", "get", *args, "-w", "-o", "json",
                 "--output-watch-events"], stdout=out, stderr=subprocess.DEVNULL,
            )  # fmt: skip

    def events(self) -> list[dict]:
        """The events written so far: `{"type": "ADDED" | "MODIFIED" | "DELETED", "object": {...}}`."""
        return _json_stream.decode_all(self.path.read_text())

    def close(self) -> bool:
        """Stop watching; whether the watch still ran (else events after it ended are missing)."""
        ran = self.proc.poll() is None
        self.proc.terminate()
        self.proc.wait(timeout=10)
        return ran


def attempts_at_once(pod_events: list[dict]) -> list[dict[str, list[str]]]:
    """Replaying the trainer pods' events: every moment when pods of more than one attempt existed (attempt -> pod
    names). A pod exists from its first event to its DELETED one."""
    live: dict[str, str] = {}
    mixed = []
    for event in pod_events:
        pod = event["object"]["metadata"]
        if event["type"] == "DELETED":
            live.pop(pod["name"], None)
        else:
            live[pod["name"]] = pod["labels"].get(contract.LABEL_ATTEMPT, "?")
        if len(set(live.values())) > 1:
            mixed.append({attempt: sorted(n for n, a in live.items() if a == attempt) for attempt in live.values()})
    return mixed


def lose(cluster, namespace: str, pod: str, how: str) -> None:
    if how == "delete":
        cluster.kubectl("delete", "pod", pod, "-n", namespace, "--wait=false")
    else:
        signal_trainer(cluster, namespace, pod, "SIGKILL", workers_only=True)  # torchrun's worker, not torchrun


def test_a_gang_that_loses_a_trainer_twice_restarts_each_time_resumes_and_reaches_its_target(
    cluster, real_namespace, real_operator, checkpoint_claim, tmp_path
):
    run_dir = checkpoint_claim
    group = real_cartpole(NAME, **{
        "spec.train.nodes": 2, "spec.train.procsPerNode": 1, "spec.train.batchesPerUpdate": 1,
        "spec.train.checkpoint": {"persistentVolumeClaim": CLAIM, "intervalIterations": 2},
    })
    trainer_events = WatchEvents(cluster, tmp_path / "trainer-pods.json", "pods", "-n", real_namespace, "-l",
                                 f"{contract.LABEL_GROUP}={NAME},{contract.LABEL_ROLE}=train")
    try:
        apply(cluster, real_namespace, group)
        group_events = WatchEvents(cluster, tmp_path / "policygroup.json", "pg", NAME, "-n", real_namespace)
        try:
            _run_through_two_losses(cluster, real_namespace, run_dir)
        finally:
            group_ran = group_events.close()
    finally:
        trainers_ran = trainer_events.close()
    # Every state the API server held, from watches that ran throughout: no moment missed between polls.
    assert group_ran and trainers_ran, "a watch ended early: its events after that are missing"
    pods_seen = trainer_events.events()
    attempts = {e["object"]["metadata"]["labels"].get(contract.LABEL_ATTEMPT) for e in pods_seen}
    assert attempts == {"0", "1", "2"}, f"the trainer pods' watch saw attempts {attempts}"
    assert not attempts_at_once(pods_seen), f"trainer pods of two attempts at once: {attempts_at_once(pods_seen)}"
    trainings = [(e["object"].get("status") or {}).get("training") or {} for e in group_events.events()]
    for name in ("weightVersion", "iteration", "envSteps"):
        seen = [t[name] for t in trainings if t.get(name) is not None]
        assert seen and seen == sorted(seen), f"status.training.{name} went back: {seen}"


def _run_through_two_losses(cluster, real_namespace: str, run_dir) -> None:
    """Lose rank 1 twice (attempts 0 and 1), check each restart, then the run's end, polling."""
    watch = Observer(cluster, real_namespace)
    evaluators: dict[str, str] = {}
    # One run, both ways of losing rank 1 (a failure, then a disruption): each restart is a whole training run less.
    for attempt, (how, reason, counts) in enumerate([("kill -9", "Failed", (1, 0, 1)),
                                                    ("delete", "PodDeleted", (2, 1, 1))]):
        victim = _lose_rank_1_once_checkpointed(cluster, real_namespace, watch, run_dir, attempt, how)
        evaluators = evaluators or {p["metadata"]["name"]: p["metadata"]["uid"] for p in watch.pods("eval")}

        def next_gang_running(expected: int = attempt + 1):
            group = watch.phase("Running") or watch.phase("Succeeded")
            return group if group and group["status"]["train"]["attempt"] == expected else None

        restarted = wait_for(f"attempt {attempt + 1} running", next_gang_running, timeout=180.0, interval=1.0)
        restarts = restarted["status"]["restarts"]
        assert (restarts["total"], restarts["disruptions"], restarts["failures"]) == counts, restarts
        assert restarts["pod"] == victim and restarts["reason"] == reason, restarts
        # Evaluators rode through: same pods, never restarted (they kept their weights and waited for the new gang).
        still = {p["metadata"]["name"]: p for p in watch.pods("eval")}
        assert {name: p["metadata"]["uid"] for name, p in still.items()} == evaluators
        assert all(c.get("restartCount", 0) == 0 for p in still.values()
                   for c in p["status"].get("containerStatuses", []))

    done = wait_for("the PolicyGroup to succeed", lambda: watch.phase("Succeeded"), timeout=TRAIN_SECONDS,
                    interval=2.0)
    training = done["status"]["training"]
    assert training["consistent"] is True and training["evalReturn"] >= 475, training
    assert watch.exported and watch.exported == sorted(watch.exported), f"exported version went back: {watch.exported}"
    lags = watch.status_lags()
    print(f"status.training behind rank 0's /metrics: median {statistics.median(lags):.1f} s, max {max(lags):.1f} s "
          f"over {len(lags)} versions")
    assert max(lags) <= STATUS_LAG_BOUND_SECONDS, lags
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["resumed_from"], "attempt 2 resumed from the newest checkpoint on the claim"
    assert all(p["metadata"]["labels"][contract.LABEL_ATTEMPT] == "2" for p in watch.pods("train"))
    # Training has ended: the evaluators are scaled to zero (spec.eval.afterTraining: Stop, the default).
    wait_for("evaluators scaled to zero", lambda: not watch.pods("eval") and
             watch.group()["status"]["eval"]["afterTraining"] == "Stopped", timeout=120.0)


def _lose_rank_1_once_checkpointed(cluster, namespace: str, watch: Observer, run_dir, attempt: int, how: str) -> str:
    """Lose rank 1 of `attempt` `how`; its pod's name. Attempt 0 once it wrote a checkpoint and published two
    versions; a later attempt once it published one of its own, early, so its training cannot have ended."""
    published = watch.versions[-1] if watch.versions else 0

    def ready() -> bool:
        group = watch.group()
        if attempt == 0:
            return bool(_checkpointed(run_dir, 0) and watch.versions and watch.versions[-1] >= published + 2)
        return (group["status"].get("train") or {}).get("attempt") == attempt and watch.versions[-1] > published

    wait_for(f"attempt {attempt} to train", ready, timeout=240.0, interval=1.0)
    (victim,) = [p["metadata"]["name"] for p in watch.pods("train")
                 if p["metadata"]["annotations"].get("batch.kubernetes.io/job-completion-index") == "1"
                 and p["metadata"]["labels"].get(contract.LABEL_ATTEMPT) == str(attempt)]
    lose(cluster, namespace, victim, how)
    return victim


def _checkpointed(run_dir, attempt: int) -> bool:
    """Whether the claim holds a checkpoint of `attempt`: `iter-N-epoch-E.pt` with E = created * 10**6 + attempt."""
    epochs = [int(path.stem.rpartition("-epoch-")[2]) for path in (run_dir / "checkpoints").glob("iter-*-epoch-*.pt")]
    return any(epoch % contract.EPOCH_ATTEMPTS == attempt for epoch in epochs)
