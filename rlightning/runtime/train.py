"""Trainer entrypoint: `python -m rlightning.runtime.train`, one process per DDP rank under torchrun.

Every rank: joins the DDP default group (gloo on CPU, nccl on CUDA; used for gradients and the all-reduces
below, never for weight sync), builds the policy, resumes when `train.checkpoint.resume` (rank 0 loads the
newest checkpoint of its run directory and broadcasts its training state, `_resume`), then loops collect ->
update_dataset -> train. After each iteration the ranks all-reduce their episode returns and agree on whether
to stop (one MAX all-reduce: rank 0's decision or any rank's SIGTERM).

Rank 0 also: publishes weights to the evaluators every `weightSync.intervalIterations` through a
`rlightning.weights.WeightSender` (store on ENV_TRAIN_MASTER_ADDR:ENV_WEIGHT_SYNC_PORT) with a strictly
increasing version kept in the checkpoint; checks the evaluators' reports against what it published
(`PolicyGroup.check_reports`); appends a row per iteration to metrics.jsonl; writes checkpoints; serves
Prometheus metrics; patches status.training in a cluster; writes summary.json at the end.

The version survives a trainer replaced without its run directory (a pod's emptyDir): at start rank 0 waits
up to `FLEET_REJOIN_SECONDS` for the evaluators to re-register with the versions they hold, and all ranks
continue from max(checkpoint version, evaluators' newest) (a MAX all-reduce); a late evaluator holding a
newer one makes the sender publish above it, and the per-iteration stop all-reduce carries rank 0's version
to every rank.

Stopping on `train.targetEvalReturn` is confirmed on the newest weights: when the evaluators' recent
returns reach the target, rank 0 holds training (the other ranks wait in the stop all-reduce) until every
live evaluator reports a full batch of episodes played entirely with the newest version. Training resumes
when that mean falls short. So the final eval return in summary.json is that of the final weights.

The fleet whose evaluators must hold the final weights (summary.json `consistent`, the final republish) is the
count the local launcher passes in `ENV_EXPECTED_EVALUATORS`; pods have none (the operator keeps
`eval.replicas` out of the mounted spec, so it reads as the default 1), and there it is every evaluator
registered with the sender once the membership is stable (`Coordinator.settle_members`).

A dead evaluator makes a publish fail for its group within `weightSync.timeoutSeconds`; training goes on,
the failure is counted and logged, and the evaluator rejoins (new generation) when it comes back.
"""

from __future__ import annotations

import logging
import os
import sys
import time
from datetime import UTC, datetime, timedelta

import torch
import torch.distributed as dist

from rlightning import contract, weights
from rlightning.config import ManifestError, PolicyGroupSpec, TrainingStatus
from rlightning.policy import BasePolicy, EnvMeta, PolicyGroup, PolicyRole, load_policy_class
from rlightning.runtime import _resume
from rlightning.runtime import collector as collector_mod
from rlightning.runtime._prometheus import TrainerMetrics
from rlightning.runtime._signals import StopRequest
from rlightning.runtime._status_reporter import StatusReporter
from rlightning.runtime.report import RunSummary, SyncTotals
from rlightning.runtime.rundir import RunDir, append_jsonl, write_json_atomic
from rlightning.runtime.settings import ProcessSettings, SettingsError
from rlightning.runtime.validate import validate_file

log = logging.getLogger("rlightning.train")

CONTINUE, STOP_STEPS, STOP_TARGET, STOP_SIGNAL = 0, 1, 2, 3
STOP_REASONS = {STOP_STEPS: "total_env_steps", STOP_TARGET: "target_eval_return", STOP_SIGNAL: "interrupted"}
DDP_TIMEOUT = timedelta(minutes=30)
"""Timeout of the DDP default group's collectives: covers rank 0's waits for evaluator reports."""
RETRY_TARGET_AFTER_ITERATIONS = 5
"""After a target check falls short on the newest weights, iterations before the next check."""
REPORT_POLL_SECONDS = 0.1
FLEET_REJOIN_SECONDS = 12.0
"""At start, how long rank 0 waits at most for the evaluators to (re-)register before fixing the version floor.

Covers two of the receivers' longest reconnect backoff steps (5 s, `rlightning.weights._store.Backoff`) plus
connection time; it ends early once the expected evaluators registered (`Coordinator.settle_members`). An
evaluator that registers
later with a newer version is handled by the sender, which then publishes above it (`WeightSender.publish`).
"""
MEMBERSHIP_SETTLE_SECONDS = 2.0
"""In pods (no `ENV_EXPECTED_EVALUATORS`), the evaluators registered with the sender count as the fleet once
the membership has not changed for this long (`Coordinator.settle_members`)."""


def _mean(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


class Coordinator:
    """What trainer rank 0 does besides training: publish, check evaluators, record, decide the stop.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        settings (ProcessSettings): The process's environment.
        run_dir (RunDir): The run directory.
        policy (BasePolicy): This rank's train policy; a `PolicyGroup` over it and the `WeightSender` publishes
            the weights and checks the evaluators' reports.
    """

    def __init__(self, spec: PolicyGroupSpec, settings: ProcessSettings, run_dir: RunDir, policy: BasePolicy) -> None:
        self.spec = spec
        self.settings = settings
        self.run_dir = run_dir
        self.sender = weights.WeightSender(spec.weight_sync, settings.master_addr, settings.weight_sync_port)
        self.group = PolicyGroup(policy, sender=self.sender)  # sends, and checks reports (its VersionLedger)
        self.sync = SyncTotals()
        self.metrics = TrainerMetrics(settings.metrics_port)
        self.status = (
            StatusReporter(settings.group_name, settings.namespace)
            if settings.report_status and settings.namespace
            else None
        )
        self.expected = settings.expected_evaluators  # None in pods: the live membership counts
        self.live: list[int] = []  # ordinals that acknowledged the newest publish
        self.published_iteration = -1
        self.retry_target_at = 0
        self.started = time.monotonic()

    # -- weight sync --------------------------------------------------------------------------------------
    def settle_members(self, timeout: float, need_one: bool = False) -> list[int]:
        """Wait until the fleet is registered with the sender, bounded by `timeout` seconds.

        Where the count is known (`ENV_EXPECTED_EVALUATORS`, set by the local launcher) that many evaluators
        must register. In pods the spec's `eval.replicas` is not the fleet's size (the operator leaves the
        scaling fields out of the mounted spec), so there the live membership counts once it has not changed
        for `MEMBERSHIP_SETTLE_SECONDS`.

        Args:
            timeout (float): Seconds to wait at most.
            need_one (bool, optional): In pods, also wait (within `timeout`) for at least one member. Defaults
                to False.

        Returns:
            list[int]: The ordinals registered now.
        """
        deadline = time.monotonic() + timeout
        members, stable_since = self.sender.members, time.monotonic()
        while time.monotonic() < deadline:
            if self.expected is not None:
                if len(members) >= self.expected:
                    break
            elif time.monotonic() - stable_since >= MEMBERSHIP_SETTLE_SECONDS and (members or not need_one):
                break
            time.sleep(REPORT_POLL_SECONDS)
            now = self.sender.members
            if now != members:
                members, stable_since = now, time.monotonic()
        if self.expected is not None and len(members) < self.expected:
            log.warning("only evaluators %s of %d registered within %.0f s", members, self.expected, timeout)
        return members

    def expected_count(self) -> int:
        """Evaluators that must hold the final weights: `ENV_EXPECTED_EVALUATORS`, else the live membership."""
        return self.expected if self.expected is not None else len(self.sender.members)

    def version_floor(self, checkpoint_version: int) -> int:
        """The version to continue from: the checkpoint's or the evaluators' newest, whichever is higher.

        A trainer pod replaced without its run directory (an emptyDir) starts at version 0 while the evaluators
        hold newer versions and would refuse anything older. Waits up to `FLEET_REJOIN_SECONDS` for the
        evaluators to register (`settle_members`; they carry the version they hold), then reads
        `sender.fleet_version`.

        Args:
            checkpoint_version (int): `weight_version` restored from the checkpoint (0 without one).

        Returns:
            int: max(checkpoint_version, highest version any registered evaluator holds).
        """
        self.settle_members(FLEET_REJOIN_SECONDS, need_one=True)
        fleet = self.sender.fleet_version
        if fleet > checkpoint_version:
            log.warning("evaluators %s hold weight version %d, newer than this trainer's %d; continuing from %d",
                        self.sender.members, fleet, checkpoint_version, fleet)
        return max(checkpoint_version, fleet)

    def publish(self, policy: BasePolicy, iteration: int) -> None:
        """Publish the policy's weights under a new version; a failed group is logged.

        Through `PolicyGroup.sync_weights`: the version is `policy.weight_version + 1`, or above the newest
        version an evaluator holds when that is higher; `policy.weight_version` becomes the version published.
        """
        try:
            version = self.group.sync_weights()
        except weights.WeightSyncError:
            version = policy.weight_version  # sync_weights set it to the version published
        stats = self.group.last_sync_stats
        assert stats is not None, "sync_weights sets last_sync_stats, failed or not"
        if stats.failed:
            self.sync.failures += 1
            self.metrics.sync_failures.inc()
            log.warning("weight sync of version %d failed for (group: ordinals) %s; training on without them",
                        version, stats.failed)
        policy.weight_version = version
        self.published_iteration = iteration
        self.live = list(stats.receivers_acked)
        if stats.receivers_acked:
            self.sync.add(stats.bytes, stats.seconds)
            self.metrics.sync_bytes.inc(stats.bytes)
            self.metrics.sync_seconds.inc(stats.seconds)

    def live_reports(self) -> dict[int, weights.ReceiverReport]:
        """Reports of the evaluators that acknowledged the newest publish."""
        reports = self.sender.reports()
        return {o: r for o, r in reports.items() if o in self.live}

    def wait_for_newest(self, version: int, timeout: float) -> float | None:
        """Wait until every live evaluator reports a full batch played with `version`.

        Args:
            version (int): The newest published version.
            timeout (float): Seconds to wait.

        Returns:
            float | None: The evaluators' mean return on `version`, or None on timeout or with no evaluator.
        """
        deadline = time.monotonic() + timeout
        while self.live:
            reports = self.live_reports()
            confirmed = [
                r.metrics["version_return"]
                for r in reports.values()
                if r.metrics.get("return_version") == version and "version_return" in r.metrics
            ]
            if len(confirmed) == len(self.live):
                return _mean(confirmed)
            if time.monotonic() > deadline:
                log.warning("evaluators %s did not report a batch on version %d within %.0f s",
                            sorted(self.live), version, timeout)
                return None
            time.sleep(REPORT_POLL_SECONDS)
        return None

    # -- per iteration ------------------------------------------------------------------------------------
    def after_iteration(
        self, policy: BasePolicy, train_return: float | None, stats: dict[str, float]
    ) -> tuple[int, dict]:
        """Publish when due, check the evaluators, decide the stop and record a metrics row.

        Returns:
            tuple[int, dict]: The stop code (CONTINUE, STOP_STEPS, STOP_TARGET) and the metrics row.
        """
        iteration = policy.iteration
        if iteration % self.spec.weight_sync.interval_iterations == 0:
            self.publish(policy, iteration)
        reports = self.live_reports()
        consistency = self.group.check_reports(reports)
        eval_return = _mean([r.metrics["eval_return"] for r in reports.values() if "eval_return" in r.metrics])
        target = self.spec.train.target_eval_return
        code, confirmed = CONTINUE, None
        if policy.env_steps >= self.spec.train.total_env_steps:
            code = STOP_STEPS
        elif (
            target is not None
            and eval_return is not None
            and eval_return >= target
            and iteration >= self.retry_target_at
        ):
            if self.published_iteration != iteration:
                self.publish(policy, iteration)
            log.info("eval return %.1f reached the target %.1f; confirming on version %d",
                     eval_return, target, policy.weight_version)
            confirmed = self.wait_for_newest(policy.weight_version, self.spec.weight_sync.timeout_seconds)
            if confirmed is not None and confirmed >= target:
                code = STOP_TARGET
            else:
                log.info("version %d returned %s < target; training on", policy.weight_version, confirmed)
                self.retry_target_at = iteration + RETRY_TARGET_AFTER_ITERATIONS
            reports = self.live_reports()
            consistency = self.group.check_reports(reports)
        row = {
            "time": datetime.now(UTC).isoformat(timespec="seconds"),
            "elapsed_seconds": round(time.monotonic() - self.started, 3),
            "iteration": iteration,
            "env_steps": policy.env_steps,
            "train_return": train_return,
            "eval_return": confirmed if confirmed is not None else eval_return,
            "eval_version": policy.weight_version if confirmed is not None else _min_version(reports),
            "weight_version": policy.weight_version,
            "consistent": consistency.consistent,
            "evaluators": sorted(self.live),
            "sync_bytes": self.sync.last_bytes,
            "sync_seconds": self.sync.last_seconds,
            "sync_failures": self.sync.failures,
            **{f"train/{k}": v for k, v in stats.items()},
        }
        append_jsonl(self.run_dir.metrics_path, row)
        self._export(row, force=False)
        return code, row

    def _export(self, row: dict, force: bool) -> None:
        m = self.metrics
        m.iteration.set(row["iteration"])
        m.env_steps.set(row["env_steps"])
        m.weight_version.set(row["weight_version"])
        for gauge, key in ((m.train_return, "train_return"), (m.eval_return, "eval_return")):
            if row.get(key) is not None:
                gauge.set(row[key])
        if row.get("consistent") is not None:
            m.consistent.set(1 if row["consistent"] else 0)
        if self.status is not None:
            self.status.report(
                TrainingStatus(
                    iteration=row["iteration"],
                    env_steps=row["env_steps"],
                    weight_version=row["weight_version"],
                    train_return=row.get("train_return"),
                    eval_return=row.get("eval_return"),
                    consistent=row.get("consistent"),
                    last_sync_seconds=self.sync.last_seconds,
                    last_sync_bytes=self.sync.last_bytes,
                    updated_at=row["time"],
                ),
                force=force,
            )

    # -- the end ------------------------------------------------------------------------------------------
    def finish(self, policy: BasePolicy, code: int, last_row: dict, resumed_from: str | None) -> RunSummary:
        """Make the evaluators hold the final weights, check them, checkpoint and write summary.json."""
        iteration = policy.iteration
        final_return, final_version = last_row.get("eval_return"), last_row.get("eval_version")
        if code != STOP_SIGNAL:
            members = self.settle_members(self.spec.weight_sync.timeout_seconds)
            republish = self.published_iteration != iteration or not set(members) <= set(self.live)
            if republish:  # the final weights, to every evaluator now registered
                self.publish(policy, iteration)
            if code != STOP_TARGET or republish:
                confirmed = self.wait_for_newest(policy.weight_version, self.spec.weight_sync.timeout_seconds)
                if confirmed is not None:
                    final_return, final_version = confirmed, policy.weight_version
        reports = self.live_reports()
        consistency = self.group.check_reports(reports)
        # Every expected evaluator (the launcher's count, else every registered one) holds the final version,
        # bit for bit.
        expected = self.expected_count()
        consistent = consistency.consistent is not False and len(consistency.on_latest) >= expected
        save_checkpoint(policy, self.run_dir, self.spec)
        target = self.spec.train.target_eval_return
        summary = RunSummary(
            name=self.settings.group_name,
            stop_reason=STOP_REASONS[code],
            iterations=iteration,
            env_steps=policy.env_steps,
            wall_seconds=round(time.monotonic() - self.started, 3),
            weight_version=policy.weight_version,
            final_eval_return=final_return,
            final_eval_version=final_version,
            final_train_return=last_row.get("train_return"),
            target_eval_return=target,
            reached_target=target is not None and final_return is not None and final_return >= target,
            consistent=consistent,
            evaluators={
                str(o): {"applied_version": r.applied_version, **r.metrics} for o, r in sorted(reports.items())
            },
            sync=self.sync,
            resumed_from=resumed_from,
        )
        write_json_atomic(self.run_dir.summary_path, summary.to_dict())
        self._export({**last_row, "weight_version": policy.weight_version, "consistent": consistent}, force=True)
        log.info("summary: %s", summary.to_dict())
        return summary

    def close(self) -> None:
        """Close the weight sender (its store goes down with it)."""
        self.sender.close()


def _min_version(reports: dict[int, weights.ReceiverReport]) -> int | None:
    versions = [int(r.metrics["return_version"]) for r in reports.values() if "return_version" in r.metrics]
    return min(versions) if versions else None


def save_checkpoint(policy: BasePolicy, run_dir: RunDir, spec: PolicyGroupSpec) -> None:
    """Write the checkpoint of the current iteration and delete all but the newest `checkpoint.keep`."""
    path = policy.save_checkpoint(run_dir.checkpoint_path(policy.iteration))
    run_dir.prune_checkpoints(spec.train.checkpoint.keep)
    log.info("checkpoint %s (weight version %d)", path, policy.weight_version)


def _device_backend(policy_device: torch.device) -> str:
    return "nccl" if policy_device.type == "cuda" else "gloo"


def _all_reduce(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=op)
    return tensor.cpu().tolist()


def train(settings: ProcessSettings, spec: PolicyGroupSpec) -> int:
    """Run this rank's training loop until the ranks agree to stop.

    Args:
        settings (ProcessSettings): The process environment (ENV_* variables).
        spec (PolicyGroupSpec): The validated spec.

    Returns:
        int: The exit code (0).
    """
    rank = int(os.environ.get("RANK", "0"))
    stop = StopRequest()
    run_dir = RunDir(settings.run_dir)
    policy_class = load_policy_class(spec.policy.policy_class)
    policy = policy_class(spec.policy, PolicyRole.TRAIN)
    if policy.device.type == "cuda":
        torch.cuda.set_device(policy.device)  # nccl collectives run on this rank's own GPU
    dist.init_process_group(_device_backend(policy.device), timeout=DDP_TIMEOUT)
    world = dist.get_world_size()
    if rank == 0:
        run_dir.create()
    env_meta = EnvMeta.from_env_config(spec.env)
    seed = spec.train.seed + rank
    policy.init_train(env_meta, spec.train, seed=seed)
    # Rank 0 picks and loads the checkpoint and broadcasts its training state: the ranks stay identical.
    resumed_from = _resume.resume(policy, run_dir, spec.train.checkpoint.resume)
    collector = collector_mod.RolloutCollector(spec.env, policy, seed=seed + world * policy.iteration)
    try:
        coordinator = Coordinator(spec, settings, run_dir, policy) if rank == 0 else None
    except dist.DistNetworkError as error:
        log.error("cannot host the weight-sync store on port %d (spec.ports.weightSync): %s",
                  settings.weight_sync_port, error)
        return 1
    # Every rank continues from the same version floor (rank 0 learns the evaluators' newest); MAX all-reduce.
    floor = coordinator.version_floor(policy.weight_version) if coordinator is not None else 0
    policy.weight_version = int(_all_reduce([max(floor, policy.weight_version)], dist.ReduceOp.MAX)[0])
    code, last_return = CONTINUE, None
    row: dict = {}
    try:
        while code == CONTINUE:
            finished = collector.episodes_finished
            policy.update_dataset(collector.collect(spec.train.rollout_steps))
            stats = policy.train()
            new = min(collector.episodes_finished - finished, len(collector.recent_returns))
            returns = list(collector.recent_returns)[len(collector.recent_returns) - new :]
            total, count = _all_reduce([sum(returns), len(returns)])
            if count:
                last_return = total / count
            if coordinator is not None:
                code, row = coordinator.after_iteration(policy, last_return, stats)
                if code == CONTINUE and policy.iteration % spec.train.checkpoint.interval_iterations == 0:
                    save_checkpoint(policy, run_dir, spec)
            local = STOP_SIGNAL if stop.requested else CONTINUE
            # one MAX all-reduce: the stop decision, and rank 0's weight version (it may have jumped) for all
            decided, version = _all_reduce([max(code, local), policy.weight_version], dist.ReduceOp.MAX)
            code, policy.weight_version = int(decided), int(version)
        if code == STOP_SIGNAL:
            log.info("stopping on %s", stop.signal_name or "a signal to another rank")
        if coordinator is not None:
            coordinator.finish(policy, code, row, resumed_from)
    finally:
        if coordinator is not None:
            coordinator.close()
        collector.close()
        policy.close()
        dist.destroy_process_group()
    return 0


def main() -> int:
    """Entry point: read the environment and the manifest, train.

    Returns:
        int: 0 when training ended; `contract.EXIT_BAD_MANIFEST` for a bad manifest or environment (including
            `ENV_ROLE` naming the evaluator role).
    """
    rank = os.environ.get("RANK", "0")
    logging.basicConfig(
        level=logging.INFO, format=f"%(asctime)s train[{rank}] %(levelname)s %(name)s: %(message)s", stream=sys.stderr
    )
    try:
        settings = ProcessSettings.from_env()
        settings.require_role(contract.ROLE_TRAIN)
        spec = validate_file(settings.spec_path).spec
    except (SettingsError, ManifestError) as error:
        for line in str(error).splitlines():
            log.error("%s", line)
        return contract.EXIT_BAD_MANIFEST
    return train(settings, spec)


if __name__ == "__main__":
    sys.exit(main())
