"""`PolicyGroup`: a handle over one train policy and its evaluators, in process and/or behind a WeightSender.

It hands the trainer's weights to every evaluator under a new version, and checks that what the evaluators hold
equals what was sent (L2 fingerprints within `DEFAULT_RTOL`, and exact per-tensor digests), with the one check
of `rlightning.policy._consistency` (also what the trainer entrypoint's rank 0 uses, through this handle).
With a sender, the sender assigns the version (`WeightSender.publish`) and the group reads it; without one
(in-process evaluators only) the version is the trainer's plus one.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from rlightning import weights
from rlightning.policy import base_policy
from rlightning.policy._consistency import DEFAULT_RTOL, Consistency, VersionLedger

EVAL_APPLY_TIMEOUT_SECONDS = 60.0
"""How long `PolicyGroup.sync_weights` waits at most for each in-process evaluator to apply a version: its running
rollout finishes first, then the copy is loaded."""


class PolicyGroup:
    """A train policy, in-process evaluators and/or a remote evaluation fleet reached through a WeightSender.

    Args:
        train_policy (BasePolicy): The initialised trainer (its `weight_version` is the group's).
        eval_policies (Sequence[BasePolicy], optional): In-process evaluators (initialised). Defaults to ().
        sender (weights.WeightSender | None, optional): Publishes to the remote fleet (trainer rank 0 only).
            Defaults to None.

    Attributes:
        last_sync_stats (weights.SyncStats | None): What the last remote publish achieved.
        ledger (VersionLedger): Fingerprints and digests of the newest versions sent (`check_reports`).

    Raises:
        ValueError: When `sender` would publish below the trainer's `weight_version` (create it with
            `version=train_policy.weight_version` after a resume).
    """

    def __init__(
        self,
        train_policy: base_policy.BasePolicy,
        eval_policies: Sequence[base_policy.BasePolicy] = (),
        sender: weights.WeightSender | None = None,
    ) -> None:
        if sender is not None and sender.version < train_policy.weight_version:
            raise ValueError(
                f"sender.version {sender.version} is below the trainer's weight_version "
                f"{train_policy.weight_version}: create the WeightSender with version={train_policy.weight_version}"
            )
        self.train_policy = train_policy
        self.eval_policies = list(eval_policies)
        self.sender = sender
        self.last_sync_stats: weights.SyncStats | None = None
        self.ledger = VersionLedger()
        # In-process evaluator index -> what its last sync handed it, where that was cast to its own dtypes (a
        # bfloat16 evaluator): the reference it is checked against. Evaluators in the trainer's dtypes have none.
        self._cast_sent: dict[int, weights.WeightRecord] = {}

    @property
    def weight_version(self) -> int:
        """int: The trainer's weight version (the newest sent, as the sender assigned it; survives restarts
        through checkpoints).
        """
        return self.train_policy.weight_version

    def sync_weights(self, eval_timeout: float | None = EVAL_APPLY_TIMEOUT_SECONDS) -> int:
        """Send the trainer's current weights (`get_eval_weights()`) to every evaluator under a new weight version.

        The remote fleet gets them through `sender.publish`, which assigns the version (above the trainer's
        and above the newest one any evaluator holds); the trainer's `weight_version` becomes it. In-process
        evaluators then get a private copy in their own dtypes (one copy per distinct set of dtypes: a bfloat16
        evaluator gets the weights cast to bfloat16), staged with their update thread notified (or applied at
        once with buffer strategy `none`), and this returns once every one of them has applied the version, so
        the next rollout of any of them uses it. Nothing is copied or digested for the sender (it sends from the
        trainer's tensors); the ledger takes the fingerprint now and the digests when a check asks
        (`VersionLedger`).

        Args:
            eval_timeout (float | None, optional): Seconds to wait for each in-process evaluator to apply the
                version (its running rollout finishes first); None waits as long as it takes. Defaults to
                `EVAL_APPLY_TIMEOUT_SECONDS`.

        Returns:
            int: The new weight version.

        Raises:
            weights.WeightSyncError: When the remote publish did not reach every receiver (the version still
                counts as sent: in-process evaluators get it, and `last_sync_stats` holds the outcome).
            TimeoutError: When an in-process evaluator did not apply the version within `eval_timeout`.
            RuntimeError: When an in-process evaluator failed to apply it (its `weight_update_error` chained).
        """
        state = self.train_policy.get_eval_weights()
        failure: weights.WeightSyncError | None = None
        if self.sender is not None:
            try:
                self.last_sync_stats = self.sender.publish(state)
            except weights.WeightSyncError as error:
                self.last_sync_stats, failure = error.stats, error
            version = self.last_sync_stats.version
        else:
            version = self.train_policy.weight_version + 1
        # recorded before an evaluator is handed the version, so a check in between expects it; remote
        # evaluators hold floating tensors in `weightSync.dtype`: compare in it
        self.ledger.record(version, state, self.sender.config.dtype if self.sender is not None else None)
        self.train_policy.weight_version = version
        self._push_to_evaluators(version, state)
        self._wait_for_evaluators(version, eval_timeout)
        if failure is not None:
            raise failure
        return version

    def _push_to_evaluators(self, version: int, state: Mapping[str, torch.Tensor]) -> None:
        """Stage `state` as `version` in every in-process evaluator, copied into the evaluator's own dtypes.

        They keep what they are given, so each gets a copy, not the trainer's tensors; evaluators with the same
        dtypes share one.
        """
        trainer_dtypes = tuple(t.dtype for t in state.values())
        copies: dict[tuple[torch.dtype, ...], dict[str, torch.Tensor]] = {}
        cast_records: dict[tuple[torch.dtype, ...], weights.WeightRecord] = {}
        self._cast_sent.clear()
        for index, policy in enumerate(self.eval_policies):
            own = weights.named_state(policy)
            dtypes = tuple(own[name].dtype if name in own else t.dtype for name, t in state.items())
            copy = copies.get(dtypes)
            if copy is None:
                copy = copies[dtypes] = {
                    name: t.to(dtype=dtype, copy=True) for (name, t), dtype in zip(state.items(), dtypes, strict=True)
                }
                if dtypes != trainer_dtypes:  # one fingerprint and digest pass per cast copy, none otherwise
                    cast_records[dtypes] = weights.WeightRecord.of(version, copy)
            if dtypes in cast_records:
                self._cast_sent[index] = cast_records[dtypes]
            policy.push_weights(version, copy)

    def _wait_for_evaluators(self, version: int, timeout: float | None) -> None:
        """Return once every in-process evaluator holds `version` (or newer); raise naming those that do not."""
        for index, policy in enumerate(self.eval_policies):
            applied = policy.wait_for_weight_update_done(timeout)
            if policy.weight_update_error is not None:
                raise RuntimeError(
                    f"in-process evaluator local-{index} failed to apply weight version {version}"
                ) from policy.weight_update_error
            if not applied or policy.weight_version < version:
                raise TimeoutError(
                    f"in-process evaluator local-{index} did not apply weight version {version} within {timeout} s "
                    f"(it holds version {policy.weight_version})"
                )

    def check_reports(
        self,
        reports: Mapping[int, weights.ReceiverReport] | None = None,
        rtol: float = DEFAULT_RTOL,
        exact: bool = True,
    ) -> Consistency:
        """Check remote evaluators' reports against the version each one applied (any of the newest sent).

        Args:
            reports (Mapping[int, ReceiverReport] | None, optional): Ordinal -> report; defaults to every
                report of the sender (`sender.reports()`).
            rtol (float, optional): Relative tolerance of the fingerprints. Defaults to `DEFAULT_RTOL`.
            exact (bool, optional): Also compare digests where the trainer still holds the version's weights
                (digesting them once); False compares fingerprints only, a cheap check for every iteration.
                Defaults to True.

        Returns:
            Consistency: The verdict (`VersionLedger.check`).
        """
        if reports is None:
            reports = self.sender.reports() if self.sender is not None else {}
        return self.ledger.check(reports, rtol, exact)

    def wait_for_eval_weights(self, timeout: float | None = None) -> bool:
        """Wait until every in-process evaluator applied every update requested so far.

        Args:
            timeout (float | None, optional): Seconds to wait per evaluator. Defaults to None (forever).

        Returns:
            bool: True when all applied without error.
        """
        return all([policy.wait_for_weight_update_done(timeout) for policy in self.eval_policies])

    def _reference(self) -> weights.WeightRecord:
        latest = self.ledger.latest
        if latest is not None:
            return self.ledger.reference(latest, exact=True)  # type: ignore[return-value]
        return weights.WeightRecord.of(self.weight_version, self.train_policy.get_eval_weights())

    def eval_weight_mismatches(self, rtol: float = DEFAULT_RTOL) -> dict[str, list[str]]:
        """Compare every evaluator with the weights of the last sync (the trainer's current weights before any).

        In-process evaluators are named `local-<index>`, remote ones `eval-<ordinal>`: every receiver
        registered with the sender, checked against its newest report (a member that has not reported yet is
        a problem; reports of receivers that left are ignored). Digests are compared while the trainer still
        holds the weights of the last sync (`VersionLedger.reference`), fingerprints always. An in-process
        evaluator in other dtypes than the trainer's (bfloat16) is compared with the cast copy it was handed.

        Args:
            rtol (float, optional): Relative tolerance of the L2 fingerprints. Defaults to `DEFAULT_RTOL`.

        Returns:
            dict[str, list[str]]: Evaluator -> problems (wrong version, tensors whose fingerprint or digest
                differs); only evaluators with problems appear.
        """
        ref = self._reference()
        found: dict[str, weights.WeightRecord] = {}
        for index, policy in enumerate(self.eval_policies):
            found[f"local-{index}"] = weights.WeightRecord.of(policy.weight_version, weights.named_state(policy))
        problems: dict[str, list[str]] = {}
        if self.sender is not None:
            reports = self.sender.reports()  # also folds membership changes into `members`
            for ordinal in self.sender.members:
                report = reports.get(ordinal)
                if report is None:
                    problems[f"eval-{ordinal}"] = ["no report yet"]
                else:
                    found[f"eval-{ordinal}"] = report.applied
        for name, record in found.items():
            expected = ref
            if name.startswith("local-"):  # one handed a cast copy compares with that copy
                expected = self._cast_sent.get(int(name.removeprefix("local-")), ref)
            issues = []
            if record.version != expected.version:
                issues.append(f"weight version {record.version}, expected {expected.version}")
            bad = expected.mismatches(record, rtol)
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
