"""What trainer rank 0 writes about the run: metrics.jsonl rows, Prometheus metrics, status.training, summary.json,
TensorBoard event files.

One row per training iteration goes to metrics.jsonl, to the Prometheus gauges and to TensorBoard (`_tensorboard`,
when installed), and (in a cluster,
rate-limited) to the PolicyGroup's status.training; publishes add to the sync totals and counters; the end
writes summary.json and a last, forced status patch.

What is exported never goes back at a gang restart: `Recorder.begin` exports the resumed weight version at once (not
0 until the first publish) and carries the run's iterations and env steps over from what the previous attempt
reported in status.training (`Carried`), so the gauges and status.training count the whole run; metrics.jsonl and
summary.json keep the policy's own counters (those of its checkpoints).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from typing import Any

from rlightning import weights
from rlightning.config import CheckpointReport, TrainingStatus
from rlightning.policy import _vtrace
from rlightning.runtime._prometheus import TrainerMetrics
from rlightning.runtime._status_reporter import StatusReporter
from rlightning.runtime._tensorboard import TensorBoardWriter
from rlightning.runtime import report
from rlightning.runtime.report import RunSummary, SyncTotals
from rlightning.runtime.rundir import RunDir, append_jsonl, write_json_atomic
from rlightning.runtime.settings import ProcessSettings

log = logging.getLogger("rlightning.train")

WAITING_LOG_SECONDS = 30.0
"""How often rank 0 logs that the trainers still wait for the fleet's data."""


@dataclass(frozen=True)
class DataFigures:
    """Where one iteration's data came from and how fast, over all ranks.

    Attributes:
        env_steps_per_second (float): Env steps trained on in the iteration / its wall time (s).
        trainer_idle_fraction (float): Fraction of the iteration the ranks spent waiting for data (0..1).
        policy_lag_mean (float | None): Mean lag of the fleet batches trained on, in weight versions; None
            when the trainers collected their own data.
        policy_lag_max (int | None): Their largest lag.
        dropped_batches (int): Fleet batches dropped since start (too old, invalid, or of an older trainer attempt).
        update_seconds (float): Seconds rank 0 spent in `update_dataset` and `train` (the learner's own cost).
        policy_lag_counts (tuple[int, ...] | None): The fleet batches trained on by their lag: index `k` counts those
            `k` versions old, 0..`train.maxPolicyLag` (the last also takes the rare batch a republish while the ranks
            waited made older); None when the trainers collected their own data.
    """

    env_steps_per_second: float
    trainer_idle_fraction: float
    policy_lag_mean: float | None
    policy_lag_max: int | None
    dropped_batches: int
    update_seconds: float
    policy_lag_counts: tuple[int, ...] | None = None


@dataclass(frozen=True)
class IterationRow:
    """One training iteration as trainer rank 0 records it: a metrics.jsonl row without the recorder's own columns
    (time, sync totals).

    Attributes:
        iteration (int): Training iterations done.
        env_steps (int): Environment steps, summed over ranks.
        train_return (float | None): Mean return of the iteration's training episodes; None when none finished.
        eval_return (float | None): The evaluators' return (confirmed on the newest weights, or their recent mean).
        eval_version (int | None): The weight version `eval_return` was measured on (the oldest, for a mean).
        weight_version (int): The newest version published.
        consistent (bool | None): Whether the evaluators' reports match what was sent.
        evaluators (tuple[int, ...]): Ordinals holding the newest publish.
        train_stats (Mapping[str, float]): The policy's `train()` statistics, written as `train/<key>`.
        data (DataFigures): Throughput, idle time, policy lag and drops of the iteration's data.
    """

    iteration: int
    env_steps: int
    train_return: float | None
    eval_return: float | None
    eval_version: int | None
    weight_version: int
    consistent: bool | None
    evaluators: tuple[int, ...]
    train_stats: Mapping[str, float]
    data: DataFigures


@dataclass(frozen=True)
class Carried:
    """The run's progress before this attempt that this attempt's counters do not hold, added to what is exported.

    Attributes:
        iterations (int): Iterations of earlier attempts beyond this one's start (all of them without a checkpoint;
            those after the checkpoint it resumed from with one).
        env_steps (int): Their env steps, summed over ranks.
    """

    iterations: int = 0
    env_steps: int = 0

    @classmethod
    def from_report(cls, previous: Mapping[str, Any], attempt: int, iteration: int, env_steps: int) -> Carried:
        """What to carry over from status.training as read at the start of attempt `attempt`.

        Args:
            previous (Mapping[str, Any]): status.training (camelCase keys), {} when none; only a report of an earlier
                attempt counts.
            attempt (int): This attempt.
            iteration (int): The policy's iteration at the start (the checkpoint's, or 0).
            env_steps (int): Its env steps at the start.

        Returns:
            Carried: The difference, never negative.

        Examples:
            >>> Carried.from_report({"attempt": 0, "iteration": 47, "envSteps": 58880}, 1, 0, 0)
            Carried(iterations=47, env_steps=58880)
        """
        if not previous or int(previous.get("attempt") or 0) >= attempt:
            return cls()
        return cls(max(0, int(previous.get("iteration") or 0) - iteration),
                   max(0, int(previous.get("envSteps") or 0) - env_steps))


class Recorder:
    """Writes the run's records (trainer rank 0 only).

    Args:
        settings (ProcessSettings): The process's environment (metrics port, status reporting, group name).
        run_dir (RunDir): The run directory.

    Attributes:
        sync (SyncTotals): Weight-sync statistics summed over the run.
    """

    def __init__(self, settings: ProcessSettings, run_dir: RunDir) -> None:
        self.name = settings.group_name
        self.run_dir = run_dir
        self.sync = SyncTotals()
        # Served from `begin` on: a scrape before it would read a resumed attempt's weight version as 0.
        self.metrics = TrainerMetrics(0, settings.bind_host)
        self.metrics.attempt.set(settings.attempt)
        self._metrics_port = settings.metrics_port
        self.status = (
            StatusReporter(settings.group_name, settings.namespace)
            if settings.report_status and settings.namespace
            else None
        )
        self.attempt = settings.attempt
        self.carried = Carried()
        self.started = time.monotonic()
        self._start_env_steps = 0
        self._lags: list[float] = []
        self._lag_max: int | None = None
        self._lag_counts: list[int] | None = None
        self._importance: list[tuple[float, float]] = []  # (mean, clipped share) of each update that reported them
        self._dropped = 0
        self._last_waiting_log = 0.0
        self._last_row: dict[str, Any] | None = None
        self._tensorboard: TensorBoardWriter | None = None
        self._honoured: str | None = None  # the checkpoint request last answered (or found at the start)
        self._last_checkpoint: CheckpointReport | None = None

    def begin(self, iteration: int, env_steps: int, weight_version: int) -> int:
        """The attempt starts, resumed: carry the run's progress over from the previous attempt's report, export the
        start (status.training forced: the operator sees this attempt's rank 0 up), then serve /metrics.

        The exported weight version never goes back: a gang restarted from an older checkpoint (or without its run
        directory) exports the previous attempt's reported version when that is higher.

        Args:
            iteration (int): The policy's iteration after the resume.
            env_steps (int): Its env steps.
            weight_version (int): The highest weight version this trainer knows was issued (its checkpoint's, the
                fleet's, the run directory's record).

        Returns:
            int: The version exported: `weight_version` or the previous attempt's reported one, whichever is higher;
                the next publish must go above it.
        """
        previous = self.status.previous() if self.status is not None else {}
        # a request made before this attempt started is no request of it: it resumed from the newest checkpoint
        self._honoured = self.status.checkpoint_request if self.status is not None else None
        self.carried = Carried.from_report(previous, self.attempt, iteration, env_steps)
        if previous and int(previous.get("attempt") or 0) < self.attempt:
            weight_version = max(weight_version, int(previous.get("weightVersion") or 0))
        self._start_env_steps = env_steps
        if self.carried != Carried():
            log.info("attempt %d continues the run's counts: %d iterations and %d env steps of earlier attempts",
                     self.attempt, self.carried.iterations, self.carried.env_steps)
        self._last_row = {"time": _now(), "iteration": iteration, "env_steps": env_steps,
                          "weight_version": weight_version}
        self._export(self._last_row, force=True)
        self.metrics.serve(self._metrics_port)
        self._tensorboard = TensorBoardWriter.open(self.run_dir.tensorboard_dir, env_steps)
        return weight_version

    def publish(self, stats: weights.SyncStats) -> None:
        """Count one publish: a failure when a group failed; bytes and seconds when any evaluator applied it."""
        if stats.failed:
            self.sync.failures += 1
            self.metrics.sync_failures.inc()
        if stats.receivers_acked:
            self.sync.add(stats.bytes, stats.seconds)
            self.metrics.sync_bytes.inc(stats.bytes)
            self.metrics.sync_seconds.inc(stats.seconds)

    def iteration(self, row: IterationRow) -> None:
        """Append one metrics.jsonl row and export it (Prometheus; status.training at most every few seconds).

        Args:
            row (IterationRow): The iteration's figures; the recorder adds the time and the sync totals.
        """
        data = row.data
        written = {
            "time": _now(),
            "elapsed_seconds": round(time.monotonic() - self.started, 3),
            "iteration": row.iteration,
            "env_steps": row.env_steps,
            "train_return": row.train_return,
            "eval_return": row.eval_return,
            "eval_version": row.eval_version,
            "weight_version": row.weight_version,
            "consistent": row.consistent,
            "evaluators": sorted(row.evaluators),
            "sync_bytes": self.sync.last_bytes,
            "sync_seconds": self.sync.last_seconds,
            "sync_failures": self.sync.failures,
            **asdict(data),
            **{f"train/{k}": v for k, v in row.train_stats.items()},
        }
        if data.policy_lag_mean is not None:
            self._lags.append(data.policy_lag_mean)
            self._lag_max = max(self._lag_max or 0, data.policy_lag_max or 0)
        if data.policy_lag_counts is not None:
            self._lag_counts = [a + b for a, b in zip(self._lag_counts or [0] * len(data.policy_lag_counts),
                                                      data.policy_lag_counts, strict=True)]  # fmt: skip
        stats = row.train_stats
        if _vtrace.IMPORTANCE_WEIGHT_MEAN in stats and _vtrace.IMPORTANCE_WEIGHT_CLIPPED_SHARE in stats:
            self._importance.append(
                (stats[_vtrace.IMPORTANCE_WEIGHT_MEAN], stats[_vtrace.IMPORTANCE_WEIGHT_CLIPPED_SHARE])
            )
        self._dropped = data.dropped_batches
        self._last_row = written
        append_jsonl(self.run_dir.metrics_path, written)
        if self._tensorboard is not None:
            self._tensorboard.write(written)
        self._export(written, force=False)

    def summary(self, **fields: Any) -> RunSummary:
        """Write summary.json and export its final state (status.training patched now, whatever the interval): the
        last row exported, with the summary's weight version and consistency.

        Args:
            **fields: The `RunSummary` fields other than `name`, `wall_seconds` and `sync`.

        Returns:
            RunSummary: What was written.
        """
        summary = RunSummary(
            name=self.name,
            wall_seconds=round(time.monotonic() - self.started, 3),
            sync=self.sync,
            dropped_batches=self._dropped,
            policy_lag_mean=sum(self._lags) / len(self._lags) if self._lags else None,
            policy_lag_max=self._lag_max,
            policy_lag_counts=self._lag_counts,
            importance_weights=_importance_summary(self._importance),
            **fields,
        )
        write_json_atomic(self.run_dir.summary_path, summary.to_dict())
        if self._tensorboard is not None:
            self._tensorboard.close()
            self._tensorboard = None
        final = {**(self._last_row or {}), "weight_version": summary.weight_version, "consistent": summary.consistent,
                 "consistent_reason": summary.consistent_reason}
        self._export(final, force=True)
        log.info("summary: %s", summary.to_dict())
        return summary

    def waiting_for_data(self, seconds: float) -> None:
        """The ranks have waited `seconds` for the fleet's batches of this iteration: logged every
        `WAITING_LOG_SECONDS` and shown in status.training (`waitingForDataSeconds`) while it lasts.
        """
        if seconds - self._last_waiting_log >= WAITING_LOG_SECONDS or seconds < self._last_waiting_log:
            if seconds >= WAITING_LOG_SECONDS:
                log.warning("trainers have waited %.0f s for the evaluators' batches; training is paused", seconds)
            self._last_waiting_log = seconds
        if self._last_row is not None and seconds >= 1.0:
            self._export({**self._last_row, "waiting_for_data_seconds": round(seconds, 1)}, force=False)

    def checkpoint_asked(self) -> str | None:
        """A checkpoint request (`contract.ANNOTATION_CHECKPOINT_REQUEST`) seen in the answers to the status reports and
        not answered yet; once returned it counts as answered.

        Returns:
            str | None: The request's value; None when there is none new (or no status is reported).
        """
        request = self.status.checkpoint_request if self.status is not None else None
        if request is None or request == self._honoured:
            return None
        self._honoured = request
        return request

    def checkpoint(self, iteration: int, seconds: float, request: str | None) -> None:
        """Export a checkpoint just written: the gauge `rlightning_checkpoint_seconds` and
        status.training.lastCheckpoint (reported now, whatever the interval: the operator compares it with the pods'
        grace period).

        Args:
            iteration (int): The iteration it holds.
            seconds (float): How long writing it took.
            request (str | None): The checkpoint request it answered; None for a periodic or final one.
        """
        self.metrics.checkpoint_seconds.set(seconds)
        self._last_checkpoint = CheckpointReport(iteration=iteration, seconds=round(seconds, 3), request=request,
                                                 written_at=_now())
        if self._last_row is not None:
            self._export(self._last_row, force=True)

    def _export(self, row: dict[str, Any], force: bool) -> None:
        m = self.metrics
        iteration, env_steps = row["iteration"] + self.carried.iterations, row["env_steps"] + self.carried.env_steps
        m.iteration.set(iteration)
        m.env_steps.set(env_steps)
        m.weight_version.set(row["weight_version"])
        for gauge, key in ((m.train_return, "train_return"), (m.eval_return, "eval_return")):
            if row.get(key) is not None:
                gauge.set(row[key])
        compared = row.get("consistent") is not None
        m.compared.set(1 if compared else 0)
        if compared:
            m.consistent.set(1 if row["consistent"] else 0)
        for gauge, key in (
            (m.env_steps_per_second, "env_steps_per_second"),
            (m.policy_lag_mean, "policy_lag_mean"),
            (m.policy_lag_max, "policy_lag_max"),
            (m.dropped_batches, "dropped_batches"),
            (m.idle_fraction, "trainer_idle_fraction"),
        ):
            if row.get(key) is not None:
                gauge.set(row[key])
        m.waiting_for_data.set(row.get("waiting_for_data_seconds") or 0)
        if self.status is not None:
            self.status.report(
                TrainingStatus(
                    attempt=self.attempt,
                    iteration=iteration,
                    env_steps=env_steps,
                    attempt_env_steps=row["env_steps"] - self._start_env_steps,
                    weight_version=row["weight_version"],
                    train_return=row.get("train_return"),
                    eval_return=row.get("eval_return"),
                    consistent=row.get("consistent"),
                    consistent_reason=row.get("consistent_reason", None if compared else report.NOT_COMPARED),
                    last_sync_seconds=self.sync.last_seconds,
                    last_sync_bytes=self.sync.last_bytes,
                    env_steps_per_second=_rounded(row.get("env_steps_per_second")),
                    policy_lag_mean=_rounded(row.get("policy_lag_mean")),
                    policy_lag_max=row.get("policy_lag_max"),
                    dropped_batches=row.get("dropped_batches", 0),
                    waiting_for_data_seconds=row.get("waiting_for_data_seconds"),
                    last_checkpoint=self._last_checkpoint,
                    updated_at=_now(),  # the report's own time: a report while waiting for data is fresh
                ),
                force=force,
            )


def _importance_summary(updates: list[tuple[float, float]]) -> dict[str, float] | None:
    """The run's importance weights: means over the updates of each update's mean and clipped share; None without."""
    if not updates:
        return None
    return {
        "mean": round(sum(mean for mean, _ in updates) / len(updates), 4),
        "clipped_share": round(sum(share for _, share in updates) / len(updates), 4),
        "updates": len(updates),
    }


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 2)
