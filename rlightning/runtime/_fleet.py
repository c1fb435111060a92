"""Trainer rank 0's view of the evaluator fleet: who is registered, who holds the newest weights, what they report.

Everything goes through the `PolicyGroup` over the trainer's policy and its `WeightSender` (which assigns the
weight versions). The fleet whose evaluators must hold the final weights is the count the local launcher
passes in `ENV_EXPECTED_EVALUATORS`; pods have none (the operator keeps `eval.replicas` out of the mounted
spec), and there it is every evaluator registered with the sender once the membership is stable (`settle`).
Every wait here is bounded.
"""

from __future__ import annotations

import logging
import time

from rlightning import weights
from rlightning.policy import PolicyGroup
from rlightning.policy._consistency import Consistency
from rlightning.runtime import report

log = logging.getLogger("rlightning.train")

REPORT_POLL_SECONDS = 0.1
FLEET_REJOIN_SECONDS = 12.0
"""At start, how long rank 0 waits at most for the evaluators to (re-)register before training.

Covers two of the receivers' longest reconnect backoff steps (5 s, `rlightning.weights._store.Backoff`) plus
connection time; it ends early once the expected evaluators registered (`Fleet.settle`). They register with
the version they hold, so the first publish already goes above it (`WeightSender.publish`); one that registers
later with a newer version makes the next publish go above that.
"""
REPUBLISH_AFTER_SECONDS = 3.0
"""While the trainers wait for the fleet's data: how long before, and how often at most, rank 0 publishes again for
evaluators that registered after the newest publish (they produce nothing until they hold a version)."""
MEMBERSHIP_SETTLE_SECONDS = 2.0
"""In pods (no `ENV_EXPECTED_EVALUATORS`), the evaluators registered with the sender count as the fleet once
the membership has not changed for this long (`Fleet.settle`)."""


def final_consistency(consistency: Consistency, expected: int) -> tuple[bool | None, str | None]:
    """The run's final verdict: whether the expected evaluators hold the final version, bit for bit, and why not.

    Args:
        consistency (Consistency): The exact check of the live evaluators' reports (`Fleet.check`).
        expected (int): Evaluators that must hold the final version (`Fleet.expected_count`).

    Returns:
        tuple[bool | None, str | None]: (`consistent`, `consistent_reason`): None and `report.NOT_COMPARED` when no
            report was checked (no evaluator, or none on a remembered version); False and the reason when a
            report differs or fewer than `expected` evaluators hold the newest version; True and None otherwise.
    """
    if not consistency.checked:
        return None, report.NOT_COMPARED
    if consistency.mismatched:
        differ = {o: len(names) for o, names in sorted(consistency.mismatched.items())}
        return False, f"evaluators differ from the trainer (ordinal: tensors) {differ}"
    if len(consistency.on_latest) < expected:
        return False, f"{len(consistency.on_latest)} of {expected} evaluators hold the final version"
    return True, None


def mean(values: list[float]) -> float | None:
    """The mean of `values`, or None when empty."""
    return sum(values) / len(values) if values else None


def fleet_return(reports: dict[int, weights.ReceiverReport]) -> float | None:
    """The evaluators' mean of their recent returns (`eval_return`, whatever weights played them), or None."""
    return mean([r.metrics["eval_return"] for r in reports.values() if "eval_return" in r.metrics])


def oldest_return_version(reports: dict[int, weights.ReceiverReport]) -> int | None:
    """The oldest version any evaluator reported a full batch of episodes on (`return_version`), or None."""
    versions = [int(r.metrics["return_version"]) for r in reports.values() if "return_version" in r.metrics]
    return min(versions) if versions else None


class Fleet:
    """The evaluators as trainer rank 0 sees them through its `PolicyGroup` and `WeightSender`.

    Args:
        group (PolicyGroup): The handle over the trainer's policy, with the sender (`group.sender`).
        expected (int | None): `ENV_EXPECTED_EVALUATORS`; None in pods, where the live membership counts.

    Attributes:
        live (list[int]): Ordinals that acknowledged the newest publish.
        published_iteration (int): The training iteration of the newest publish (-1 before any).
    """

    def __init__(self, group: PolicyGroup, expected: int | None) -> None:
        assert group.sender is not None, "the fleet is reached through a WeightSender"
        self.group = group
        self.sender: weights.WeightSender = group.sender
        self.expected = expected
        self.live: list[int] = []
        self.published_iteration = -1
        self._published_at = time.monotonic()

    @property
    def version(self) -> int:
        """The newest weight version published (the sender's), or the one it resumed from."""
        return self.sender.version

    # -- membership ---------------------------------------------------------------------------------------
    def settle(self, timeout: float, need_one: bool = False) -> list[int]:
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

    def await_rejoin(self) -> None:
        """At start, wait up to `FLEET_REJOIN_SECONDS` for the evaluators to (re-)register with their versions.

        A trainer pod replaced without its run directory (an emptyDir) starts from version 0 while the
        evaluators hold newer ones and would refuse anything older; once they registered, the sender's first
        publish goes above them.
        """
        self.settle(FLEET_REJOIN_SECONDS, need_one=True)
        fleet = self.sender.fleet_version
        if fleet > self.version:
            log.warning("evaluators %s hold weight version %d, newer than this trainer's %d; publishing above it",
                        self.sender.members, fleet, self.version)

    # -- publishing and reports ---------------------------------------------------------------------------
    def publish(self, iteration: int) -> weights.SyncStats:
        """Publish the trainer's weights under the sender's next version; a failed group is logged, not raised.

        Args:
            iteration (int): The training iteration (for `published_iteration`).

        Returns:
            weights.SyncStats: The outcome (`failed` names the groups that did not get the version).
        """
        try:
            self.group.sync_weights()
        except weights.WeightSyncError:
            pass  # the stats name the failed groups; training goes on without them
        stats = self.group.last_sync_stats
        assert stats is not None
        if stats.failed:
            log.warning("weight sync of version %d failed for (group: ordinals) %s; training on without them",
                        stats.version, stats.failed)
        self.published_iteration = iteration
        self._published_at = time.monotonic()
        self.live = list(stats.receivers_acked)
        return stats

    def starving(self, waited: float) -> bool:
        """Whether to publish again while the trainers have waited `waited` seconds for data: evaluators registered
        after the newest publish hold no current version, and `REPUBLISH_AFTER_SECONDS` passed since then.
        """
        if waited < REPUBLISH_AFTER_SECONDS or time.monotonic() - self._published_at < REPUBLISH_AFTER_SECONDS:
            return False
        newcomers = set(self.sender.members) - set(self.live)
        if newcomers:
            log.info("evaluators %s registered after version %d; publishing again", sorted(newcomers), self.version)
        return bool(newcomers)

    def live_reports(self) -> dict[int, weights.ReceiverReport]:
        """Reports of the evaluators that acknowledged the newest publish."""
        return {o: r for o, r in self.sender.reports().items() if o in self.live}

    def check(self, reports: dict[int, weights.ReceiverReport], exact: bool) -> Consistency:
        """Check `reports` against what was sent (`PolicyGroup.check_reports`; `exact` adds the digests)."""
        return self.group.check_reports(reports, exact=exact)

    def evaluation_share(self, episodes: int) -> int:
        """Episodes each live evaluator plays of a version rank 0 confirms: `episodes` (`eval.episodesPerReport`)
        split over the fleet, rounded up, so the fleet together plays at least `episodes` in about the time of one
        (an evaluator behind a slow env gains nothing from stepping more env copies of its own).

        Args:
            episodes (int): Episodes the fleet plays together (>= 1).

        Returns:
            int: ceil(episodes / live evaluators); `episodes` with none live.
        """
        return -(-episodes // max(1, len(self.live)))

    def wait_for_newest(self, timeout: float, share: int) -> float | None:
        """Wait until every live evaluator reports at least `share` episodes played with the newest version.

        Args:
            timeout (float): Seconds to wait.
            share (int): Episodes each evaluator must report (`evaluation_share`); a report without
                `version_episodes` (an evaluator of an older release) counts as a full one.

        Returns:
            float | None: The mean return of all those episodes (each evaluator's mean weighted by its episodes),
                or None on timeout or with no evaluator.
        """
        version = self.version
        deadline = time.monotonic() + timeout
        while self.live:
            on_version = [
                (r.metrics["version_return"], r.metrics.get("version_episodes", share))
                for r in self.live_reports().values()
                if r.metrics.get("return_version") == version and "version_return" in r.metrics
            ]
            confirmed = [(ret, n) for ret, n in on_version if n >= share]
            if len(confirmed) == len(self.live):
                return sum(ret * n for ret, n in confirmed) / sum(n for _, n in confirmed)
            if time.monotonic() > deadline:
                log.warning("evaluators %s did not report %d episodes each on version %d within %.0f s",
                            sorted(self.live), share, version, timeout)
                return None
            time.sleep(REPORT_POLL_SECONDS)
        return None

    def close(self) -> None:
        """Close the weight sender (its store goes down with it)."""
        self.sender.close()
