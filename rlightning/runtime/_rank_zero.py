"""The trainer loop's hooks: what trainer rank 0 does beside training, plugged into the generic loop of `train`.

As TorchRL's Trainer takes hooks, `train.train` calls one `TrainerHooks` object at fixed points (start, while
waiting for data, after each iteration, at the end). Every rank but 0 holds the base class, whose hooks do nothing;
rank 0 holds `RankZero`, which owns the `rlightning.weights.WeightSender` (inside `_fleet.Fleet`) and the records
(`_records.Recorder`): it publishes, checks the evaluators, decides the stop (`_stop`), records, checkpoints and
writes summary.json (the behaviour is described in `train`'s module docstring).
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import torch.distributed as dist

from rlightning import trajectories, weights
from rlightning.config import PolicyGroupSpec
from rlightning.policy import BasePolicy, PolicyGroup, _training_state
from rlightning.runtime import _datasets, _fleet, _records, _resume, _startup, _stop
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings

log = logging.getLogger("rlightning.train")



@dataclasses.dataclass(frozen=True)
class IterationResult:
    """What every rank knows after one training iteration (the figures all-reduced over the ranks).

    Attributes:
        train_return (float | None): Mean return of the iteration's training episodes (recorded); None when none
            finished.
        recent_return (float | None): Mean return of the latest `eval.episodesPerReport` or more training episodes
            (`_stop.RecentReturns`, for the stop decision).
        train_stats (Mapping[str, float]): The policy's `train()` statistics.
        data (_records.DataFigures): Throughput, idle time, policy lag and drops of the iteration's data.
        interrupted (bool): A signal asked this rank to stop.
    """

    train_return: float | None
    recent_return: float | None
    train_stats: Mapping[str, float]
    data: _records.DataFigures
    interrupted: bool


@dataclasses.dataclass(frozen=True)
class Ending:
    """How the run ended, for summary.json.

    Attributes:
        reason (_stop.StopReason): Why the ranks stopped.
        resumed_from (str | None): The checkpoint the run resumed from.
        fleet_totals (_datasets.FleetTotals | None): What the intakes took and dropped; None when the trainers collected
            their own data.
    """

    reason: _stop.StopReason
    resumed_from: str | None
    fleet_totals: _datasets.FleetTotals | None


def final_evaluation_seconds(spec: PolicyGroupSpec) -> float:
    """How long rank 0 waits at the end for every live evaluator to report `eval.episodesPerReport` episodes on the
    final weights: `weightSync.timeoutSeconds` (applying them and playing the episodes) plus
    `eval.evaluationIntervalSeconds` (the longest an evaluator producing data goes between evaluations).

    Args:
        spec (PolicyGroupSpec): The validated spec.

    Returns:
        float: Seconds (70 with the defaults).
    """
    return spec.weight_sync.timeout_seconds + spec.eval.evaluation_interval_seconds


def save_checkpoint(policy: BasePolicy, run_dir: RunDir, spec: PolicyGroupSpec, epoch: int) -> None:
    """Write the checkpoint of the current iteration, recording `epoch` (the trainer's attempt) in it and in its name,
    commit it unless a newer attempt marked the run directory, and delete all but the newest `checkpoint.keep`.

    Raises:
        FencedError: When a newer attempt marked the run directory (`RunDir.commit_checkpoint`): this trainer is a
            zombie of an older attempt; it stops rather than go on training for nothing.
    """
    final = run_dir.checkpoint_path(policy.iteration, epoch)
    staged = _training_state.write_checkpoint(
        {**policy.checkpoint_state(), "epoch": epoch}, final.with_name(f".{final.name}.staged")
    )
    path = run_dir.commit_checkpoint(staged, policy.iteration, epoch)
    run_dir.prune_checkpoints(spec.train.checkpoint.keep)
    log.info("checkpoint %s (weight version %d)", path, policy.weight_version)


def dropped_summary(totals: _datasets.FleetTotals, reports: dict[int, weights.ReceiverReport]) -> dict[str, Any]:
    """Why fleet batches were not trained on, and their share of the batches the evaluators completed.

    Args:
        totals (_datasets.FleetTotals): The intakes' totals.
        reports (dict[int, weights.ReceiverReport]): The evaluators' last reports (their `cut_batches`).

    Returns:
        dict[str, Any]: `reasons` (batches per reason: `stale`, older than `train.maxPolicyLag` on arrival or while
            held; `invalid`, not of the policy's layout; `cut_by_new_version`, collected on-policy while a new version
            was applied, so never sent; `older_attempt`, acted with the weights of an older trainer attempt than this
            one) and `share` (dropped / (trained on + dropped), 0.0 when none was produced).
    """
    cut = sum(int(report.metrics.get("cut_batches", 0)) for report in reports.values())
    reasons = {"stale": totals.stale, "invalid": totals.invalid, "cut_by_new_version": cut,
               "older_attempt": totals.older_attempt}
    dropped = sum(reasons.values())
    produced = totals.accepted + dropped
    return {"reasons": reasons, "share": round(dropped / produced, 4) if produced else 0.0}


class TrainerHooks:
    """The loop's hooks on every rank but 0: nothing beside training (they hold no sender, fleet or records)."""

    def await_fleet(self) -> None:
        """At start, before any weights are pulled: wait for the evaluators to (re-)register."""

    def puller(self) -> Callable[[], trajectories.HeldWeights | None] | None:
        """What gets an evaluator's weights when no checkpoint was resumed (`_resume.restart_from_fleet`); None."""
        return None

    def begin(self, restarted: bool) -> None:
        """The policy holds its starting weights (`restarted`: taken from the fleet, or fresh without a checkpoint)."""

    def got_batch(self) -> None:
        """This iteration's dataset arrived."""

    def waiting(self, waited: float) -> None:
        """The ranks have waited `waited` seconds for the fleet's data of this iteration."""

    def after_iteration(self, result: IterationResult) -> _stop.StopReason | None:
        """This rank's stop reason after an iteration: `INTERRUPTED` when a signal asked it to stop, else None."""
        return _stop.StopReason.INTERRUPTED if result.interrupted else None

    def finish(self, ending: Ending) -> None:
        """The ranks agreed to stop."""

    def close(self) -> None:
        """Release what the hooks hold."""


class RankZero(TrainerHooks):
    """Trainer rank 0's hooks: the weight sender, the fleet and the records.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        settings (ProcessSettings): The process environment.
        policy (BasePolicy): The train policy.
        run_dir (RunDir): The run directory (created).
        sender (weights.WeightSender): The sender, continuing from the policy's weight version.
        startup (_startup.StartupClock): The start-up phases (marked here, written into summary.json).
        source (_datasets.Source): This rank's data source (the fleet's batches: its intake asks the evaluators to
            confirm the target).
    """

    def __init__(
        self,
        spec: PolicyGroupSpec,
        settings: ProcessSettings,
        policy: BasePolicy,
        run_dir: RunDir,
        sender: weights.WeightSender,
        startup: _startup.StartupClock,
        source: _datasets.Source,
    ) -> None:
        self.spec, self.settings, self.policy, self.run_dir = spec, settings, policy, run_dir
        self.sender, self.startup, self.source = sender, startup, source
        self.fleet = _fleet.Fleet(PolicyGroup(policy, sender=sender), settings.expected_evaluators)
        self.recorder = _records.Recorder(settings, run_dir)
        self.last_row: _records.IterationRow | None = None
        self.last_shortfall: int | None = None

    @classmethod
    def open(
        cls,
        spec: PolicyGroupSpec,
        settings: ProcessSettings,
        policy: BasePolicy,
        run_dir: RunDir,
        startup: _startup.StartupClock,
        source: _datasets.Source,
    ) -> RankZero:
        """Host the weight-sync store; the sender continues from the policy's (the checkpoint's) version, its epoch
        the gang's attempt (evaluators that have seen a newer attempt's publish refuse this one's).

        Raises:
            torch.distributed.DistNetworkError: The store's port cannot be bound.
        """
        sender = weights.WeightSender(
            spec.weight_sync, settings.master_addr, settings.weight_sync_port, version=policy.weight_version,
            bind_host=settings.bind_host, epoch=settings.epoch,
        )  # fmt: skip
        return cls(spec, settings, policy, run_dir, sender, startup, source)

    def await_fleet(self) -> None:
        self.fleet.await_rejoin()
        self.startup.mark("registration")

    def puller(self) -> Callable[[], trajectories.HeldWeights | None]:
        return lambda: pull_from_fleet(self.fleet, self.source, self.policy)

    def begin(self, restarted: bool) -> None:
        if restarted:  # it holds the fleet's version now, not its own 0: publish above it without a warning
            self.sender.continue_from(self.policy.weight_version)
        # Before the first publish: the run's counts and the highest version issued, not zeros. A version names one
        # set of weights, so the next publish goes above every version this run issued: those recorded in the run
        # directory and the previous attempt's report (a gang restarted from an older checkpoint, or without it).
        held = self.sender.version
        issued = self.recorder.begin(
            self.policy.iteration, self.policy.env_steps, max(held, self.run_dir.published_version())
        )
        if issued > held:
            log.info("weight versions up to %d were issued in this run, above the %d this trainer holds; publishing "
                     "above them", issued, held)
            self.sender.continue_from(issued)
        if self.source.publishes_every_update:  # the evaluators need weights before they produce the first data
            self._publish()
            self.startup.mark("first_publish")

    def got_batch(self) -> None:
        self.startup.mark("first_batch")

    def waiting(self, waited: float) -> None:
        self.recorder.waiting_for_data(waited)
        if self.fleet.starving(waited):
            self._publish()

    def after_iteration(self, result: IterationResult) -> _stop.StopReason | None:
        """Publish when due (after every update when the fleet produces the data), check the evaluators, decide the
        stop, record a row and checkpoint when due.

        Returns:
            _stop.StopReason | None: This rank's stop reason (None to go on).
        """
        iteration = self.policy.iteration
        if self.source.publishes_every_update or iteration % self.spec.weight_sync.interval_iterations == 0:
            self._publish()
        reports = self.fleet.live_reports()
        inputs = _stop.StopInputs(
            iteration=iteration,
            env_steps=self.policy.env_steps,
            total_env_steps=self.spec.train.total_env_steps,
            target_eval_return=self.spec.train.target_eval_return,
            fleet_return=_fleet.fleet_return(reports),
            last_shortfall=self.last_shortfall,
            interrupted=result.interrupted,
            train_return=result.recent_return,
        )
        exact = False  # fingerprints every iteration; digests where the newest weights are confirmed
        if _stop.confirmation_due(inputs):
            inputs = self._confirm_target(inputs, result.recent_return)
            reports, exact = self.fleet.live_reports(), True
        confirmed = inputs.confirmed_return is not None
        self.last_row = _records.IterationRow(
            iteration=iteration,
            env_steps=self.policy.env_steps,
            train_return=result.train_return,
            eval_return=inputs.confirmed_return if confirmed else inputs.fleet_return,
            eval_version=self.fleet.version if confirmed else _fleet.oldest_return_version(reports),
            weight_version=self.fleet.version,
            consistent=self.fleet.check(reports, exact=exact).consistent,
            evaluators=tuple(self.fleet.live),
            train_stats=result.train_stats,
            data=result.data,
        )
        self.recorder.iteration(self.last_row)
        self.startup.mark("first_iteration")
        reason = _stop.decide(inputs)
        asked = self.recorder.checkpoint_asked()  # the operator's, when a trainer's node is about to go
        if asked is not None:
            log.info("a checkpoint is asked for: %s", asked)
        if reason is None and (asked is not None or iteration % self.spec.train.checkpoint.interval_iterations == 0):
            self._checkpoint(asked)
        return reason

    def _checkpoint(self, request: str | None = None) -> None:
        """`save_checkpoint`, timed and exported (`_records.Recorder.checkpoint`)."""
        started = time.monotonic()
        save_checkpoint(self.policy, self.run_dir, self.spec, self.settings.epoch)
        self.recorder.checkpoint(self.policy.iteration, time.monotonic() - started, request)

    def _confirm_target(self, inputs: _stop.StopInputs, recent_return: float | None) -> _stop.StopInputs:
        """Hold training until every live evaluator reports a batch on the newest weights; `inputs` with that
        `confirmed_return` (None on timeout), and the shortfall noted when it misses the target.
        """
        if self.fleet.published_iteration != inputs.iteration:
            self._publish()
        log.info("eval return %s, recent training return %s: the target %.1f is reached; confirming on version %d",
                 inputs.fleet_return, recent_return, inputs.target_eval_return, self.fleet.version)
        confirmed, _ = self._evaluate_newest(self.spec.weight_sync.timeout_seconds)
        inputs = dataclasses.replace(inputs, confirmed_return=confirmed)
        if _stop.decide(inputs) is None:
            log.info("version %d returned %s < target; training on", self.fleet.version, confirmed)
            self.last_shortfall = inputs.iteration
        return inputs

    def finish(self, ending: Ending) -> None:
        """Give the evaluators the final weights, check them bit for bit, checkpoint, write summary.json."""
        final_return, final_version, why = self._final_evaluation(ending.reason)
        note = None if final_version == self.fleet.version else why
        if note is not None:
            log.warning("final eval return %s is of weight version %s, not the final %d: %s",
                        final_return, final_version, self.fleet.version, note)
        reports = self.fleet.live_reports()
        consistency = self.fleet.check(reports, exact=True)
        consistent, consistent_reason = _fleet.final_consistency(consistency, self.fleet.expected_count())
        self._checkpoint()
        target, totals = self.spec.train.target_eval_return, ending.fleet_totals
        self.recorder.summary(
            stop_reason=ending.reason.label,
            iterations=self.policy.iteration,
            env_steps=self.policy.env_steps,
            weight_version=self.fleet.version,
            final_eval_return=final_return,
            final_eval_version=final_version,
            final_train_return=None if self.last_row is None else self.last_row.train_return,
            target_eval_return=target,
            reached_target=target is not None and final_return is not None and final_return >= target,
            consistent=consistent,
            consistent_reason=consistent_reason,
            evaluators={
                str(o): {"applied_version": r.applied.version, **r.metrics} for o, r in sorted(reports.items())
            },
            resumed_from=ending.resumed_from,
            env_steps_by_evaluator=None if totals is None else {str(o): n for o, n in totals.by_evaluator.items()},
            env_steps_by_rank=None if totals is None else totals.by_rank,
            dropped=None if totals is None else dropped_summary(totals, reports),
            startup_seconds=self.startup.seconds(),
            final_eval_note=note,
        )

    def _final_evaluation(self, reason: _stop.StopReason) -> tuple[float | None, int | None, str | None]:
        """The final weights to every evaluator now registered and, unless a target stop confirmed them already,
        their evaluation, waited for at most `final_evaluation_seconds`.

        Returns:
            tuple[float | None, int | None, str | None]: The final eval return, the version it was measured on (the
                last row's when no evaluation of the final weights came) and, then, why not, in one line.
        """
        row = self.last_row
        final = (None, None) if row is None else (row.eval_return, row.eval_version)
        if reason is _stop.StopReason.INTERRUPTED:
            return *final, "interrupted: the final weights were not evaluated"
        members = self.fleet.settle(self.spec.weight_sync.timeout_seconds)
        republish = self.fleet.published_iteration != self.policy.iteration or not set(members) <= set(self.fleet.live)
        if republish:  # the final weights, to every evaluator now registered
            self._publish()
        if reason is _stop.StopReason.TARGET_EVAL_RETURN and not republish:
            return *final, None  # confirmed on the final weights before the stop
        bound = final_evaluation_seconds(self.spec)
        confirmed, share = self._evaluate_newest(bound)
        if confirmed is not None:
            return confirmed, self.fleet.version, None
        if not self.fleet.live:
            return *final, f"no evaluator holds the final weight version {self.fleet.version}"
        return *final, (
            f"evaluators {sorted(self.fleet.live)} did not report {share} episodes each on the "
            f"final weight version {self.fleet.version} within {bound:.0f} s (weightSync.timeoutSeconds + "
            "eval.evaluationIntervalSeconds)"
        )

    def _evaluate_newest(self, timeout: float) -> tuple[float | None, int]:
        """Ask every live evaluator for its share of `eval.episodesPerReport` episodes of the newest version and wait
        at most `timeout` seconds for them (`Fleet.evaluation_share`, `Fleet.wait_for_newest`).

        Returns:
            tuple[float | None, int]: The mean return of those episodes (None on timeout), and the share asked.
        """
        share = self.fleet.evaluation_share(self.spec.eval.episodes_per_report)
        self.source.ask_evaluation(self.fleet.version, share)
        return self.fleet.wait_for_newest(timeout, share), share

    def _publish(self) -> None:
        self.recorder.publish(self.fleet.publish(self.policy.iteration))
        self.run_dir.record_published(self.fleet.version)

    def close(self) -> None:
        self.fleet.close()


def pull_from_fleet(
    fleet: _fleet.Fleet, source: _datasets.Source, policy: BasePolicy
) -> trajectories.HeldWeights | None:
    """Rank 0 with no checkpoint: the newest weights an evaluator holds, when the fleet holds a newer version.

    Returns:
        trajectories.HeldWeights | None: One evaluator's weights; None when the fleet holds nothing newer (a first
            start), sends no trajectories (nothing to pull over), or none answered within
            `_resume.FLEET_PULL_SECONDS` (each logged as a warning: training starts from fresh weights).
    """
    version = fleet.sender.fleet_version
    if version <= policy.weight_version:
        return None
    return source.pull_weights(version, _resume.FLEET_PULL_SECONDS)


def open_hooks(
    spec: PolicyGroupSpec,
    settings: ProcessSettings,
    policy: BasePolicy,
    run_dir: RunDir,
    startup: _startup.StartupClock,
    source: _datasets.Source,
) -> TrainerHooks | None:
    """This rank's hooks: `RankZero` on rank 0 (None, logged, when it cannot host the weight-sync store), else the
    base hooks.
    """
    if settings.torchrun.rank != 0:
        return TrainerHooks()
    try:
        return RankZero.open(spec, settings, policy, run_dir, startup, source)
    except dist.DistNetworkError as error:
        log.error("cannot host the weight-sync store on port %d (spec.ports.weightSync): %s",
                  settings.weight_sync_port, error)
        return None
