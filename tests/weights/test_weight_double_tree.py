"""Two relay trees (`weightSync.relayTrees: 2`, NCCL's double binary tree): the pure planner, and 8 real receiver
processes that each receive half the transfers down each tree and relay them.

The capped-link run (the sender's egress is one model, every receiver holds the exact digest) is in
test_weight_capped.py. Ports: WEIGHTS_DOUBLE_TREE of tests/_ports.py, indices 0-4.
"""

from __future__ import annotations

import math
import threading
import time

import pytest
import torch
from test_weight_relay import FLEET, IN_PLACE, kill_one_of_eight, publish_to_eight
from wsync_helpers import wait_members

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightSender, _store, _transport
from rlightning.weights._topology import Place, carried, relay_trees, root, split, subtree
from tests._ports import WEIGHTS_DOUBLE_TREE

torch.set_num_threads(1)
# FLEET, 8 receivers: tree 0: 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6; 3 -> 7
# tree 1 (the members reversed): 7 -> 6, 5; 6 -> 4, 3; 5 -> 2, 1; 4 -> 0


def test_two_trees_of_eight_are_the_tree_and_its_mirror():
    first, second = relay_trees(FLEET, 2, 2)
    assert first[1] == Place(0, (3, 4), 2) and first[7] == Place(3, (), 4)
    assert second[7] == Place(None, (6, 5), 1)
    assert second[6] == Place(7, (4, 3), 2)
    assert second[4] == Place(6, (0,), 3)
    assert second[0] == Place(4, (), 4)
    assert relay_trees(FLEET, 2, 1) == (first,)


@pytest.mark.parametrize("size", range(1, 41))
def test_every_member_has_one_parent_per_tree_is_interior_in_one_and_uploads_one_model(size):
    ordinals = [3 * o + 1 for o in range(size)]  # any ordinals, in rank order
    plans = relay_trees(ordinals, 2, 2)
    for places in plans:
        assert sorted(places) == ordinals  # every member has a place in each tree
        assert sum(p.parent is None for p in places.values()) == 1  # one root, fed by the sender
        children = sorted(c for p in places.values() for c in p.children)
        assert children == sorted(set(ordinals) - {root(places)})  # every other member has exactly one parent
        for ordinal, place in places.items():
            assert all(places[c].parent == ordinal for c in place.children)
        assert max(p.depth for p in places.values()) == math.floor(math.log2(size)) + 1
    for ordinal in ordinals:
        interior = [places for places in plans if places[ordinal].children]
        assert len(interior) <= 1  # a relay in one tree is a leaf in the other
        # each tree carries half the model, so a member uploads at most 2 halves: one model
        assert sum(len(places[ordinal].children) for places in plans) <= 2
    if size >= 2:
        assert root(plans[0]) != root(plans[1])  # the sender's two halves leave on two different links


def test_relay_trees_refuses_a_third_tree():
    with pytest.raises(ValueError, match="relay trees must be 1 or 2, got 3"):
        relay_trees([0, 1], 2, 3)


@pytest.mark.parametrize(
    ("sizes", "trees"),
    [([], 2), ([5], 2), ([8] * 9, 2), ([1 << 20, 4096] * 20, 2), ([1 << 20] * 3 + [7, 9] + [1 << 20] * 4, 2),
     ([3, 1, 4], 1)],
)
def test_the_trees_carry_the_header_and_half_the_bytes_each(sizes, trees):
    shares = [carried(split(sizes, trees), tree) for tree in range(trees)]
    assert all(share[0] == 0 for share in shares)  # the header travels down every tree
    assert sorted(i for share in shares for i in share[1:]) == list(range(1, len(sizes) + 1))  # every transfer once
    loads = [sum(sizes[i - 1] for i in share[1:]) for share in shares]
    assert max(loads) - min(loads) <= max(sizes, default=0)  # halves, to one transfer (weights and biases alike)


def subtrees(plans: tuple, ordinal: int) -> list[int]:
    """What a member's death costs: its subtree in each tree (a member below it in one still relays the other)."""
    return sorted({below for places in plans for below in subtree(places, ordinal)})


def test_a_failed_member_costs_its_subtree_in_each_tree_only():
    plans = relay_trees(FLEET, 2, 2)
    assert subtrees(plans, 6) == [0, 3, 4, 6]  # a leaf in tree 0, relays 4 and 3 (and 4 relays 0) in tree 1
    assert subtrees(plans, 1) == [1, 3, 4, 7]  # relays in tree 0, a leaf in tree 1
    assert subtrees(plans, 0) == FLEET  # a root: everyone misses one half
    assert subtrees(relay_trees(FLEET, 2, 1), 6) == [6]


def port_of(receive: str, index: int) -> int:
    """A port per test and mode: a parametrized run must not wait for the previous one's sockets to close."""
    return WEIGHTS_DOUBLE_TREE.port(2 * index + (receive == "in-place"))


@pytest.mark.slow
@pytest.mark.timeout(240)
@IN_PLACE
def test_eight_receivers_in_two_trees_hold_identical_weights_after_every_publish(procs, receive):
    publish_to_eight(procs, port_of(receive, 0), receive, trees=2)


@pytest.mark.slow
@pytest.mark.timeout(240)
@IN_PLACE
def test_a_receiver_killed_mid_publish_costs_its_subtrees_only_and_they_rejoin(procs, receive):
    # 6 dies receiving version 2: a leaf in tree 0; in tree 1 it relays to 4 and 3, and 4 to 0. So 0, 3 and 4 miss
    # tree 1's half of version 2, but still relay tree 0's: 0 feeds 1 and 2, 1 feeds 3 and 4, 2 feeds 5 and 6
    kill_one_of_eight(procs, port_of(receive, 1), receive, 6, [0, 3, 4, 6], trees=2)


@pytest.mark.timeout(90)
def test_two_members_feeding_each_other_get_a_publish_when_a_child_edge_forms_after_the_header(monkeypatch):
    # Two members: 0 relays to 1 in tree 0, 1 relays to 0 in tree 1, and one small tensor travels down tree 0 only.
    # 1's edge to 0 (tree 1) forms after 1 reached the header: 1 must still send 0 the header while it waits for
    # 0's relay of the tensor, which 0 sends only once it has that header (else both wait for their timeouts).
    late = _store.edge_prefix(0, 1, 0, 1)  # group 0, generation 1, into ordinal 0 in tree 1: from its relay 1
    delayed: list[str] = []
    form = _transport.BroadcastGroup.__init__

    def slow_form(self, connection, prefix, rank, *args, **kwargs) -> None:
        if prefix == late and rank == 0:
            delayed.append(prefix)
            time.sleep(1.5)
        form(self, connection, prefix, rank, *args, **kwargs)

    monkeypatch.setattr(_transport.BroadcastGroup, "__init__", slow_form)
    port = WEIGHTS_DOUBLE_TREE.port(4)
    config = WeightSyncConfig(backend="gloo", group_size=2, relay_trees=2, timeout_seconds=5)
    sender = WeightSender(config, "127.0.0.1", port)
    receivers = [WeightReceiver(config, "127.0.0.1", port, ordinal=o) for o in (0, 1)]
    got: dict[int, list[int]] = {0: [], 1: []}
    done = threading.Event()

    def run(receiver: WeightReceiver) -> None:
        while not done.is_set():
            item = receiver.receive(timeout=0.5)
            if item is not None:
                got[receiver.ordinal].append(item[0])

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in receivers]
    for thread in threads:
        thread.start()
    try:
        wait_members(sender, {0, 1}, timeout=30.0)
        stats = sender.publish({"w": torch.arange(16, dtype=torch.float32)})
        assert delayed == [late]  # the edge did form late
        assert stats.failed == {} and stats.receivers_acked == [0, 1], stats
        assert stats.seconds < config.timeout_seconds, stats
    finally:
        done.set()
        for thread in threads:
            thread.join(30)
        for receiver in receivers:
            receiver.close()
        sender.close()
