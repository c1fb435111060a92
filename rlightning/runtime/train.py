"""Trainer entrypoint: `python -m rlightning.runtime.train`, one process per DDP rank under torchrun.

Every rank: joins the DDP default group (gloo on CPU, nccl on CUDA; used for gradients and the all-reduces
below, never for weight sync), builds the policy, resumes when `train.checkpoint.resume` (rank 0 loads the
newest checkpoint of its run directory and broadcasts its training state, `_resume`), then loops dataset ->
update_dataset -> train. The dataset comes from the evaluators when they produce the data (`ENV_FLEET_DATA`:
each rank's trajectory intake on `ports.trajectories` + local rank, batches no older than `train.maxPolicyLag`
versions) or from the rank's own env copies (`_datasets`, docs/fleet.md). After each iteration the ranks
all-reduce their episode returns and data figures and agree on whether to stop and on the weight version (one MAX
all-reduce: the most urgent `_stop.StopReason` of any rank, and rank 0's version, which every rank mirrors).

Rank 0 also hosts the `rlightning.weights.WeightSender` (store on ENV_TRAIN_MASTER_ADDR:ENV_WEIGHT_SYNC_PORT),
which owns the weight version: it starts from the checkpoint's and assigns every publish the next one, above
whatever the evaluators hold (so a trainer replaced without its run directory continues above the fleet; at start
rank 0 waits up to `_fleet.FLEET_REJOIN_SECONDS` for the evaluators to re-register, and publishes once when they
produce the data). With no checkpoint resumed while the evaluators hold a version, rank 0 first pulls the newest
weights from one of them over its trajectory intake and every rank starts from those (`pull_from_fleet`,
`_resume.restart_from_fleet`); where they send no trajectories, it starts from fresh weights and says so.
Each iteration rank 0 publishes (every `weightSync.intervalIterations` when the trainers
collect their own data, else after every update) and checks the evaluators (`_fleet`), decides the stop
(`_stop`, pure) and writes the records (`_records`: metrics.jsonl, Prometheus, status.training, summary.json);
it writes the checkpoints, which hold the version published.

Stopping on `train.targetEvalReturn` is confirmed on the newest weights: when the evaluators' recent returns
reach the target, rank 0 holds training (the other ranks wait in the stop all-reduce) until every live evaluator
reports a full batch of episodes played entirely with the newest version, and stops only if that mean reaches
the target. So the final eval return in summary.json is that of the final weights. At the end the evaluators
that must (`_fleet.Fleet.expected_count`) get the final weights, and summary.json says whether they hold them
bit for bit (`consistent`).

A dead evaluator makes a publish fail for its group within `weightSync.timeoutSeconds`; training goes on,
the failure is counted and logged, and the evaluator rejoins (new generation) when it comes back.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from rlightning import contract, trajectories, weights
from rlightning.config import ManifestError, PolicyGroupSpec
from rlightning.policy import BasePolicy, EnvMeta, PolicyGroup, PolicyRole, load_policy_class
from rlightning.runtime import _datasets, _errors, _fleet, _health, _records, _resume, _signals, _startup, _stop
from rlightning.runtime._collective import all_reduce
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings, SettingsError
from rlightning.runtime.validate import validate_file

log = logging.getLogger("rlightning.train")

DDP_TIMEOUT = timedelta(minutes=30)
"""Timeout of the DDP default group's collectives: covers rank 0's waits for evaluator reports."""


def save_checkpoint(policy: BasePolicy, run_dir: RunDir, spec: PolicyGroupSpec) -> None:
    """Write the checkpoint of the current iteration and delete all but the newest `checkpoint.keep`."""
    path = policy.save_checkpoint(run_dir.checkpoint_path(policy.iteration))
    run_dir.prune_checkpoints(spec.train.checkpoint.keep)
    log.info("checkpoint %s (weight version %d)", path, policy.weight_version)


def _device_backend(policy_device: torch.device) -> str:
    return "nccl" if policy_device.type == "cuda" else "gloo"


def train(settings: ProcessSettings, spec: PolicyGroupSpec, startup: _startup.StartupClock | None = None) -> int:
    """Run this rank's training loop until the ranks agree to stop.

    Args:
        settings (ProcessSettings): The process environment (ENV_* variables).
        spec (PolicyGroupSpec): The validated spec.
        startup (_startup.StartupClock | None, optional): The start-up phases marked so far (rank 0 writes them
            into summary.json). Defaults to None: a clock started now.

    Returns:
        int: The exit code (0; 1 when rank 0 cannot host the weight-sync store).
    """
    rank = int(os.environ.get("RANK", "0"))
    startup = startup or _startup.StartupClock(settings.launch_time)
    stop = _signals.StopRequest()
    run_dir = RunDir(settings.run_dir)
    policy_class = load_policy_class(spec.policy.policy_class)
    policy = policy_class(spec.policy, PolicyRole.TRAIN)
    if policy.device.type == "cuda":
        torch.cuda.set_device(policy.device)  # nccl collectives run on this rank's own GPU
    dist.init_process_group(_device_backend(policy.device), timeout=DDP_TIMEOUT)
    world = dist.get_world_size()
    startup.mark("rendezvous")
    if rank == 0:
        run_dir.create()
    env_meta = EnvMeta.from_env_config(spec.env)
    seed = spec.train.seed + rank
    policy.init_train(env_meta, spec.train, seed=seed)
    # Rank 0 picks and loads the checkpoint and broadcasts its training state: the ranks stay identical.
    resumed_from = _resume.resume(policy, run_dir, spec.train.checkpoint.resume)
    if rank == 0:  # the operator's gang attempt (0 locally): a restarted gang says where it resumed from
        log.info("attempt %d of the trainer gang: %s, weight version %d",
                 settings.attempt, f"resumed from {resumed_from}" if resumed_from
                 else "no checkpoint to resume from", policy.weight_version)
    startup.mark("policy")
    source: _datasets.OwnExperience | _datasets.FleetExperience
    if settings.fleet_data:
        port = spec.ports.trajectories + int(os.environ.get("LOCAL_RANK", "0"))
        try:
            source = _datasets.FleetExperience(spec, policy, port, settings.bind_host)
        except OSError as error:
            log.error("cannot receive the fleet's batches (spec.ports.trajectories): %s", error)
            return 1
    else:
        source = _datasets.OwnExperience(spec, policy, seed=seed + world * policy.iteration)
    fleet: _fleet.Fleet | None = None
    recorder: _records.Recorder | None = None
    if rank == 0:
        try:  # the sender continues from the checkpoint's version
            sender = weights.WeightSender(
                spec.weight_sync, settings.master_addr, settings.weight_sync_port, version=policy.weight_version,
                bind_host=settings.bind_host,
            )
        except dist.DistNetworkError as error:
            log.error("cannot host the weight-sync store on port %d (spec.ports.weightSync): %s",
                      settings.weight_sync_port, error)
            source.close()
            return 1
        fleet = _fleet.Fleet(PolicyGroup(policy, sender=sender), settings.expected_evaluators)
        recorder = _records.Recorder(settings, run_dir)
        fleet.await_rejoin()
        startup.mark("registration")
    if resumed_from is None:  # a gang restarted without its run directory continues from the fleet's weights
        _resume.restart_from_fleet(policy, None if fleet is None else lambda: pull_from_fleet(fleet, source, policy))
        if fleet is not None:  # it holds the fleet's version now, not its own 0: publish above it without a warning
            sender.continue_from(policy.weight_version)
    if recorder is not None:  # before the first publish: the resumed version and the run's counts, not zeros
        recorder.begin(policy.iteration, policy.env_steps, policy.weight_version)
    if fleet is not None and recorder is not None and settings.fleet_data:
        # the evaluators need weights before they can produce the first data
        recorder.publish(fleet.publish(policy.iteration))
        startup.mark("first_publish")

    # In a pod, local rank 0 keeps the file of the pod's liveness probe fresh while the loop moves.
    heartbeat = settings.health_file if os.environ.get("LOCAL_RANK", "0") == "0" else None

    def on_wait(waited: float) -> int:
        _health.touch(heartbeat)
        if fleet is not None and recorder is not None:
            recorder.waiting_for_data(waited)
            if fleet.starving(waited):
                recorder.publish(fleet.publish(policy.iteration))
        return policy.weight_version

    reason: _stop.StopReason | None = None
    row: dict = {}
    last_return: float | None = None
    recent_returns = _stop.RecentReturns(spec.eval.episodes_per_report)
    last_shortfall: int | None = None
    try:
        while reason is None:
            _health.touch(heartbeat)
            started = time.monotonic()
            dataset = source.next(policy.weight_version, stop, on_wait)
            if dataset is None:  # a rank was asked to stop while the ranks waited for the fleet
                reason = _stop.StopReason.INTERRUPTED
                break
            policy.weight_version = dataset.version
            startup.mark("first_batch")
            update_started = time.monotonic()
            policy.update_dataset(dataset.batch)
            stats = policy.train()
            update_seconds = time.monotonic() - update_started
            returns = dataset.episode_returns
            total, count, lag_sum, lags, waited, dropped = all_reduce(
                [sum(returns), len(returns), sum(dataset.lags), len(dataset.lags), dataset.wait_seconds,
                 source.dropped_batches()]
            )  # fmt: skip
            (lag_max,) = all_reduce([max(dataset.lags, default=0)], dist.ReduceOp.MAX)
            if count:
                last_return = total / count
            recent_returns.add(total, int(count))
            elapsed = max(time.monotonic() - started, 1e-9)
            data = _records.DataFigures(
                env_steps_per_second=dataset.batch.numel() * world / elapsed,
                trainer_idle_fraction=min(1.0, waited / world / elapsed),
                policy_lag_mean=lag_sum / lags if lags else None,
                policy_lag_max=int(lag_max) if lags else None,
                dropped_batches=int(dropped),
                update_seconds=update_seconds,
            )
            local = _stop.StopReason.INTERRUPTED if stop.requested else None
            if fleet is not None and recorder is not None:
                local, row, last_shortfall = after_iteration(
                    spec, settings, fleet, recorder, policy, (last_return, recent_returns.mean()), stats, data,
                    stop.requested, last_shortfall,
                )
                startup.mark("first_iteration")
                if local is None and policy.iteration % spec.train.checkpoint.interval_iterations == 0:
                    save_checkpoint(policy, run_dir, spec)
            # one MAX all-reduce: the most urgent stop reason of any rank, and rank 0's weight version for all
            code, version = all_reduce([local or 0, policy.weight_version], dist.ReduceOp.MAX)
            reason, policy.weight_version = (_stop.StopReason(int(code)) if code else None), int(version)
        if reason is _stop.StopReason.INTERRUPTED:
            log.info("stopping on %s", stop.signal_name or "a signal to another rank")
        fleet_totals = _fleet_totals(source)
        if fleet is not None and recorder is not None:
            finish(spec, fleet, recorder, policy, run_dir, reason, row, resumed_from, fleet_totals, startup.seconds())
    finally:
        if fleet is not None:
            fleet.close()
        source.close()
        policy.close()
        dist.destroy_process_group()
    return 0


def pull_from_fleet(
    fleet: _fleet.Fleet,
    source: _datasets.OwnExperience | _datasets.FleetExperience,
    policy: BasePolicy,
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
    if not isinstance(source, _datasets.FleetExperience):
        log.warning("no checkpoint to resume and the evaluators hold weight version %d, but they send no trajectories "
                    "(spec.train.dataSource: trainers), so their weights cannot be pulled: training starts from fresh "
                    "weights, versions continuing above %d", version, version)
        return None
    log.info("no checkpoint to resume: pulling weight version %d from the evaluators (at most %.0f s)",
             version, _resume.FLEET_PULL_SECONDS)
    held = source.pull_weights(version, _resume.FLEET_PULL_SECONDS)
    if held is None:
        log.warning("no evaluator answered the pull of weight version %d within %.0f s: training starts from fresh "
                    "weights, versions continuing above %d", version, _resume.FLEET_PULL_SECONDS, version)
    return held


@dataclasses.dataclass
class FleetTotals:
    """What the ranks' intakes took from the fleet over the run, summed over ranks.

    Attributes:
        by_evaluator (dict[int, int]): Env steps trained on per evaluator ordinal.
        by_rank (list[int]): Env steps trained on per rank.
        accepted (int): Batches trained on.
        stale (int): Batches dropped as older than `train.maxPolicyLag`.
        invalid (int): Batches dropped as malformed or not of the policy's layout.
    """

    by_evaluator: dict[int, int]
    by_rank: list[int]
    accepted: int
    stale: int
    invalid: int


def _fleet_totals(source: _datasets.OwnExperience | _datasets.FleetExperience) -> FleetTotals | None:
    """The fleet's totals gathered from every rank (each calls it); None when the trainers collected their own data."""
    if not isinstance(source, _datasets.FleetExperience):
        return None
    stats = source.intake.stats
    gathered: list[tuple[dict[int, int], int, int, int] | None] = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, (source.env_steps_by_evaluator(), stats.accepted, stats.stale, stats.invalid))
    ranks = [rank for rank in gathered if rank is not None]
    by_evaluator: dict[int, int] = {}
    for steps, *_ in ranks:
        for ordinal, count in steps.items():
            by_evaluator[ordinal] = by_evaluator.get(ordinal, 0) + count
    return FleetTotals(
        by_evaluator=dict(sorted(by_evaluator.items())),
        by_rank=[sum(steps.values()) for steps, *_ in ranks],
        accepted=sum(rank[1] for rank in ranks),
        stale=sum(rank[2] for rank in ranks),
        invalid=sum(rank[3] for rank in ranks),
    )


def dropped_summary(totals: FleetTotals, reports: dict[int, weights.ReceiverReport]) -> dict[str, Any]:
    """Why fleet batches were not trained on, and their share of the batches the evaluators completed.

    Args:
        totals (FleetTotals): The intakes' totals.
        reports (dict[int, weights.ReceiverReport]): The evaluators' last reports (their `cut_batches`).

    Returns:
        dict[str, Any]: `reasons` (batches per reason: `stale`, older than `train.maxPolicyLag` on arrival or while
            held; `invalid`, not of the policy's layout; `cut_by_new_version`, collected on-policy while a new version
            was applied, so never sent) and `share` (dropped / (trained on + dropped), 0.0 when none was produced).
    """
    cut = sum(int(report.metrics.get("cut_batches", 0)) for report in reports.values())
    reasons = {"stale": totals.stale, "invalid": totals.invalid, "cut_by_new_version": cut}
    dropped = sum(reasons.values())
    produced = totals.accepted + dropped
    return {"reasons": reasons, "share": round(dropped / produced, 4) if produced else 0.0}


def after_iteration(
    spec: PolicyGroupSpec,
    settings: ProcessSettings,
    fleet: _fleet.Fleet,
    recorder: _records.Recorder,
    policy: BasePolicy,
    train_returns: tuple[float | None, float | None],
    train_stats: dict[str, float],
    data: _records.DataFigures,
    interrupted: bool,
    last_shortfall: int | None,
) -> tuple[_stop.StopReason | None, dict, int | None]:
    """Rank 0 after an iteration: publish when due (after every update when the fleet produces the data), check
    the evaluators, decide the stop, record a row.

    `train_returns` holds the mean return of the latest iteration's training episodes (recorded) and that of the
    latest `eval.episodesPerReport` or more (`_stop.RecentReturns`, for the stop decision).

    Returns:
        tuple[StopReason | None, dict, int | None]: This rank's stop reason (None to go on), the metrics row,
            and the iteration of the last target confirmation that fell short.
    """
    iteration = policy.iteration
    train_return, recent_return = train_returns
    if settings.fleet_data or iteration % spec.weight_sync.interval_iterations == 0:
        recorder.publish(fleet.publish(iteration))
    reports = fleet.live_reports()
    inputs = _stop.StopInputs(
        iteration=iteration,
        env_steps=policy.env_steps,
        total_env_steps=spec.train.total_env_steps,
        target_eval_return=spec.train.target_eval_return,
        fleet_return=_fleet.fleet_return(reports),
        last_shortfall=last_shortfall,
        interrupted=interrupted,
        train_return=recent_return,
    )
    exact = False  # fingerprints every iteration; digests where the newest weights are confirmed
    if _stop.confirmation_due(inputs):
        if fleet.published_iteration != iteration:
            recorder.publish(fleet.publish(iteration))
        log.info("eval return %s, recent training return %s: the target %.1f is reached; confirming on version %d",
                 inputs.fleet_return, recent_return, inputs.target_eval_return, fleet.version)
        confirmed = fleet.wait_for_newest(spec.weight_sync.timeout_seconds)
        inputs = dataclasses.replace(inputs, confirmed_return=confirmed)
        if _stop.decide(inputs) is None:
            log.info("version %d returned %s < target; training on", fleet.version, confirmed)
            last_shortfall = iteration
        reports, exact = fleet.live_reports(), True
    consistency = fleet.check(reports, exact=exact)
    confirmed = inputs.confirmed_return is not None
    row = recorder.iteration(
        iteration=iteration,
        env_steps=policy.env_steps,
        train_return=train_return,
        eval_return=inputs.confirmed_return if confirmed else inputs.fleet_return,
        eval_version=fleet.version if confirmed else _fleet.oldest_return_version(reports),
        weight_version=fleet.version,
        consistent=consistency.consistent,
        evaluators=fleet.live,
        train_stats=train_stats,
        data=data,
    )
    return _stop.decide(inputs), row, last_shortfall


def finish(
    spec: PolicyGroupSpec,
    fleet: _fleet.Fleet,
    recorder: _records.Recorder,
    policy: BasePolicy,
    run_dir: RunDir,
    reason: _stop.StopReason,
    last_row: dict,
    resumed_from: str | None,
    fleet_totals: FleetTotals | None,
    startup_seconds: dict[str, float],
) -> None:
    """Rank 0 at the end: give the evaluators the final weights, check them bit for bit, checkpoint, summarise.

    `fleet_totals` (what the intakes took and dropped; None when the trainers collected their own data) and
    `startup_seconds` (`_startup.StartupClock.seconds`) go into summary.json.
    """
    iteration = policy.iteration
    final_return, final_version = last_row.get("eval_return"), last_row.get("eval_version")
    if reason is not _stop.StopReason.INTERRUPTED:
        members = fleet.settle(spec.weight_sync.timeout_seconds)
        republish = fleet.published_iteration != iteration or not set(members) <= set(fleet.live)
        if republish:  # the final weights, to every evaluator now registered
            recorder.publish(fleet.publish(iteration))
        if reason is not _stop.StopReason.TARGET_EVAL_RETURN or republish:
            confirmed = fleet.wait_for_newest(spec.weight_sync.timeout_seconds)
            if confirmed is not None:
                final_return, final_version = confirmed, fleet.version
    reports = fleet.live_reports()
    consistency = fleet.check(reports, exact=True)
    consistent, consistent_reason = _fleet.final_consistency(consistency, fleet.expected_count())
    save_checkpoint(policy, run_dir, spec)
    target = spec.train.target_eval_return
    recorder.summary(
        last_row,
        stop_reason=reason.label,
        iterations=iteration,
        env_steps=policy.env_steps,
        weight_version=fleet.version,
        final_eval_return=final_return,
        final_eval_version=final_version,
        final_train_return=last_row.get("train_return"),
        target_eval_return=target,
        reached_target=target is not None and final_return is not None and final_return >= target,
        consistent=consistent,
        consistent_reason=consistent_reason,
        evaluators={
            str(o): {"applied_version": r.applied.version, **r.metrics} for o, r in sorted(reports.items())
        },
        resumed_from=resumed_from,
        env_steps_by_evaluator=None if fleet_totals is None else {
            str(o): n for o, n in fleet_totals.by_evaluator.items()
        },
        env_steps_by_rank=None if fleet_totals is None else fleet_totals.by_rank,
        dropped=None if fleet_totals is None else dropped_summary(fleet_totals, reports),
        startup_seconds=startup_seconds,
    )


@_errors.record
def main() -> int:
    """Entry point: read the environment and the manifest, train.

    Returns:
        int: 0 when training ended; `contract.EXIT_BAD_MANIFEST` for a bad manifest or environment (including
            `ENV_ROLE` naming the evaluator role).
    """
    if os.environ.get("TORCHELASTIC_RUN_ID"):  # set by torchrun for its ranks
        _signals.die_with_parent()
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s train[{rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        settings = ProcessSettings.from_env()
        settings.require_role(contract.PolicyRole.TRAIN)
        startup = _startup.StartupClock(settings.launch_time)
        startup.mark("imports")
        spec = validate_file(settings.spec_path).spec
    except (SettingsError, ManifestError) as error:
        for line in str(error).splitlines():
            log.error("%s", line)
        return contract.EXIT_BAD_MANIFEST
    return train(settings, spec, startup)


if __name__ == "__main__":
    sys.exit(main())
