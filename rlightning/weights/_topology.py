"""Relay trees: which receiver forwards the buckets to which (pure, no I/O).

Within one group (`_membership.GroupPlan`), the members in ordinal order take the positions 0..n-1 of a complete
`fanout`-ary tree in heap order: the sender feeds position 0, and position p forwards every transfer, as soon as
it has it, to positions p * fanout + 1 .. p * fanout + fanout. So the sender sends one copy per group and every
receiver receives one copy and sends at most `fanout`, whatever the group's size, in pipelined hops (as NCCL's
trees do); the depth is about log_fanout(n). A member that fails takes only its subtree down for one publish:
its descendants register again and the next plan routes around it. Each edge is a broadcast group of two ranks
(`_transport.BroadcastGroup`) with its own store prefix (`_store.edge_prefix`), keyed by the child it feeds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence


@dataclasses.dataclass(frozen=True)
class Place:
    """Where one receiver sits in its relay tree.

    Attributes:
        parent (int | None): ordinal of the member it receives from; None when it receives from the sender.
        children (tuple[int, ...]): ordinals it forwards to, in order.
        depth (int): hops from the sender (1 for the root).
    """

    parent: int | None
    children: tuple[int, ...]
    depth: int


def relay_tree(ordinals: Sequence[int], fanout: int) -> dict[int, Place]:
    """Plan the relay tree of one group: a complete `fanout`-ary tree over `ordinals` in the given order.

    Args:
        ordinals (Sequence[int]): the group's members in rank order (sorted by ordinal); the first is the root.
        fanout (int): most children per member (>= 1; 1 makes a chain).

    Returns:
        dict[int, Place]: ordinal -> its place.

    Raises:
        ValueError: when `fanout` < 1 or an ordinal repeats.

    Examples:
        >>> tree = relay_tree([0, 1, 2, 3], 2)
        >>> tree[0], tree[3]
        (Place(parent=None, children=(1, 2), depth=1), Place(parent=1, children=(), depth=3))
    """
    if fanout < 1:
        raise ValueError(f"relay fanout must be >= 1, got {fanout}")
    if len(set(ordinals)) != len(ordinals):
        raise ValueError(f"ordinals of a relay tree must be unique, got {list(ordinals)}")
    places: dict[int, Place] = {}
    depths: list[int] = []
    for position, ordinal in enumerate(ordinals):
        parent = None if position == 0 else (position - 1) // fanout
        depths.append(1 if parent is None else depths[parent] + 1)
        first = position * fanout + 1
        children = tuple(ordinals[first : first + fanout])
        places[ordinal] = Place(None if parent is None else ordinals[parent], children, depths[-1])
    return places



def subtree(places: dict[int, Place], ordinal: int) -> list[int]:
    """`ordinal` and every member below it in its relay tree: those a broken edge into `ordinal` cuts off.

    Args:
        places (dict[int, Place]): a tree from `relay_tree`.
        ordinal (int): one of its members.

    Returns:
        list[int]: the ordinals, sorted.

    Examples:
        >>> subtree(relay_tree([0, 1, 2, 3, 4], 2), 1)
        [1, 3, 4]
    """
    below, todo = [], [ordinal]
    while todo:
        below.append(todo.pop())
        todo.extend(places[below[-1]].children)
    return sorted(below)
