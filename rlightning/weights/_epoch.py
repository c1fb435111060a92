"""The order of publishes across trainer attempts: what a receiver does with one (pure, no I/O).

A publish carries its sender's epoch, its trainer attempt's (`contract.train_epoch`): the operator starts
attempt N+1 only after giving up on attempt N, so a sender of an epoch below one a receiver has seen is a pod of an
older attempt that came back (a partition healed), a zombie, and its weights must never be used. Within an epoch
versions only go up; across epochs the newer epoch wins whatever its version (the order is lexicographic on
`(epoch, version)`), so a new attempt's first publish is taken even if its version were not above the fleet's.
torchrun's own restarts (`TORCHELASTIC_RESTART_COUNT`) are not part of the epoch: trainer pods run it with
`--max-restarts=0`, so the count is always 0 (a failed worker fails the pod and the operator starts a new attempt).
"""

from __future__ import annotations

import enum


class Verdict(enum.StrEnum):
    """What a receiver does with a publish."""

    APPLY = "apply"
    """Newer than what it holds, of an epoch not below the highest it has seen."""
    IGNORE = "ignore"
    """Of the epoch it holds, at a version not above the one it holds (not a failure)."""
    REFUSE = "refuse"
    """Of an epoch below the highest it has seen: a zombie's publish, never applied."""


def judge(seen_epoch: int, held: tuple[int, int], published: tuple[int, int]) -> Verdict:
    """Judge one publish.

    Args:
        seen_epoch (int): The highest epoch the receiver has seen in any announcement (or applied), before this one.
        held (tuple[int, int]): `(epoch, version)` of the weights it holds (`(0, 0)` before the first).
        published (tuple[int, int]): `(epoch, version)` of the publish.

    Returns:
        Verdict: `REFUSE` when the publish's epoch is below `seen_epoch`; else `APPLY` when `published > held`
        lexicographically; else `IGNORE`.

    Examples:
        >>> judge(1, (1, 5), (0, 9)), judge(0, (0, 7), (1, 2)), judge(1, (1, 5), (1, 5))
        (<Verdict.REFUSE: 'refuse'>, <Verdict.APPLY: 'apply'>, <Verdict.IGNORE: 'ignore'>)
    """
    if published[0] < seen_epoch:
        return Verdict.REFUSE
    return Verdict.APPLY if published > held else Verdict.IGNORE
