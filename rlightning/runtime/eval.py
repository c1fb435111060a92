"""Evaluator entrypoint: `python -m rlightning.runtime.eval`, one process per evaluator (a pod, or a local process).

The evaluator plays evaluation episodes without pause, always with the newest weights it holds. A background
thread receives versions from the trainer (`rlightning.weights.WeightReceiver`, which waits with backoff for
the trainer's store), stages them in the policy's buffer and asks the policy's update thread to apply them
between forward passes; once applied it reports the version with its fingerprint and digest, so the trainer
can check them. After every `eval.episodesPerReport` episodes the main thread reports:

- `eval_return`: mean return of the last `episodesPerReport` episodes (whatever weights played them);
- `return_version` and `version_return`: when the last `episodesPerReport` episodes were each played
  entirely with the version now applied, that version and their mean (what the trainer's target check uses);
- `episodes`: episodes finished since start.

With `policy.weightBuffer.bufferStrategy: none` there is no update thread: `BasePolicy.push_weights`
applies the version at once, still never during a forward pass (it waits for running rollouts to drain).

SIGTERM (pod deletion, `rlightning run` stopping) ends the current episode, waits at most
`SHUTDOWN_JOIN_SECONDS` for the receiving thread, leaves the weight-sync group and exits 0: well within the
pod's terminationGracePeriodSeconds (weightSync.timeoutSeconds + 15 s, set by the operator).
"""

from __future__ import annotations

import collections
import logging
import os
import sys
import threading

from rlightning import contract, weights
from rlightning.config import ManifestError, PolicyGroupSpec
from rlightning.policy import EnvMeta, PolicyRole, build_policy
from rlightning.runtime import collector
from rlightning.runtime._prometheus import EvaluatorMetrics
from rlightning.runtime._signals import StopRequest
from rlightning.runtime.settings import ProcessSettings, SettingsError, eval_ordinal
from rlightning.runtime.validate import validate_file

log = logging.getLogger("rlightning.eval")

RECEIVE_POLL_SECONDS = 1.0
"""How long one `receive` call waits for an announcement before the thread checks for a stop."""
APPLY_TIMEOUT_SECONDS = 60.0
"""Bound on waiting for the update thread to apply a staged version (buffer strategy `single`)."""
SHUTDOWN_JOIN_SECONDS = 3.0
"""Bound on waiting for the receiving thread at shutdown; a receive still running past it is abandoned (the
thread is a daemon) so the clean `leave` is posted within the pod's grace period."""
SEED_STRIDE = 1_000_003
"""Evaluator `o` plays episode `i` with seed `train.seed + SEED_STRIDE * (o + 1) + i`."""


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
        self.stop = StopRequest()
        self.policy = build_policy(spec.policy, PolicyRole.EVAL)
        self.policy.init_eval(EnvMeta.from_env_config(spec.env), seed=spec.train.seed + ordinal)
        self.receiver = weights.WeightReceiver(
            spec.weight_sync, settings.master_addr, settings.weight_sync_port, ordinal
        )
        self.metrics = EvaluatorMetrics(settings.metrics_port)
        self._lock = threading.Lock()
        self._applied_record: weights.WeightRecord | None = None  # what the policy holds, as last reported
        self._report: dict[str, float] = {}
        self._applied = threading.Event()

    # -- receiving thread ---------------------------------------------------------------------------------
    def _receive_loop(self) -> None:
        while not self.stop.requested:
            got = self.receiver.receive(RECEIVE_POLL_SECONDS)
            if got is None:
                continue
            version, state = got
            # The gated API: staged for the update thread (`single`), or applied now between forward passes
            # (`none`, which has no update thread to wait for).
            if not self.policy.push_weights(version, state):
                continue
            if self.policy.weight_buffer_strategy == "single" and not self.policy.wait_for_weight_update_done(
                APPLY_TIMEOUT_SECONDS
            ):
                log.warning("version %d was not applied: %s", version, self.policy.weight_update_error)
                continue
            # Only this thread asks for updates, so the weights stay put while they are digested.
            record = weights.WeightRecord.of(self.policy.weight_version, weights.named_state(self.policy))
            with self._lock:
                self._applied_record = record
            self._applied.set()
            self.metrics.weight_version.set(record.version)
            self._post()

    def _post(self) -> None:
        with self._lock:
            record, report = self._applied_record, dict(self._report)
        if record is not None:
            self.receiver.report(record, report)

    # -- main loop --------------------------------------------------------------------------------------------
    def run(self) -> int:
        """Receive in the background and evaluate until SIGTERM.

        Returns:
            int: The exit code (0).
        """
        thread = threading.Thread(target=self._receive_loop, name="weight-receiver", daemon=True)
        thread.start()
        log.info("evaluator %d waiting for the first weights", self.ordinal)
        while not self.stop.requested and not self._applied.wait(0.5):
            pass
        n = self.spec.eval.episodes_per_report
        recent: collections.deque[float] = collections.deque(maxlen=n)
        pure: list[float] = []  # returns of episodes played entirely with `pure_version`
        pure_version, episode = -1, 0
        base_seed = self.spec.train.seed + SEED_STRIDE * (self.ordinal + 1)
        while not self.stop.requested:
            before = self.policy.weight_version
            (ret,) = collector.evaluate_episodes(
                self.policy, self.spec.env, 1, deterministic=self.spec.eval.deterministic, seed=base_seed + episode
            )
            after = self.policy.weight_version
            episode += 1
            self.metrics.episodes.inc()
            recent.append(ret)
            if after != pure_version:
                pure_version, pure = after, []
            if before == after:
                pure.append(ret)
            if episode % n == 0 or len(pure) == n:
                report = {"eval_return": sum(recent) / len(recent), "episodes": float(episode)}
                if len(pure) >= n:
                    report.update(return_version=float(pure_version), version_return=sum(pure[-n:]) / n)
                with self._lock:
                    self._report = report
                self.metrics.eval_return.set(report["eval_return"])
                self._post()
        log.info("evaluator %d stopping on %s after %d episodes", self.ordinal, self.stop.signal_name, episode)
        thread.join(SHUTDOWN_JOIN_SECONDS)
        if thread.is_alive():
            log.warning("evaluator %d: a weight receive still runs after %.0f s; leaving without it",
                        self.ordinal, SHUTDOWN_JOIN_SECONDS)
        self.receiver.close()
        self.policy.close()
        return 0


def main() -> int:
    """Entry point: read the environment and the manifest, evaluate until SIGTERM.

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
    sys.exit(main())
