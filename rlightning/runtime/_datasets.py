"""Where each training iteration's dataset comes from: the rank's own vector env, or the evaluators' batches.

Both sources give every rank a `[T, N']` TensorDict of the same shape each iteration (DDP's ranks must run the
same number of minibatch steps): `[rolloutSteps, env.numEnvs]` collected by the rank itself, or
`train.batchesPerUpdate` evaluator batches of `[rolloutSteps, env.numEnvs]` joined along the env dimension.

Each source owns what differs between the two modes, so the trainer loop never asks which one it has: whether
rank 0 publishes after every update (`publishes_every_update`), the fleet's totals at the end (`totals`), pulling an
evaluator's weights for a restart without a checkpoint (`pull_weights`) and asking for an evaluation
(`ask_evaluation`). `open_source` picks the source from `ENV_FLEET_DATA` (`ProcessSettings.fleet_data`), and
`open_sink` the evaluators' side of the same mode (where their batches go): the one place the runtime reads it.

With the fleet, the ranks wait for their batches together: each rank fills its own intake for at most
`FLEET_POLL_SECONDS`, then one MAX all-reduce tells every rank whether any is still short, whether any was asked to
stop, and the newest weight version (rank 0 may publish again while the ranks wait, for evaluators that joined after
the last publish). So a rank never sits in a DDP collective while another waits for data, a fleet with no live
evaluator pauses training without a hang, and SIGTERM is honoured within one poll.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from tensordict import TensorDict

from rlightning import trajectories
from rlightning.config import PolicyGroupSpec
from rlightning.policy import BasePolicy
from rlightning.policy._experience import check_batch
from rlightning.runtime import collector as collector_mod
from rlightning.runtime._collective import all_reduce
from rlightning.runtime._signals import StopRequest
from rlightning.runtime.settings import ProcessSettings

log = logging.getLogger("rlightning.train")

FLEET_POLL_SECONDS = 1.0
"""Longest a rank fills its intake before the ranks compare notes (and a stop request is seen)."""


@dataclass(frozen=True)
class FleetTotals:
    """What the ranks' intakes took from the fleet over the run, summed over ranks.

    Attributes:
        by_evaluator (dict[int, int]): Env steps trained on per evaluator ordinal.
        by_rank (list[int]): Env steps trained on per rank.
        accepted (int): Batches trained on.
        stale (int): Batches dropped as older than `train.maxPolicyLag`.
        invalid (int): Batches dropped as malformed or not of the policy's layout.
        older_attempt (int): Batches dropped as acted with an older trainer attempt's weights. Defaults to 0.
    """

    by_evaluator: dict[int, int]
    by_rank: list[int]
    accepted: int
    stale: int
    invalid: int
    older_attempt: int = 0


@dataclass
class Dataset:
    """One rank's data for one update.

    Attributes:
        batch (TensorDict): `[T, N']` experience with the policy's `experience_fields()`.
        episode_returns (list[float]): Returns of the episodes that finished inside it.
        lags (list[int]): Policy lag of each fleet batch in it, in weight versions (empty without the fleet).
        wait_seconds (float): Seconds this rank waited for it (collecting, or waiting for the fleet).
        version (int): The newest weight version when the dataset was complete (rank 0's, on every rank).
    """

    batch: TensorDict
    episode_returns: list[float]
    lags: list[int] = field(default_factory=list)
    wait_seconds: float = 0.0
    version: int = 0


class OwnExperience:
    """The rank steps its own `env.numEnvs` env copies (no evaluators produce data).

    Args:
        spec (PolicyGroupSpec): The validated spec.
        policy (BasePolicy): The rank's initialised policy.
        seed (int): Seeds the env copies.
    """

    publishes_every_update = False
    """Rank 0 publishes every `weightSync.intervalIterations` updates: the evaluators only play the weights."""

    def __init__(self, spec: PolicyGroupSpec, policy: BasePolicy, seed: int) -> None:
        self.steps = spec.train.rollout_steps
        self.collector = collector_mod.RolloutCollector(spec.env, policy, seed=seed)

    def next(self, version: int, stop: StopRequest, on_wait: Callable[[float], int]) -> Dataset | None:
        """Collect `[rolloutSteps, env.numEnvs]` with the rank's current weights (`stop` and `on_wait` unused)."""
        started, finished = time.monotonic(), self.collector.episodes_finished
        batch = self.collector.collect(self.steps)
        returns = list(self.collector.finished_since(finished).returns)
        return Dataset(batch, returns, wait_seconds=time.monotonic() - started, version=version)

    def dropped_batches(self) -> int:
        """Batches dropped since start: none, the rank collects what it trains on."""
        return 0

    def ask_evaluation(self, version: int, episodes: int) -> None:
        """Nothing to ask: evaluators that produce no data play evaluation episodes without pause."""

    def pull_weights(self, version: int, timeout: float) -> trajectories.HeldWeights | None:
        """Nothing to pull over: the evaluators send no trajectories (logged as a warning).

        Returns:
            None: Training starts from fresh weights, versions continuing above `version`.
        """
        log.warning("no checkpoint to resume and the evaluators hold weight version %d, but they send no trajectories "
                    "(spec.train.dataSource: trainers), so their weights cannot be pulled: training starts from fresh "
                    "weights, versions continuing above %d", version, version)
        return None

    def totals(self) -> FleetTotals | None:
        """None: the rank collected its own data."""
        return None

    def close(self) -> None:
        """Close the env copies."""
        self.collector.close()


class FleetExperience:
    """The rank trains on the evaluators' batches, received by its `trajectories.TrajectoryIntake`.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        policy (BasePolicy): The rank's initialised policy (its `experience_fields()` judge every batch).
        port (int): This rank's intake port (`ports.trajectories` + local rank).
        bind_host (str | None, optional): The address the intake binds (`ProcessSettings.bind_host`); None: all
            interfaces. Defaults to None.
        epoch (int, optional): The gang's attempt: batches acted with an older attempt's weights are dropped
            (`TrajectoryIntake`). Defaults to 0.

    Raises:
        OSError: The port cannot be bound (naming it).
    """

    publishes_every_update = True
    """Rank 0 publishes after every update: the evaluators collect the next batches with the newest weights."""

    def __init__(
        self, spec: PolicyGroupSpec, policy: BasePolicy, port: int, bind_host: str | None = None, epoch: int = 0
    ) -> None:
        self.count = spec.train.batches_per_update
        self.max_policy_lag = spec.train.max_policy_lag
        fields = policy.experience_fields()
        size = (spec.train.rollout_steps, spec.env.num_envs)
        self.intake = trajectories.TrajectoryIntake(
            port, validate=lambda batch: check_batch(batch, fields, size), bind_host=bind_host or "*", epoch=epoch
        )

    def next(self, version: int, stop: StopRequest, on_wait: Callable[[float], int]) -> Dataset | None:
        """Wait, with the other ranks, until every rank holds `train.batchesPerUpdate` batches young enough.

        Every rank must call this at the same time (it runs all-reduces on the default group).

        Args:
            version (int): The newest weight version published.
            stop (StopRequest): This process's stop request.
            on_wait (Callable[[float], int]): Called on every poll with the seconds waited so far; returns the
                newest weight version (rank 0 may publish again; other ranks return `version` unchanged).

        Returns:
            Dataset | None: This rank's dataset, or None when any rank was asked to stop.
        """
        started = time.monotonic()
        while True:
            held = self.intake.fill(self.count, version, self.max_policy_lag, FLEET_POLL_SECONDS)
            latest = on_wait(time.monotonic() - started)
            missing, interrupted, version_now = all_reduce(
                [0.0 if held else 1.0, 1.0 if stop.requested else 0.0, float(latest)], dist.ReduceOp.MAX
            )
            version = int(version_now)
            if interrupted:
                return None
            if not missing:
                break
        batches = self.intake.drain()
        returns = [r for _, stamp in batches for r in stamp.episode_returns]
        lags = [max(0, version - stamp.version) for _, stamp in batches]
        joined = TensorDict.cat([batch for batch, _ in batches], dim=1)  # along the env dimension
        return Dataset(joined, returns, lags, time.monotonic() - started, version)

    def pull_weights(self, version: int, timeout: float) -> trajectories.HeldWeights | None:
        """Ask the evaluators connected to this rank's intake for their weights (`TrajectoryIntake.pull_weights`);
        none answering is logged as a warning.

        Args:
            version (int): The fleet's newest weight version; the first evaluator holding it ends the pull.
            timeout (float): Seconds to wait at most.

        Returns:
            trajectories.HeldWeights | None: The weights of an evaluator holding `version` (else the newest any
            evaluator answered with), or None when none answered with weights.
        """
        log.info("no checkpoint to resume: pulling weight version %d from the evaluators (at most %.0f s)",
                 version, timeout)
        held = self.intake.pull_weights(version, timeout)
        if held is None:
            log.warning("no evaluator answered the pull of weight version %d within %.0f s: training starts from fresh "
                        "weights, versions continuing above %d", version, timeout, version)
        return held

    def ask_evaluation(self, version: int, episodes: int) -> None:
        """Ask the evaluators this rank's intake knows to play `episodes` episodes each of `version` now
        (`TrajectoryIntake.ask_evaluation`).
        """
        self.intake.ask_evaluation(version, episodes)

    def dropped_batches(self) -> int:
        """Batches this rank's intake dropped since start (too old for `train.maxPolicyLag`, invalid, or acted with an
        older trainer attempt's weights).
        """
        stats = self.intake.stats
        return stats.stale + stats.invalid + stats.older_attempt

    def env_steps_by_evaluator(self) -> dict[int, int]:
        """Env steps of accepted batches per evaluator ordinal, on this rank, since start."""
        return dict(collections.Counter(self.intake.stats.env_steps))

    def totals(self) -> FleetTotals:
        """The fleet's totals gathered from every rank; every rank must call this at the same time."""
        stats = self.intake.stats
        gathered: list[tuple[dict[int, int], int, int, int, int] | None] = [None] * dist.get_world_size()
        dist.all_gather_object(
            gathered, (self.env_steps_by_evaluator(), stats.accepted, stats.stale, stats.invalid, stats.older_attempt)
        )
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
            older_attempt=sum(rank[4] for rank in ranks),
        )

    def close(self) -> None:
        """Close the intake."""
        self.intake.close()


Source = OwnExperience | FleetExperience


def open_source(spec: PolicyGroupSpec, policy: BasePolicy, settings: ProcessSettings, seed: int) -> Source:
    """This rank's data source: the fleet's batches when the evaluators produce the data (`ENV_FLEET_DATA`), else
    the rank's own env copies.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        policy (BasePolicy): The rank's initialised policy (resumed: its iteration seeds its own env copies).
        settings (ProcessSettings): The process environment (`fleet_data`, the local rank, the bind address,
            the epoch).
        seed (int): This rank's seed (`train.seed` + rank).

    Returns:
        Source: The source.

    Raises:
        OSError: The rank's intake port (`ports.trajectories` + local rank) cannot be bound.
    """
    if settings.fleet_data:
        return FleetExperience(spec, policy, spec.ports.trajectories + settings.torchrun.local_rank,
                               settings.bind_host, epoch=settings.epoch)  # fmt: skip
    return OwnExperience(spec, policy, seed=seed + dist.get_world_size() * policy.iteration)


def open_sink(
    settings: ProcessSettings,
    ordinal: int,
    *,
    batch_credits: int,
    ack_timeout: float,
    held_weights: Callable[[], tuple[int, dict[str, torch.Tensor]]],
) -> trajectories.TrajectorySender | None:
    """Where an evaluator's batches go: the trainer ranks' intakes when the evaluators produce the data
    (`ENV_FLEET_DATA`), else nowhere (the evaluator only plays evaluation episodes).

    Args:
        settings (ProcessSettings): The process environment (`fleet_data`, `trajectory_endpoints`).
        ordinal (int): The evaluator's stable ordinal.
        batch_credits (int): Batches it may have sent and not yet had acknowledged.
        ack_timeout (float): Seconds a rank may take to acknowledge a batch.
        held_weights (Callable[[], tuple[int, dict[str, torch.Tensor]]]): The version and weights it holds, for a
            restarted trainer gang that pulls them (`TrajectorySender`).

    Returns:
        trajectories.TrajectorySender | None: The sender, or None when the trainers collect their own data.
    """
    if not settings.fleet_data:
        return None
    return trajectories.TrajectorySender(
        settings.trajectory_endpoints,
        ordinal,
        credits=batch_credits,
        ack_timeout=ack_timeout,
        held_weights=held_weights,
    )
