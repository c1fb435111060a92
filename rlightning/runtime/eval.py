"""Evaluator entrypoint: `python -m rlightning.runtime.eval`, one process per evaluator (a pod, or a local process).

An evaluator is the rollout side of the loop. A background thread receives versions from the trainer
(`rlightning.weights.WeightReceiver`, which waits with backoff for the trainer's store and relays the buckets to
its children in the relay tree), stages them in the policy's buffer and has the policy's update thread apply them
between forward passes before it acknowledges (`receive(apply=...)`: an ack means applied; a failed apply is
acknowledged as failed); then it reports the version with its fingerprint and digest, so the trainer can check
them. The evaluator does nothing before it holds its first version; in a pod it is Ready from then on (the file
of its readiness probe, `ENV_HEALTH_FILE`).

When the evaluators produce the training data (`ENV_FLEET_DATA`, `rlightning.launch.fleet_collects`), the main
thread steps
`env.numEnvs` env copies (as concurrent shards in async rollout mode, `collector.fleet_collector`) with the newest
weights it holds and sends `[train.rolloutSteps, env.numEnvs]` batches
to the trainer ranks (`rlightning.trajectories.TrajectorySender`, at most `BATCH_CREDITS` unacknowledged), each
stamped with the version applied at its first step, the ordinal and the episodes that finished in it. Under
`train.maxPolicyLag: 0` a batch during which a new version was applied is not sent (it could not be trained on),
and none is collected while every trainer rank holds enough of the version it has
(`TrajectorySender.wanted`): it waits for the next version; a second batch of one version waits twice as long as
the first took (`PEER_BATCH_SLACK_SECONDS`), so the ranks get one batch per evaluator, not extras they must drop.
With lag allowed, it collects while the ranks learn, but a second batch of one version only once the ranks read the
first (`BatchPacing`), so a fleet faster than the updates does not queue batches that turn stale, and none of a
version every rank is already more than the lag past (`TrajectorySender.too_old`: its weights lag); under a policy
that corrects for lag (`BasePolicy.corrects_policy_lag`: APPO) it free-runs, collecting whenever it has a credit. A
restarted trainer gang without a checkpoint pulls the weights this evaluator holds over the same connection
(`held_weights`, docs/trajectories.md).
Between batches it plays deterministic evaluation episodes of the version it holds when
`eval.evaluationIntervalSeconds` passed since its last complete evaluation, when it has had no credit (the
trainers take no data) for `IDLE_EVALUATION_SECONDS`, or when its recent training episodes reach
`train.targetEvalReturn` (`TARGET_EVALUATION_SECONDS`), so a target reached is confirmed soon. One at a time, except
when rank 0, holding training to confirm the target on a version, asks for it (`TrajectorySender.evaluation_asked`):
then it plays the episodes of its share (`TrajectorySender.evaluation_episodes`: rank 0 splits `episodesPerReport`
over the live fleet) that version still lacks at once, up to `EVALUATION_COPIES` env copies stepped together, and
reports as soon as it has played them. Otherwise it only plays evaluation episodes, without pause.

After every `eval.episodesPerReport` evaluation episodes it reports:

- `eval_return`: mean return of the last `episodesPerReport` episodes (whatever weights played them);
- `return_version`, `version_return` and `version_episodes`: when the last `episodesPerReport` episodes (or, asked,
  the share) were each played entirely with the version now applied, that version, their mean and their count (what
  the trainer's target check uses);
- `episodes`: evaluation episodes finished since start; `env_steps`: env steps of the batches it sent;
  `cut_batches`: on-policy batches it collected and did not send, because a new version was applied meanwhile;
  `refused_publishes`: publishes its receiver refused, sent by a trainer of an older attempt than one it has seen;
  `in_place_versions`: versions received whole straight into the policy (`bufferStrategy: none`; 0 with `single`).

With `policy.weightBuffer.bufferStrategy: none` a version is received in place (`WeightReceiver.receive(into=...)`,
`rlightning.weights._inplace`): rollouts pause from its first transfer to its commit and it lands in the policy's
own tensors, so the evaluator holds the model plus two transfer buffers, never a second copy. A receive that stops
part way leaves the policy holding no version: the evaluator is not Ready, drops the batch or episode that ran
meanwhile and plays nothing until the next complete version.

SIGTERM (pod deletion, `rlightning run` stopping) ends the current episode or batch (a batch cut short is not
sent), waits at most `SHUTDOWN_JOIN_SECONDS` for the receiving thread, leaves the weight-sync group and exits 0:
well within the pod's terminationGracePeriodSeconds (weightSync.timeoutSeconds + 15 s, set by the operator).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading
import time

import torch

from rlightning import contract, trajectories, weights
from rlightning.config import ManifestError, PolicyGroupSpec
from rlightning.policy import EnvMeta, PolicyRole, build_policy
from rlightning.runtime import _datasets, _errors, _exit, _health, collector
from rlightning.runtime._prometheus import EvaluatorMetrics
from rlightning.runtime._signals import StopRequest
from rlightning.runtime.settings import ProcessSettings, SettingsError, eval_ordinal
from rlightning.runtime.validate import validate_file

log = logging.getLogger("rlightning.eval")

RECEIVE_POLL_SECONDS = 1.0
"""How long one `receive` call waits for an announcement before the thread checks for a stop."""
APPLY_TIMEOUT_SECONDS = 60.0
"""Bound on waiting for the update thread to apply a staged version (buffer strategy `single`); at most
`SyncTimings.apply` (half of `weightSync.timeoutSeconds`, which the sender waits for the acknowledgement)."""
SHUTDOWN_JOIN_SECONDS = 3.0
"""Bound on waiting for the receiving thread at shutdown; a receive still running past it is abandoned (the
thread is a daemon) so the clean `leave` is posted within the pod's grace period."""
SEED_STRIDE = 1_000_003
"""Evaluator `o` plays evaluation episode `i` with seed `train.seed + SEED_STRIDE * (o + 1) + i`, and seeds its
training env copies with `train.seed + SEED_STRIDE * (o + 1) + TRAINING_SEED_OFFSET`."""
TRAINING_SEED_OFFSET = 500_000
BATCH_CREDITS = {0: 1, 1: 2}
"""Batches an evaluator may have sent and not yet had acknowledged, by whether `train.maxPolicyLag` is 0 or more:
on-policy, one (a batch collected while the trainers learn from the last ones would be too old once they publish);
with lag allowed, two (one in flight while it collects the next)."""
IDLE_EVALUATION_SECONDS = 0.5
"""An evaluator without credit for this long (the trainers take no data: training, or confirming the target on
the newest version) plays evaluation episodes meanwhile."""
CREDIT_POLL_SECONDS = 0.05
ACK_POLL_SECONDS = 0.01
"""With lag allowed, how long an evaluator whose last batch is unread waits for its acknowledgement before it looks
for a newer version again (`BatchPacing`)."""
TARGET_EVALUATION_SECONDS = 1.0
"""Once the returns of an evaluator's last `eval.episodesPerReport` training episodes reach `train.targetEvalReturn`,
it evaluates the version it holds at most this often (besides `eval.evaluationIntervalSeconds`)."""
EVALUATION_COPIES = 8
"""Most evaluation episodes an evaluator plays at once (an env copy each), when rank 0 asks it to evaluate a version
now: a report's worth in one pass, as far as this allows, instead of one episode after another."""
PEER_BATCH_SLACK_SECONDS = 0.1
"""On-policy, an evaluator collects a second batch of one version only once twice as long as its first batch took,
plus this, has passed since it sent the first: time for the other evaluators' batches of that version to reach the ranks
and their `full` notices to come back, so that it does not collect a batch the ranks will not take. With fewer live
evaluators than batches per version, the ranks wait this long for each further batch."""
PULL_APPLY_WAIT_SECONDS = 1.0
"""Bound on waiting, when a trainer pulls the weights, for a version staged but not yet applied; past it the pull is
answered with version 0 (the trainer asks another evaluator)."""


class EvaluationRecord:
    """Returns of an evaluator's evaluation episodes, and the reports they make (module docstring).

    Args:
        episodes_per_report (int): `eval.episodesPerReport`.
    """

    def __init__(self, episodes_per_report: int) -> None:
        self.n = episodes_per_report
        self.recent: collections.deque[float] = collections.deque(maxlen=episodes_per_report)
        self.pure: list[float] = []  # returns of episodes played entirely with `pure_version`
        self.pure_version = -1
        self.episodes = 0

    def add(self, episode_return: float, before: int, after: int, enough: int | None = None) -> dict[str, float] | None:
        """Count one episode played from version `before` to version `after`.

        Args:
            episode_return (float): Its undiscounted return.
            before (int): The version applied at its first step.
            after (int): The version applied at its last step.
            enough (int | None, optional): Episodes of `after` alone that make a report on it (rank 0's share when it
                asked for them, `Fleet.evaluation_share`). Defaults to None: `n`.

        Returns:
            dict[str, float] | None: The report due after it (`eval_return`, `episodes`, and `return_version` with
                `version_return` and `version_episodes` when the last `enough` or more episodes, at most `n`, were
                played with `after` alone), or None.
        """
        enough = enough or self.n
        self.episodes += 1
        self.recent.append(episode_return)
        if after != self.pure_version:
            self.pure_version, self.pure = after, []
        if before == after:
            self.pure.append(episode_return)
        if self.episodes % self.n and len(self.pure) not in (enough, self.n):
            return None
        report = {"eval_return": sum(self.recent) / len(self.recent), "episodes": float(self.episodes)}
        if len(self.pure) >= enough:
            counted = self.pure[-self.n :]
            report.update(return_version=float(self.pure_version), version_return=sum(counted) / len(counted),
                          version_episodes=float(len(counted)))  # fmt: skip
        return report

    def complete(self, version: int, enough: int | None = None) -> bool:
        """Whether `enough` (default `n`) episodes were played entirely with `version`."""
        return self.pure_version == version and len(self.pure) >= (enough or self.n)

    def missing(self, version: int, enough: int | None = None) -> int:
        """Episodes still to play entirely with `version` before a report on it (1..`enough`, default `n`)."""
        return max(1, (enough or self.n) - (len(self.pure) if self.pure_version == version else 0))


class Evaluator:
    """One member of the evaluation fleet.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        settings (ProcessSettings): The process environment.
        ordinal (int): This evaluator's stable ordinal.
    """

    def __init__(self, spec: PolicyGroupSpec, settings: ProcessSettings, ordinal: int) -> None:
        self.spec = spec
        self.ordinal = ordinal
        self.health_file = settings.health_file
        self.stop = StopRequest()
        self.policy = build_policy(spec.policy, PolicyRole.EVAL)
        self.policy.init_eval(EnvMeta.from_env_config(spec.env), seed=spec.train.seed + ordinal)
        self.receiver = weights.WeightReceiver(
            spec.weight_sync, settings.master_addr, settings.weight_sync_port, ordinal
        )
        self.metrics = EvaluatorMetrics(settings.metrics_port, settings.bind_host)
        self.data_sender = _datasets.open_sink(
            settings,
            ordinal,
            batch_credits=BATCH_CREDITS[min(spec.train.max_policy_lag, 1)],
            ack_timeout=spec.weight_sync.timeout_seconds,
            held_weights=self.held_weights,
        )
        self.record = EvaluationRecord(spec.eval.episodes_per_report)
        self._env_steps = 0
        self._cut_batches = 0  # on-policy batches not sent: a new version was applied while they were collected
        self._lock = threading.Lock()
        self._post_lock = threading.Lock()  # held from reading the state to posting it (`_post`)
        self._weights_lock = threading.Lock()  # held while a received version is applied, and while it is copied
        self._applied_record: weights.WeightRecord | None = None  # what the policy holds, as last reported
        self._report: dict[str, float] = {}
        self._applied = threading.Event()
        self._new_version = threading.Event()  # set by the receiving thread after each apply
        self._torn = 0  # receives in place that stopped part way: what ran meanwhile used no whole version
        self._in_place_versions = 0  # receives in place that completed
        self._dtypes = {name: t.dtype for name, t in weights.named_state(self.policy).items()}
        self._in_place = self if self.policy.weight_buffer_strategy == "none" else None

    # -- receiving thread ---------------------------------------------------------------------------------
    def _apply(self, version: int, state: dict[str, torch.Tensor]) -> None:
        """Apply a received version before it is acknowledged (`WeightReceiver.receive`'s `apply`): an ack then
        means every rollout that starts afterwards uses it.

        Floating tensors sent in `weightSync.dtype` are held in the policy's own dtypes (bfloat16 -> float32 is
        exact, so the digests in that dtype still match). The gated API stages them for the update thread
        (`single`) or applies them now between forward passes (`none`).

        Raises:
            RuntimeError: The version is not newer than the one held, or was not applied in time (the receiver
                then acknowledges it as failed).
        """
        own = self._dtypes
        state = {name: t.to(own[name]) if name in own and t.dtype != own[name] else t for name, t in state.items()}
        with self._weights_lock:
            if not self.policy.push_weights(version, state):
                raise RuntimeError(f"version {version} is not newer than the one held ({self.policy.weight_version})")
            timeout = min(APPLY_TIMEOUT_SECONDS, self.spec.weight_sync.timings.apply)
            if self.policy.weight_buffer_strategy == "single" and not self.policy.wait_for_weight_update_done(timeout):
                log.warning("version %d was not applied: %s", version, self.policy.weight_update_error)
                raise RuntimeError(f"version {version} was not applied within {timeout:.0f} s")

    # -- receiving in place (buffer strategy `none`, `weights.WeightReceiver.receive(into=...)`) ----------------
    def receive_targets(self) -> dict[str, torch.Tensor]:
        """The policy's own tensors, which a version received in place is written into."""
        return self.policy.receive_targets()

    def begin_weight_receive(self, timeout: float) -> bool:
        """Pause rollouts (and a trainer's pull of the weights) while a version is written into the policy."""
        if not self._weights_lock.acquire(timeout=timeout):
            return False
        if self.policy.begin_weight_receive(timeout):
            return True
        self._weights_lock.release()
        return False

    def end_weight_receive(self, version: int | None) -> None:
        """Resume rollouts; after a receive that stopped part way the policy holds no version, so this evaluator
        is not Ready and plays nothing until the next complete one (what was cut short is dropped).
        """
        try:
            self.policy.end_weight_receive(version)
            if version is not None:
                with self._lock:
                    self._in_place_versions += 1
            else:
                with self._lock:
                    self._torn += 1
                    self._applied_record = None
                self._applied.clear()
                _health.remove(self.health_file)
                log.warning("evaluator %d holds no whole version after a failed receive; waiting for the next",
                            self.ordinal)
        finally:
            self._weights_lock.release()

    def held_weights(self) -> tuple[int, dict[str, torch.Tensor]]:
        """The version held and a CPU copy of the weights, for a restarted trainer's pull (`TrajectorySender`).

        Called on the main thread between batches and episodes (no rollout runs); the lock keeps the receiving
        thread from applying a version meanwhile, and a version still staged is waited for.

        Returns:
            tuple[int, dict[str, torch.Tensor]]: The version and clean name -> tensor (the `named_state` form a
            trainer's `get_eval_weights()` names); `(0, {})` before the first version, or while one is not applied
            within `PULL_APPLY_WAIT_SECONDS`.
        """
        with self._weights_lock:
            if self.policy.weight_version == 0 or not self.policy.wait_for_weight_update_done(PULL_APPLY_WAIT_SECONDS):
                return 0, {}
            state = {name: t.to("cpu", copy=True) for name, t in weights.named_state(self.policy).items()}
            return self.policy.weight_version, state

    def _receive_loop(self) -> None:
        while not self.stop.requested:
            if self.receiver.receive(RECEIVE_POLL_SECONDS, apply=self._apply, into=self._in_place) is None:
                continue
            # Only this thread asks for updates, so the weights stay put while they are digested.
            record = weights.WeightRecord.of(
                self.policy.weight_version, weights.named_state(self.policy), cast=self.spec.weight_sync.dtype
            )
            with self._lock:
                self._applied_record = record
            self._applied.set()
            self._new_version.set()
            _health.touch(self.health_file)  # ready: it holds weights
            self.metrics.weight_version.set(record.version)
            self._post()

    def _post(self) -> None:
        """Post the applied record with the newest report; both threads post, one at a time, so the last one posted
        is the last one read (the sender keeps only the last).
        """
        with self._post_lock:
            with self._lock:
                record = self._applied_record
                report = {**self._report, "env_steps": float(self._env_steps),
                          "cut_batches": float(self._cut_batches), "refused_publishes": float(self.receiver.refused),
                          "in_place_versions": float(self._in_place_versions)}  # fmt: skip
            # Episodes of a version the receiving thread applied but has not digested yet would go out paired with
            # the older record; that thread posts them with the new record as soon as it has it.
            if record is not None and report.get("return_version", 0.0) <= record.version:
                self.receiver.report(record, report)

    # -- main loop --------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Receive in the background; produce training data and evaluate (or only evaluate) until SIGTERM.

        Returns:
            int: The exit code (0).
        """
        thread = threading.Thread(target=self._receive_loop, name="weight-receiver", daemon=True)
        thread.start()
        log.info("evaluator %d waiting for the first weights", self.ordinal)
        self._wait_for_weights()
        try:
            if self.data_sender is None:
                while not self.stop.requested:
                    self._evaluate()
            else:
                self._produce(self.data_sender)
        finally:
            log.info("evaluator %d stopping on %s after %d evaluation episodes and %d env steps of data",
                     self.ordinal, self.stop.signal_name, self.record.episodes, self._env_steps)
            thread.join(SHUTDOWN_JOIN_SECONDS)
            if thread.is_alive():
                log.warning("evaluator %d: a weight receive still runs after %.0f s; leaving without it",
                            self.ordinal, SHUTDOWN_JOIN_SECONDS)
            _health.remove(self.health_file)
            if self.data_sender is not None:
                self.data_sender.close()
            self.receiver.close()
            self.policy.close()
        return 0

    def _wait_for_weights(self) -> None:
        """Block until the policy holds a whole version, or a stop is requested."""
        while not self.stop.requested and not self._applied.wait(0.5):
            pass

    def _evaluate(self, episodes: int = 1, enough: int | None = None) -> None:
        """Play `episodes` deterministic evaluation episodes together with the newest weights; report when due
        (`EvaluationRecord.add`, `enough` passed on).
        """
        self._wait_for_weights()
        if self.stop.requested:
            return
        torn = self._torn
        episode = self.record.episodes
        before = self.policy.weight_version
        if before == 0:  # torn after the wait (the version drops before `_torn` counts it): wait again
            return
        returns = collector.evaluate_episodes(
            self.policy,
            self.spec.env,
            episodes,
            deterministic=self.spec.eval.deterministic,
            seed=self.spec.train.seed + SEED_STRIDE * (self.ordinal + 1) + episode,
        )
        if self._torn != torn:
            return  # played partly with no whole version: not counted
        after = self.policy.weight_version
        reports = [self.record.add(ret, before, after, enough) for ret in returns]
        self.metrics.episodes.inc(len(returns))
        report = next((r for r in reversed(reports) if r is not None), None)
        if report is not None:
            with self._lock:
                self._report = report
            self.metrics.eval_return.set(report["eval_return"])
            self._post()

    def _produce(self, sender: trajectories.TrajectorySender) -> None:
        """Send training batches, evaluating between them when due (module docstring)."""
        spec = self.spec
        rollouts = collector.fleet_collector(
            spec, [self.policy], seed=spec.train.seed + SEED_STRIDE * (self.ordinal + 1) + TRAINING_SEED_OFFSET
        )
        schedule = EvaluationSchedule(spec)
        pacing = BatchPacing(spec.train.max_policy_lag, free_run=self.policy.corrects_policy_lag)
        try:
            while not self.stop.requested:
                self._wait_for_weights()
                torn = self._torn
                version = self.policy.weight_version
                if version == 0:  # torn after the wait: wait again
                    continue
                wanted = pacing.wanted(sender, version)
                credit = sender.wait_for_credit(0.0) and wanted
                asked = sender.evaluation_asked == version  # rank 0 holds training to confirm the target on it
                share = sender.evaluation_episodes if asked else None
                due = schedule.due(credit)
                if asked and not self.record.complete(version, share):
                    self._evaluate(min(self.record.missing(version, share), EVALUATION_COPIES), share)
                    continue
                if not self.record.complete(version) and due:
                    self._evaluate()
                    if self.record.complete(self.policy.weight_version):
                        schedule.evaluated()
                    continue
                if not credit:
                    if wanted:
                        sender.wait_for_credit(CREDIT_POLL_SECONDS)
                    elif pacing.max_policy_lag > 0 and sender.in_flight:  # its last batch, of this version, unread
                        sender.wait_for_acks(ACK_POLL_SECONDS)
                    else:
                        self._new_version.wait(CREDIT_POLL_SECONDS)
                        self._new_version.clear()
                    continue
                schedule.train_returns.extend(self._send_batch(rollouts, sender, pacing, (version, torn)))
        finally:
            rollouts.close()

    def _send_batch(
        self,
        rollouts: collector.RolloutCollector | collector.ShardedRolloutCollector,
        sender: trajectories.TrajectorySender,
        pacing: BatchPacing,
        held: tuple[int, int],
    ) -> list[float]:
        """Collect one batch with the version held (`held`: the version and the torn-receive count at its start) and
        send it, unless a stop, a torn receive or (on-policy) a new version came meanwhile.

        Returns:
            list[float]: The returns of the training episodes that finished in a batch sent; empty otherwise.
        """
        version, torn = held
        finished, collect_started = rollouts.episodes_finished, time.monotonic()
        batch = rollouts.collect(self.spec.train.rollout_steps)
        if self.stop.requested or self._torn != torn:
            return []  # cut short by the signal's episode end, or collected partly with no whole version: never sent
        if self.policy.weight_version != version and self.spec.train.max_policy_lag == 0:
            with self._lock:  # a new version came mid-batch: too old on arrival, so not sent
                self._cut_batches += 1
            return []
        new = rollouts.finished_since(finished)
        stamp = trajectories.BatchStamp(
            version=version,
            ordinal=self.ordinal,
            sequence=pacing.sequence + 1,
            env_steps=batch.numel(),
            episode_returns=new.returns,
            episode_lengths=new.lengths,
            epoch=self.receiver.epoch_of(version),  # a trainer of a newer attempt drops it
        )
        sender.send(batch, stamp)
        pacing.sent(version, collect_started)
        with self._lock:  # posted with the next acknowledgement of a version
            self._env_steps += stamp.env_steps
        self.metrics.env_steps.inc(stamp.env_steps)
        self.metrics.batches.inc()
        return list(new.returns)


class BatchPacing:
    """When an evaluator collects the next training batch of a version (module docstring).

    On-policy, a batch of a version every rank already holds enough of is waste: it waits for the next. A second
    batch of one version waits `grace` (twice as long as its first took, plus `PEER_BATCH_SLACK_SECONDS`), so the
    other evaluators' batches of it arrive and the ranks' `full` notices come first.

    With lag allowed, a batch of the version it holds is wanted unless its last batch was of that version too and
    no rank has read it yet: an evaluator faster than the ranks' updates sends one batch a version, which the
    ranks' next read takes with a lag of at most one, instead of queueing batches that turn stale before they are
    read; one slower than them never waits, as the ranks read while they wait for data. A version the ranks are
    already more than `maxPolicyLag` past (an evaluator whose weights lag, on a loaded node) is not collected at all:
    the evaluator waits for newer weights instead of playing a batch that would be dropped as stale on arrival.

    With lag allowed and a policy that corrects for it (`free_run`: `BasePolicy.corrects_policy_lag`, V-trace), the
    evaluator free-runs as IMPALA's actors do: it collects whenever a credit is free, several batches of one version
    included, and only a version the ranks are already more than `maxPolicyLag` past is not collected.

    Args:
        max_policy_lag (int): `train.maxPolicyLag`.
        free_run (bool, optional): The policy corrects for lag; ignored at `maxPolicyLag` 0. Defaults to False.

    Attributes:
        sequence (int): Batches sent so far (the last one's `BatchStamp.sequence`).
    """

    def __init__(self, max_policy_lag: int, free_run: bool = False) -> None:
        self.max_policy_lag = max_policy_lag
        self.free_run = free_run
        self.sequence = 0
        self._version, self._at, self._grace = -1, 0.0, 0.0

    def wanted(self, sender: trajectories.TrajectorySender, version: int) -> bool:
        """Whether a batch of `version` is wanted now."""
        if self.max_policy_lag > 0:
            fresh = not sender.too_old(version, self.max_policy_lag)
            return fresh and (self.free_run or version != self._version or sender.in_flight == 0)
        return sender.wanted(version) and (version != self._version or time.monotonic() - self._at >= self._grace)

    def sent(self, version: int, collect_started: float) -> None:
        """A batch of `version`, whose collection started at monotonic `collect_started`, was sent now."""
        self.sequence += 1
        self._version, self._at = version, time.monotonic()
        self._grace = 2 * (self._at - collect_started) + PEER_BATCH_SLACK_SECONDS


class EvaluationSchedule:
    """When an evaluator that produces training data plays evaluation episodes between batches (module docstring).

    Args:
        spec (PolicyGroupSpec): The validated spec (`eval.evaluationIntervalSeconds`, `train.targetEvalReturn`,
            `eval.episodesPerReport`).

    Attributes:
        train_returns (collections.deque[float]): Returns of the latest `eval.episodesPerReport` training episodes.
    """

    def __init__(self, spec: PolicyGroupSpec) -> None:
        self.interval = spec.eval.evaluation_interval_seconds
        self.target = spec.train.target_eval_return
        self.train_returns: collections.deque[float] = collections.deque(maxlen=spec.eval.episodes_per_report)
        self._next_evaluation = time.monotonic() + self.interval
        self._next_target_check = time.monotonic()
        self._idle_since: float | None = None

    def due(self, credit: bool) -> bool:
        """Whether an evaluation is due, given whether a batch may be sent now (`credit`; call it once a pass).

        Due when the interval passed, when there was no credit for `IDLE_EVALUATION_SECONDS`, or when the training
        episodes' returns reach the target (at most every `TARGET_EVALUATION_SECONDS`, so the trainers see the
        target reached without waiting for the interval).
        """
        now = time.monotonic()
        self._idle_since = None if credit else (self._idle_since or now)
        idle = self._idle_since is not None and now - self._idle_since >= IDLE_EVALUATION_SECONDS
        returns = self.train_returns
        near_target = (
            self.target is not None and len(returns) == returns.maxlen
            and sum(returns) / len(returns) >= self.target and now >= self._next_target_check
        )  # fmt: skip
        return idle or now >= self._next_evaluation or near_target

    def evaluated(self) -> None:
        """A complete evaluation of the version held ended now."""
        self._next_evaluation = time.monotonic() + self.interval
        self._next_target_check = time.monotonic() + TARGET_EVALUATION_SECONDS


@_errors.reported
def main() -> int:
    """Entry point: read the environment and the manifest, evaluate until SIGTERM. An exception ends it with its
    type, message and where it was raised in `contract.ENV_ERROR_FILE` (a pod's termination message; `_errors`).

    Returns:
        int: 0 after SIGTERM; `contract.EXIT_BAD_MANIFEST` for a bad manifest or environment (including
            `ENV_ROLE` naming the trainer role).
    """
    logging.basicConfig(
        level=logging.INFO,
        format=f"%(asctime)s eval[{os.environ.get(contract.ENV_EVAL_ORDINAL, '?')}] "
        "%(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    try:
        settings = ProcessSettings.from_env()
        settings.require_role(contract.PolicyRole.EVAL)
        ordinal = eval_ordinal(os.environ)
        spec = validate_file(settings.spec_path).spec
    except (SettingsError, ManifestError) as error:
        for line in str(error).splitlines():
            log.error("%s", line)
        return contract.EXIT_BAD_MANIFEST
    return Evaluator(spec, settings, ordinal).run()


if __name__ == "__main__":
    _exit.exit_now(main())
