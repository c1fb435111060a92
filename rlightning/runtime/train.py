"""Trainer entrypoint: `python -m rlightning.runtime.train`, one process per DDP rank under torchrun.

Every rank: joins the DDP default group (gloo on CPU, nccl on CUDA; used for gradients and the all-reduces
below, never for weight sync), builds the policy, resumes when `train.checkpoint.resume` (rank 0 loads the
newest checkpoint of its run directory and broadcasts its training state, `_resume`), then loops dataset ->
update_dataset -> train. The dataset comes from the evaluators when they produce the data (`ENV_FLEET_DATA`:
each rank's trajectory intake on `ports.trajectories` + local rank, batches no older than `train.maxPolicyLag`
versions) or from the rank's own env copies (`_datasets`, docs/fleet.md). After each iteration the ranks
all-reduce their episode returns and data figures and agree on whether to stop and on the weight version (one MAX
all-reduce: the most urgent `_stop.StopReason` of any rank, and rank 0's version, which every rank mirrors).

The loop (`TrainingLoop`) is the same on every rank; what rank 0 does beside it plugs in as hooks
(`_rank_zero.RankZero`; the other ranks hold no-op `_rank_zero.TrainerHooks`). Rank 0 hosts the
`rlightning.weights.WeightSender` (store on ENV_TRAIN_MASTER_ADDR:ENV_WEIGHT_SYNC_PORT),
which owns the weight version: it starts from the checkpoint's and assigns every publish the next one, above
whatever the evaluators hold (so a trainer replaced without its run directory continues above the fleet; at start
rank 0 waits up to `_fleet.FLEET_REJOIN_SECONDS` for the evaluators to re-register, and publishes once when they
produce the data). With no checkpoint resumed while the evaluators hold a version, rank 0 first pulls the newest
weights from one of them over its trajectory intake and every rank starts from those (`_rank_zero.pull_from_fleet`,
`_resume.restart_from_fleet`); where they send no trajectories, it starts from fresh weights and says so.
Each iteration rank 0 publishes (every `weightSync.intervalIterations` when the trainers
collect their own data, else after every update) and checks the evaluators (`_fleet`), decides the stop
(`_stop`, pure) and writes the records (`_records`: metrics.jsonl, Prometheus, status.training, summary.json);
it writes the checkpoints, which hold the version published, and records the highest version published in the run
directory (`RunDir.record_published`), so a resume from an older checkpoint publishes above it, never a version twice.
Before any checkpoint is read, rank 0 marks the run directory with the gang's attempt (`RunDir.mark_epoch`): from
then on a trainer of an older attempt (a pod that came back after a partition) can neither start on it nor commit a
checkpoint to it (`rundir.FencedError`), and a resume reads the newest checkpoint by (attempt, iteration).

Stopping on `train.targetEvalReturn` is confirmed on the newest weights: when the evaluators' recent returns
reach the target, rank 0 holds training (the other ranks wait in the stop all-reduce) until every live evaluator
reports a full batch of episodes played entirely with the newest version, and stops only if that mean reaches
the target. So the final eval return in summary.json is that of the final weights. A stop on
`train.totalEnvSteps` waits for that evaluation of the final weights at the end, at most
`_rank_zero.final_evaluation_seconds`; without it summary.json's `final_eval_note` says why. At the end the
evaluators that must (`_fleet.Fleet.expected_count`) get the final weights, and summary.json says whether they hold
them bit for bit (`consistent`).

A dead evaluator makes a publish fail for its group within `weightSync.timeoutSeconds`; training goes on,
the failure is counted and logged, and the evaluator rejoins (new generation) when it comes back.
"""

from __future__ import annotations

import logging
import sys
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from rlightning import contract
from rlightning.config import ManifestError, PolicyGroupSpec
from rlightning.policy import BasePolicy, EnvMeta, PolicyRole, load_policy_class
from rlightning.runtime import _datasets, _errors, _health, _rank_zero, _records, _resume, _signals, _startup, _stop
from rlightning.runtime._collective import all_reduce
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings, SettingsError
from rlightning.runtime.validate import validate_file

log = logging.getLogger("rlightning.train")

DDP_TIMEOUT = timedelta(minutes=30)
"""Timeout of the DDP default group's collectives: covers rank 0's waits for evaluator reports."""


def _device_backend(policy_device: torch.device) -> str:
    return "nccl" if policy_device.type == "cuda" else "gloo"


def train(settings: ProcessSettings, spec: PolicyGroupSpec, startup: _startup.StartupClock | None = None) -> int:
    """Run this rank's training loop until the ranks agree to stop.

    Args:
        settings (ProcessSettings): The process environment (ENV_* variables, torchrun's rank).
        spec (PolicyGroupSpec): The validated spec.
        startup (_startup.StartupClock | None, optional): The start-up phases marked so far (rank 0 writes them
            into summary.json). Defaults to None: a clock started now.

    Returns:
        int: The exit code (0; 1 when rank 0 cannot host the weight-sync store or a rank cannot receive the
            fleet's batches).
    """
    rank = settings.torchrun.rank
    startup = startup or _startup.StartupClock(settings.launch_time)
    stop = _signals.StopRequest()
    run_dir = RunDir(settings.run_dir)
    policy = load_policy_class(spec.policy.policy_class)(spec.policy, PolicyRole.TRAIN)
    if policy.device.type == "cuda":
        torch.cuda.set_device(policy.device)  # nccl collectives run on this rank's own GPU
    dist.init_process_group(_device_backend(policy.device), timeout=DDP_TIMEOUT)
    startup.mark("rendezvous")
    if rank == 0:  # before any checkpoint is read or written: trainers of older attempts can commit none from now on
        run_dir.create().mark_epoch(settings.epoch)
    seed = spec.train.seed + rank
    policy.init_train(EnvMeta.from_env_config(spec.env), spec.train, seed=seed)
    # Rank 0 picks and loads the checkpoint and broadcasts its training state: the ranks stay identical.
    resumed_from = _resume.resume(policy, run_dir, spec.train.checkpoint.resume, settings.epoch)
    if rank == 0:  # the operator's gang attempt (0 locally): a restarted gang says where it resumed from
        log.info("attempt %d of the trainer gang: %s, weight version %d",
                 settings.attempt, f"resumed from {resumed_from}" if resumed_from
                 else "no checkpoint to resume from", policy.weight_version)
    startup.mark("policy")
    try:
        source = _datasets.open_source(spec, policy, settings, seed)
    except OSError as error:
        log.error("cannot receive the fleet's batches (spec.ports.trajectories): %s", error)
        return 1
    hooks = _rank_zero.open_hooks(spec, settings, policy, run_dir, startup, source)
    if hooks is None:
        source.close()
        return 1
    try:
        hooks.await_fleet()
        if resumed_from is None:  # a gang restarted without its run directory continues from the fleet's weights
            _resume.restart_from_fleet(policy, hooks.puller())
        hooks.begin(restarted=resumed_from is None)
        # In a pod, local rank 0 keeps the file of the pod's liveness probe fresh while the loop moves.
        heartbeat = settings.health_file if settings.torchrun.local_rank == 0 else None
        reason = TrainingLoop(spec, policy, source, hooks, stop, heartbeat).run()
        hooks.finish(_rank_zero.Ending(reason, resumed_from, source.totals()))
    finally:
        hooks.close()
        source.close()
        policy.close()
        dist.destroy_process_group()
    return 0


class TrainingLoop:
    """The loop every rank runs: dataset -> update_dataset -> train, the figures all-reduced, the stop agreed.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        policy (BasePolicy): The initialised train policy.
        source (_datasets.Source): Where the datasets come from.
        hooks (_rank_zero.TrainerHooks): This rank's hooks (`_rank_zero.RankZero` on rank 0).
        stop (_signals.StopRequest): The signals that ask this rank to stop.
        heartbeat (Path | None): The liveness probe's file this rank keeps fresh; None for none.
    """

    def __init__(
        self,
        spec: PolicyGroupSpec,
        policy: BasePolicy,
        source: _datasets.Source,
        hooks: _rank_zero.TrainerHooks,
        stop: _signals.StopRequest,
        heartbeat: Path | None,
    ) -> None:
        self.policy, self.source, self.hooks, self.stop, self.heartbeat = policy, source, hooks, stop, heartbeat
        self.max_policy_lag = spec.train.max_policy_lag
        self.recent_returns = _stop.RecentReturns(spec.eval.episodes_per_report)
        self.last_return: float | None = None

    def run(self) -> _stop.StopReason:
        """Train until the ranks agree to stop (one MAX all-reduce per iteration).

        Returns:
            _stop.StopReason: The most urgent reason of any rank.
        """
        reason: _stop.StopReason | None = None
        while reason is None:
            reason = self._iteration()
        if reason is _stop.StopReason.INTERRUPTED:
            log.info("stopping on %s", self.stop.signal_name or "a signal to another rank")
        return reason

    def _on_wait(self, waited: float) -> int:
        _health.touch(self.heartbeat)
        self.hooks.waiting(waited)
        return self.policy.weight_version

    def _iteration(self) -> _stop.StopReason | None:
        """One iteration; the agreed stop reason, or None to go on."""
        policy = self.policy
        _health.touch(self.heartbeat)
        started = time.monotonic()
        dataset = self.source.next(policy.weight_version, self.stop, self._on_wait)
        if dataset is None:  # a rank was asked to stop while the ranks waited for the fleet
            return _stop.StopReason.INTERRUPTED
        policy.weight_version = dataset.version
        self.hooks.got_batch()
        update_started = time.monotonic()
        policy.update_dataset(dataset.batch)
        stats = policy.train()
        result = self._figures(dataset, stats, started, time.monotonic() - update_started)
        local = self.hooks.after_iteration(result)
        # one MAX all-reduce: the most urgent stop reason of any rank, and rank 0's weight version for all
        code, version = all_reduce([local or 0, policy.weight_version], dist.ReduceOp.MAX)
        policy.weight_version = int(version)
        return _stop.StopReason(int(code)) if code else None

    def _figures(
        self, dataset: _datasets.Dataset, stats: dict[str, float], started: float, update_seconds: float
    ) -> _rank_zero.IterationResult:
        """The iteration's figures, all-reduced over the ranks (every rank calls it)."""
        returns = dataset.episode_returns
        by_lag = [0] * (self.max_policy_lag + 1)
        for lag in dataset.lags:  # a rank's version may pass the fill's while it waits: the last bin takes it
            by_lag[min(lag, self.max_policy_lag)] += 1
        total, count, lag_sum, lags, waited, dropped, *lag_counts = all_reduce(
            [sum(returns), len(returns), sum(dataset.lags), len(dataset.lags), dataset.wait_seconds,
             self.source.dropped_batches(), *by_lag]
        )  # fmt: skip
        (lag_max,) = all_reduce([max(dataset.lags, default=0)], dist.ReduceOp.MAX)
        if count:
            self.last_return = total / count
        self.recent_returns.add(total, int(count))
        elapsed = max(time.monotonic() - started, 1e-9)
        world = dist.get_world_size()
        data = _records.DataFigures(
            env_steps_per_second=dataset.batch.numel() * world / elapsed,
            trainer_idle_fraction=min(1.0, waited / world / elapsed),
            policy_lag_mean=lag_sum / lags if lags else None,
            policy_lag_max=int(lag_max) if lags else None,
            dropped_batches=int(dropped),
            update_seconds=update_seconds,
            policy_lag_counts=tuple(int(n) for n in lag_counts) if lags else None,
        )
        return _rank_zero.IterationResult(
            train_return=self.last_return,
            recent_return=self.recent_returns.mean(),
            train_stats=stats,
            data=data,
            interrupted=self.stop.requested,
        )


def _log_to_stderr(rank: str) -> None:
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s train[{rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )


def _bad_environment(error: Exception) -> int:
    """Log `error` line by line; returns `contract.EXIT_BAD_MANIFEST`."""
    for line in str(error).splitlines():
        log.error("%s", line)
    return contract.EXIT_BAD_MANIFEST


@_errors.record
def main() -> int:
    """Entry point: read the environment and the manifest, train.

    Returns:
        int: 0 when training ended; `contract.EXIT_BAD_MANIFEST` for a bad manifest or environment (including
            `ENV_ROLE` naming the evaluator role).
    """
    try:
        settings = ProcessSettings.from_env()
    except SettingsError as error:
        _log_to_stderr("?")
        return _bad_environment(error)
    if settings.torchrun.under_torchrun:
        _signals.die_with_parent()
    _log_to_stderr(str(settings.torchrun.rank))
    try:
        settings.require_role(contract.PolicyRole.TRAIN)
        startup = _startup.StartupClock(settings.launch_time)
        startup.mark("imports")
        spec = validate_file(settings.spec_path).spec
    except (SettingsError, ManifestError) as error:
        return _bad_environment(error)
    return train(settings, spec, startup)


if __name__ == "__main__":
    sys.exit(main())
