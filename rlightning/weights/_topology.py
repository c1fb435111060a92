"""Relay trees: which receiver forwards the buckets to which (pure, no I/O).

Within one group (`_membership.GroupPlan`), the members in ordinal order take the positions 0..n-1 of a complete
`fanout`-ary tree in heap order: the sender feeds position 0, and position p forwards every transfer, as soon as
it has it, to positions p * fanout + 1 .. p * fanout + fanout. So the sender sends one copy per group and every
receiver receives one copy and sends at most `fanout`, whatever the group's size, in pipelined hops (as NCCL's
trees do); the depth is about log_fanout(n). A member that fails takes only its subtree down for one publish:
its descendants register again and the next plan routes around it. Each edge is a broadcast group of two ranks
(`_transport.BroadcastGroup`) with its own store prefix (`_store.edge_prefix`), keyed by the tree and the child it
feeds.

With two trees (`relay_trees`, `weightSync.relayTrees: 2`) a publish's transfers are split between them by bytes
(`split`, `carried`): tree 0 is the tree above, tree 1 the same tree over the members in reverse order, so the members
interior in one are leaves in the other (for fan-out >= 2) and every member uploads at most fan-out / 2 models'
worth while the depth stays log_fanout(n). This is NCCL's double binary tree (Sanders, Speck and Traeff 2009,
"Two-tree algorithms for full bandwidth broadcast, reduction and scan"; NCCL 2.4 mirrors its tree in the same
way for an even rank count). A member that fails then takes down its `subtree` in each tree: a member below it in
one tree still receives the other tree's transfers and forwards them, so its own children in that other tree are
not affected.
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


def relay_trees(ordinals: Sequence[int], fanout: int, trees: int) -> tuple[dict[int, Place], ...]:
    """Plan the `trees` relay trees of one group: `relay_tree` over `ordinals`, and with two, also over them
    reversed (so tree 1's root is the last member, and its interior members are tree 0's leaves).

    Args:
        ordinals (Sequence[int]): the group's members in rank order (sorted by ordinal).
        fanout (int): most children per member in each tree (>= 1).
        trees (int): 1 or 2.

    Returns:
        tuple[dict[int, Place], ...]: one plan per tree, ordinal -> its place there.

    Raises:
        ValueError: when `trees` is not 1 or 2, or as `relay_tree`.

    Examples:
        >>> [tree[0].children for tree in relay_trees([0, 1, 2, 3], 2, 2)]
        [(1, 2), ()]
    """
    if trees not in (1, 2):
        raise ValueError(f"relay trees must be 1 or 2, got {trees}")
    orders = [list(ordinals), list(reversed(ordinals))][:trees]
    return tuple(relay_tree(order, fanout) for order in orders)


def root(places: dict[int, Place]) -> int:
    """The ordinal the sender feeds in a tree from `relay_tree`."""
    return next(ordinal for ordinal, place in places.items() if place.parent is None)


def split(sizes: Sequence[int], trees: int) -> list[int]:
    """Which tree each transfer after the header travels down: in order, each to the tree that has carried the
    fewest bytes so far (the first on a tie), so the trees carry about half the model each and fill together
    (by index alone, a model of large weights each followed by a small bias would send every weight down one tree).

    Args:
        sizes (Sequence[int]): bytes of each transfer after the header, in order (`BucketLayout.segment_nbytes`).
        trees (int): trees the publish is split over (1 or 2).

    Returns:
        list[int]: the tree of each transfer, in order.

    Examples:
        >>> split([100, 1, 100, 1, 100], 2)
        [0, 1, 1, 0, 0]
    """
    carried_bytes = [0] * trees
    out = []
    for size in sizes:
        tree = carried_bytes.index(min(carried_bytes))
        carried_bytes[tree] += size
        out.append(tree)
    return out


def carried(trees_of: Sequence[int], tree: int) -> list[int]:
    """Indices of the transfers of one publish that travel down `tree`: the header (0) down every tree, and
    transfer i >= 1 down tree `trees_of[i - 1]` (`split`).

    Args:
        trees_of (Sequence[int]): the tree of each transfer after the header.
        tree (int): which tree.

    Returns:
        list[int]: ascending transfer indices.

    Examples:
        >>> carried([0, 1, 1, 0, 0], 1)
        [0, 2, 3]
    """
    return [0, *(i + 1 for i, t in enumerate(trees_of) if t == tree)]

