"""When training stops: a pure decision over a few numbers (no I/O, no clock), tested as a table of cases.

Training stops when any rank is interrupted, when `train.totalEnvSteps` is reached, or when the evaluators' return
reaches `train.targetEvalReturn` on the newest weights. The last is confirmed, not read off the fleet's recent mean
(played with whatever weights each evaluator held): when that mean, or the mean return of the latest training episodes
(`RecentReturns`: the fleet's data, at least `eval.episodesPerReport` episodes), reaches the target, rank 0 holds
training until every live evaluator reports a full batch on the newest version (`confirmation_due`), and stops only if
that batch's mean reaches the target; after a shortfall it asks again `RETRY_TARGET_AFTER_ITERATIONS` iterations later.
"""

from __future__ import annotations

import collections
import dataclasses
import enum

RETRY_TARGET_AFTER_ITERATIONS = 5
"""After a confirmation falls short of the target, iterations before the next one."""


class StopReason(enum.IntEnum):
    """Why training stopped. Values order precedence: the ranks agree with one MAX all-reduce, so the most
    urgent reason any rank has wins; `label` is the name summary.json uses.
    """

    TOTAL_ENV_STEPS = 1
    TARGET_EVAL_RETURN = 2
    INTERRUPTED = 3

    @property
    def label(self) -> str:
        """`total_env_steps`, `target_eval_return` or `interrupted`."""
        return self.name.lower()


@dataclasses.dataclass(frozen=True)
class StopInputs:
    """What the stop decision looks at after one training iteration.

    Attributes:
        iteration (int): Training iterations done.
        env_steps (int): Environment steps done, summed over ranks.
        total_env_steps (int): `train.totalEnvSteps`.
        target_eval_return (float | None): `train.targetEvalReturn`; None never stops on a return.
        fleet_return (float | None): The evaluators' mean return of their recent episodes, whatever weights
            played them; None before any report.
        confirmed_return (float | None, optional): Their mean return on the newest weights, once confirmed
            (`confirmation_due`); None when not confirmed. Defaults to None.
        last_shortfall (int | None, optional): The iteration of the last confirmation that fell short of the
            target, or None. Defaults to None.
        interrupted (bool, optional): A signal asked this rank to stop. Defaults to False.
        train_return (float | None, optional): Mean return of the latest training episodes (`RecentReturns`), or
            None before enough finished; reaching the target also asks for a confirmation. Defaults to None.
    """

    iteration: int
    env_steps: int
    total_env_steps: int
    target_eval_return: float | None
    fleet_return: float | None
    confirmed_return: float | None = None
    last_shortfall: int | None = None
    interrupted: bool = False
    train_return: float | None = None


def confirmation_due(inputs: StopInputs) -> bool:
    """Whether to hold training and confirm the target on the newest weights now.

    Args:
        inputs (StopInputs): This iteration's inputs (`confirmed_return` is ignored).

    Returns:
        bool: True when nothing else stops the run, the fleet's recent evaluation or training return reached the
            target and no
            shortfall happened within the last `RETRY_TARGET_AFTER_ITERATIONS` iterations.
    """
    target = inputs.target_eval_return
    return (
        not inputs.interrupted
        and inputs.env_steps < inputs.total_env_steps
        and target is not None
        and max(r if r is not None else float("-inf") for r in (inputs.fleet_return, inputs.train_return)) >= target
        and (inputs.last_shortfall is None or inputs.iteration >= inputs.last_shortfall + RETRY_TARGET_AFTER_ITERATIONS)
    )


def decide(inputs: StopInputs) -> StopReason | None:
    """Whether to stop after this iteration, and why.

    Args:
        inputs (StopInputs): This iteration's inputs.

    Returns:
        StopReason | None: The most urgent reason that holds (`INTERRUPTED`, then `TOTAL_ENV_STEPS`, then
            `TARGET_EVAL_RETURN` when `confirmed_return` reached the target), or None to go on.

    Examples:
        >>> decide(StopInputs(3, 1_000, 1_000, None, None))
        <StopReason.TOTAL_ENV_STEPS: 1>
    """
    if inputs.interrupted:
        return StopReason.INTERRUPTED
    if inputs.env_steps >= inputs.total_env_steps:
        return StopReason.TOTAL_ENV_STEPS
    target = inputs.target_eval_return
    if target is not None and inputs.confirmed_return is not None and inputs.confirmed_return >= target:
        return StopReason.TARGET_EVAL_RETURN
    return None


class RecentReturns:
    """Mean return of the most recent training episodes, over at least `episodes` of them.

    Fed per iteration with the sum and count of the episodes that finished in it (all ranks), it keeps the fewest
    latest iterations that hold `episodes` episodes.

    Args:
        episodes (int): Episodes the mean needs (`eval.episodesPerReport`, as an evaluation report).

    Examples:
        >>> recent = RecentReturns(5)
        >>> recent.add(1500.0, 3); recent.mean() is None
        True
        >>> recent.add(1000.0, 2); recent.mean()
        500.0
    """

    def __init__(self, episodes: int) -> None:
        self.episodes = episodes
        self._sums: collections.deque[tuple[float, int]] = collections.deque()

    def add(self, total: float, count: int) -> None:
        """Count one iteration's finished episodes: their summed return `total` and their number `count`."""
        if count:
            self._sums.append((total, count))
        while len(self._sums) > 1 and sum(n for _, n in self._sums) - self._sums[0][1] >= self.episodes:
            self._sums.popleft()

    def mean(self) -> float | None:
        """The mean return, or None while fewer than `episodes` episodes finished."""
        count = sum(n for _, n in self._sums)
        return sum(total for total, _ in self._sums) / count if count >= self.episodes else None
