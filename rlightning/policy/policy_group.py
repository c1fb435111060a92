"""`PolicyGroup`: a handle over one train policy and its evaluators, in process and/or behind a WeightSender.

It bumps the weight version, hands the weights to every evaluator, and checks that what the evaluators hold
equals what was sent (L2 fingerprints within `DEFAULT_RTOL`, and exact per-tensor digests), with the one check
of `rlightning.policy._consistency` (also what the trainer entrypoint's rank 0 uses, through this handle).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

from rlightning import weights
from rlightning.policy import base_policy
from rlightning.policy._consistency import DEFAULT_RTOL, Consistency, VersionLedger, weight_mismatches


@dataclasses.dataclass(frozen=True)
class SyncedWeights:
    """What the last `sync_weights` sent: the reference evaluators are compared with.

    Attributes:
        version (int): The weight version.
        fingerprint (dict[str, float]): `l2_fingerprint` of the weights sent.
        digests (dict[str, str]): `tensor_digests` of the weights sent.
    """

    version: int
    fingerprint: dict[str, float]
    digests: dict[str, str]


class PolicyGroup:
    """A train policy, in-process evaluators and/or a remote evaluation fleet reached through a WeightSender.

    Args:
        train_policy (BasePolicy): The initialised trainer (its `weight_version` is the group's).
        eval_policies (Sequence[BasePolicy], optional): In-process evaluators (initialised). Defaults to ().
        sender (weights.WeightSender | None, optional): Publishes to the remote fleet (trainer rank 0 only).
            Defaults to None.

    Attributes:
        last_sync_stats (weights.SyncStats | None): What the last remote publish achieved.
        ledger (VersionLedger): Digests and fingerprints of the newest versions sent (`check_reports`).
    """

    def __init__(
        self,
        train_policy: base_policy.BasePolicy,
        eval_policies: Sequence[base_policy.BasePolicy] = (),
        sender: weights.WeightSender | None = None,
    ) -> None:
        self.train_policy = train_policy
        self.eval_policies = list(eval_policies)
        self.sender = sender
        self.last_sync_stats: weights.SyncStats | None = None
        self._synced: SyncedWeights | None = None
        self.ledger = VersionLedger()

    @property
    def weight_version(self) -> int:
        """int: The trainer's weight version (the newest sent; survives restarts through checkpoints)."""
        return self.train_policy.weight_version

    def sync_weights(self) -> int:
        """Send the trainer's current weights to every evaluator under a new weight version.

        In-process evaluators get the weights staged and their update thread notified (or applied at once
        with buffer strategy `none`); the remote fleet gets them through `sender.publish`. The new version is
        above both the trainer's and the newest one the remote fleet holds (`sender.fleet_version`), so a
        trainer restarted without its checkpoint is not refused by evaluators holding newer versions.

        The sender may publish above the version asked for (an evaluator registered meanwhile with a newer
        one); the version it published becomes the group's.

        Returns:
            int: The new weight version.

        Raises:
            weights.WeightSyncError: When the remote publish did not reach every receiver (in-process
                evaluators are updated first, and `last_sync_stats` holds the publish's outcome).
        """
        floor = self.sender.fleet_version if self.sender is not None else 0
        version = max(self.train_policy.weight_version, floor) + 1
        state = {name: tensor.clone() for name, tensor in weights.named_state(self.train_policy).items()}
        fingerprint, digests = weights.l2_fingerprint(state), weights.tensor_digests(state)
        for policy in self.eval_policies:
            policy.push_weights(version, state)
        failure: weights.WeightSyncError | None = None
        if self.sender is not None:
            try:
                self.last_sync_stats = self.sender.publish(state, version)
            except weights.WeightSyncError as error:
                self.last_sync_stats, failure = error.stats, error
            version = self.last_sync_stats.version
        self._synced = SyncedWeights(version, fingerprint, digests)
        self.ledger.record(version, digests, fingerprint)
        self.train_policy.weight_version = version
        if failure is not None:
            raise failure
        return version

    def check_reports(
        self, reports: Mapping[int, weights.ReceiverReport] | None = None, rtol: float = DEFAULT_RTOL
    ) -> Consistency:
        """Check remote evaluators' reports against the version each one applied (any of the newest sent).

        Args:
            reports (Mapping[int, ReceiverReport] | None, optional): Ordinal -> report; defaults to every
                report of the sender (`sender.reports()`).
            rtol (float, optional): Relative tolerance of the fingerprints. Defaults to `DEFAULT_RTOL`.

        Returns:
            Consistency: The verdict (`VersionLedger.check`).
        """
        if reports is None:
            reports = self.sender.reports() if self.sender is not None else {}
        return self.ledger.check(reports, rtol)

    def wait_for_eval_weights(self, timeout: float | None = None) -> bool:
        """Wait until every in-process evaluator applied every update requested so far.

        Args:
            timeout (float | None, optional): Seconds to wait per evaluator. Defaults to None (forever).

        Returns:
            bool: True when all applied without error.
        """
        return all([policy.wait_for_weight_update_done(timeout) for policy in self.eval_policies])

    def _reference(self) -> SyncedWeights:
        if self._synced is not None:
            return self._synced
        state = weights.named_state(self.train_policy)
        return SyncedWeights(self.weight_version, weights.l2_fingerprint(state), weights.tensor_digests(state))

    def eval_weight_mismatches(self, rtol: float = DEFAULT_RTOL) -> dict[str, list[str]]:
        """Compare every evaluator with the weights of the last sync (the trainer's current weights before any).

        In-process evaluators are named `local-<index>`, remote ones `eval-<ordinal>`: every receiver
        registered with the sender, checked against its newest report (a member that has not reported yet is
        a problem; reports of receivers that left are ignored).

        Args:
            rtol (float, optional): Relative tolerance of the L2 fingerprints. Defaults to `DEFAULT_RTOL`.

        Returns:
            dict[str, list[str]]: Evaluator -> problems (wrong version, tensors whose fingerprint or digest
                differs); only evaluators with problems appear.
        """
        ref = self._reference()
        found: dict[str, tuple[int, dict[str, float], dict[str, str] | None]] = {}
        for index, policy in enumerate(self.eval_policies):
            found[f"local-{index}"] = (
                policy.weight_version, policy.get_param_fingerprint(), policy.get_param_digests()
            )
        problems: dict[str, list[str]] = {}
        if self.sender is not None:
            reports = self.sender.reports()  # also folds membership changes into `members`
            for ordinal in self.sender.members:
                report = reports.get(ordinal)
                if report is None:
                    problems[f"eval-{ordinal}"] = ["no report yet"]
                else:
                    found[f"eval-{ordinal}"] = (report.applied_version, report.fingerprint, report.digest or None)
        for name, (version, fingerprint, digests) in found.items():
            issues = []
            if version != ref.version:
                issues.append(f"weight version {version}, expected {ref.version}")
            bad = weight_mismatches(ref.digests, ref.fingerprint, digests, fingerprint, rtol)
            if bad:
                issues.append(f"fingerprint or digest differs for {bad}")
            if issues:
                problems[name] = issues
        return problems

    def verify_eval_weight_consistency(self, rtol: float = DEFAULT_RTOL) -> bool:
        """Whether every evaluator holds the weights of the last sync (see `eval_weight_mismatches`).

        Args:
            rtol (float, optional): Relative tolerance of the L2 fingerprints. Defaults to `DEFAULT_RTOL`.

        Returns:
            bool: True when no evaluator differs (also when there are none).
        """
        return not self.eval_weight_mismatches(rtol)

    def save_checkpoint(self, path: str | os.PathLike[str]) -> Path:
        """Checkpoint the trainer (weights, optimizer, counters, RNG, weight version).

        Args:
            path (str | os.PathLike[str]): Destination file.

        Returns:
            Path: The path written.
        """
        return self.train_policy.save_checkpoint(path)
