"""Who receives: the membership log in the store and the pure planning of groups (relay trees, `_topology`) from it.

Receivers append `Join`/`Leave` messages (`_messages`; by ordinal, with a fresh session id per join) to a log in
the store; the sender folds them into `Membership` before each publish. Groups are fixed by ordinal (group g holds
ordinals [g * group_size, (g + 1) * group_size)), so a change re-forms only the group it falls in.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Member:
    """One registered receiver.

    Attributes:
        ordinal (int): stable ordinal (StatefulSet ordinal in a cluster).
        session (str): id of this registration; a restarted or re-registered receiver has a new one.
        cuda (bool): whether the receiver can take part in an NCCL group.
    """

    ordinal: int
    session: str
    cuda: bool = False


@dataclasses.dataclass(frozen=True)
class GroupPlan:
    """One broadcast group: index, generation (unique per formation) and members in rank order (rank = 1 + i).

    Attributes:
        index (int): group index (ordinal // group_size).
        generation (int): formation number; a re-formed group gets a new one and new store keys.
        members (tuple[Member, ...]): sorted by ordinal.
    """

    index: int
    generation: int
    members: tuple[Member, ...]


class Membership:
    """Registered receivers, folded from the membership events (pure, no I/O)."""

    def __init__(self) -> None:
        self.members: dict[int, Member] = {}
        self.seen: set[int] = set()
        """Every ordinal that ever joined (their reports stay readable after they leave)."""
        self.highest_version = 0
        """The highest weight version any join event carried (what the fleet held when it registered)."""

    def join(self, member: Member, version: int = 0) -> None:
        """Fold a join: it replaces an older session of the same ordinal and raises `highest_version` to
        `version`, the newest weight version that receiver holds.
        """
        self.members[member.ordinal] = member
        self.seen.add(member.ordinal)
        self.highest_version = max(self.highest_version, int(version))

    def evict(self, ordinal: int, session: str) -> None:
        """Remove `ordinal` if its current session is `session` (a leave, or an eviction by the sender; a stale
        leave of a restarted receiver is ignored). It must register again to rejoin.
        """
        member = self.members.get(ordinal)
        if member is not None and member.session == session:
            del self.members[ordinal]


def plan_groups(
    members: Mapping[int, Member], group_size: int, previous: Mapping[int, GroupPlan], next_generation: int
) -> tuple[dict[int, GroupPlan], int]:
    """Split `members` into groups by ordinal, keeping every group whose membership did not change.

    Args:
        members (Mapping[int, Member]): ordinal -> member.
        group_size (int): most receivers per group (>= 1).
        previous (Mapping[int, GroupPlan]): the live groups of the last publish.
        next_generation (int): the first generation number not used yet.

    Returns:
        tuple[dict[int, GroupPlan], int]: group index -> plan (unchanged groups are the same objects), and the
        next unused generation number.

    Examples:
        >>> plans, _ = plan_groups({0: Member(0, "a"), 3: Member(3, "b")}, 2, {}, 1)
        >>> [(p.index, p.generation, [m.ordinal for m in p.members]) for p in plans.values()]
        [(0, 1, [0]), (1, 2, [3])]
    """
    by_group: dict[int, list[Member]] = {}
    for ordinal in sorted(members):
        by_group.setdefault(ordinal // group_size, []).append(members[ordinal])
    plans: dict[int, GroupPlan] = {}
    for index, group in sorted(by_group.items()):
        old = previous.get(index)
        if old is not None and old.members == tuple(group):
            plans[index] = old
        else:
            plans[index] = GroupPlan(index, next_generation, tuple(group))
            next_generation += 1
    return plans, next_generation
