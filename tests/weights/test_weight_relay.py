"""Relay trees: the pure planner, and 8 real receiver processes that relay buckets to each other.

Ports: WEIGHTS_SYNC of tests/_ports.py, indices 7, 14, 16 and 17 (test_weight_sync.py 0-5, _memory 6, _liveness
10-13, _cadence 15, _dtype 18, _ack 19).
"""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch
from wsync_helpers import (
    BUCKET_BYTES,
    applied_versions,
    start_receiver,
    stop,
    wait_members,
    wait_reports,
    weights_for,
)

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightSender, WeightSyncError, tensor_digests
from rlightning.weights._topology import Place, relay_tree, subtree
from tests._polling import wait_for
from tests._ports import WEIGHTS_IN_PLACE, WEIGHTS_SYNC

torch.set_num_threads(1)
TIMEOUT = 5.0
STALL_TIMEOUT = 10.0
"""The sender's timeout where a relay stalls: the root's own receive must not time out meanwhile. At 5 s one suite
run (4 workers and other tests on 2 cores) saw the root's receive time out too, so the whole group failed."""
DEATH_TIMEOUT = 15.0
"""The sender's timeout where a death mid-publish must fail it early: far above `DEATH_BOUND`, so a sender that
waited for the dead member's acknowledgement could not pass."""
DEATH_BOUND = 6.0
"""Seconds within which such a publish fails: the tree neighbours' report of the loss came at most 2.54 s after the
publish began under the suite's load (4 workers, 9 processes of this test on 2 cores; 0.1-0.5 s at load 16 with two
such tests at once); 6 s is 2.4x the slowest."""
FLEET = list(range(8))  # depth 4: 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6; 3 -> 7


@pytest.mark.parametrize(
    ("ordinals", "fanout", "expected"),
    [
        ([4], 2, {4: Place(None, (), 1)}),
        ([0, 1, 2], 1, {0: Place(None, (1,), 1), 1: Place(0, (2,), 2), 2: Place(1, (), 3)}),  # a chain
        (
            [0, 1, 2, 3, 4, 5, 6, 7],
            2,
            {
                0: Place(None, (1, 2), 1),
                1: Place(0, (3, 4), 2),
                2: Place(0, (5, 6), 2),
                3: Place(1, (7,), 3),
                4: Place(1, (), 3),
                5: Place(2, (), 3),
                6: Place(2, (), 3),
                7: Place(3, (), 4),
            },
        ),
        ([3, 9, 12], 4, {3: Place(None, (9, 12), 1), 9: Place(3, (), 2), 12: Place(3, (), 2)}),
    ],
)
def test_relay_tree_is_a_complete_tree_in_heap_order(ordinals, fanout, expected):
    assert relay_tree(ordinals, fanout) == expected


def test_relay_tree_sends_each_member_one_copy_and_stays_shallow():
    tree = relay_tree(list(range(1000)), 2)
    assert sum(len(p.children) for p in tree.values()) == 999  # every member but the root has one parent
    assert max(len(p.children) for p in tree.values()) == 2
    assert max(p.depth for p in tree.values()) == 10  # ceil(log2(1001))
    with pytest.raises(ValueError, match="fanout must be >= 1"):
        relay_tree([0, 1], 0)


def test_subtree_is_what_a_broken_edge_cuts_off():
    tree = relay_tree(list(range(8)), 2)
    assert subtree(tree, 1) == [1, 3, 4, 7]
    assert subtree(tree, 6) == [6]
    assert subtree(tree, 0) == list(range(8))


def config(timeout: float = TIMEOUT, trees: int = 1) -> WeightSyncConfig:
    return WeightSyncConfig(
        backend="gloo", bucket_size_bytes=BUCKET_BYTES, group_size=8, relay_fanout=2, relay_trees=trees,
        timeout_seconds=timeout,
    )


def start_fleet(port: int, *extra_of: tuple[int, tuple[str, ...]], common: tuple[str, ...] = ()) -> list:
    extra = dict(extra_of)
    return [start_receiver(port, o, *common, *extra.get(o, ()), group_size=8, lifetime=120.0) for o in FLEET]


IN_PLACE = pytest.mark.parametrize("receive", ["staged", "in-place"])
"""Receivers stage each version (`single`), or receive it straight into the policy (`none`), relaying from its
tensors and from two reused transfer buffers."""


def receiver_mode(receive: str) -> tuple[str, ...]:
    return ("--in-place",) if receive == "in-place" else ()


def port_of(receive: str, staged: int, in_place: int) -> int:
    """A port per mode: a parametrized run must not wait for the previous one's sockets to close."""
    return WEIGHTS_IN_PLACE.port(in_place) if receive == "in-place" else WEIGHTS_SYNC.port(staged)


def digests_match(reports: dict, ordinals: list[int], version: int) -> bool:
    expected = tensor_digests(weights_for(version))
    return all(o in reports and reports[o].applied.version == version for o in ordinals) and all(
        reports[o].applied.digest == expected for o in ordinals
    )


def publish_through_a_death(
    sender: WeightSender, procs: list, fleet: list[int], dead: int, match: str, within: float
) -> WeightSyncError:
    """Publish version 1 to all of `fleet`, then version 2, in which receiver `dead` kills itself: that publish must
    fail with an error matching `match` in under `within` seconds. Returns its error."""
    wait_members(sender, set(fleet), timeout=120.0)
    assert sender.publish(weights_for(1)).receivers_acked == fleet
    start = time.monotonic()
    with pytest.raises(WeightSyncError, match=match) as info:
        sender.publish(weights_for(2))
    failed_after = time.monotonic() - start
    print(f"publish through the death of {dead} failed after {failed_after:.2f} s (bound {within:g} s)")
    assert failed_after < within
    assert procs[dead].wait(10) == -signal.SIGKILL
    return info.value


def publish_to_eight(procs: list, port: int, receive: str, trees: int = 1) -> None:
    """Publish versions 1-4 to `FLEET` in `trees` relay trees: every one reaches every receiver, digest for digest."""
    procs += start_fleet(port, common=(*receiver_mode(receive), "--relay-trees", str(trees)))
    sender = WeightSender(config(trees=trees), "127.0.0.1", port)
    try:
        wait_members(sender, set(FLEET), timeout=120.0)
        for version in range(1, 5):
            stats = sender.publish(weights_for(version))
            assert (stats.version, stats.receivers_acked, stats.failed) == (version, FLEET, {})
            assert list(stats.groups) == [0]  # one group: the sender feeds only its root(s)
            reports = wait_reports(sender, lambda r, v=version: digests_match(r, FLEET, v))
            assert digests_match(reports, FLEET, version), {o: r.applied.version for o, r in reports.items()}
    finally:
        sender.close()
    stop(procs)
    assert [applied_versions(p) for p in procs] == [[1, 2, 3, 4]] * len(FLEET)


def kill_one_of_eight(procs: list, port: int, receive: str, dead: int, cut_off: list[int], trees: int = 1) -> None:
    """Receiver `dead` of `FLEET` (in `trees` relay trees) dies receiving version 2: exactly `cut_off` miss it, the
    sender learns so before the timeout, and every survivor gets version 3 once the trees are re-planned."""
    procs += start_fleet(port, (dead, ("--die-in-version", "2")), common=(*receiver_mode(receive), "--relay-trees",
                                                                            str(trees)))
    others = sorted(set(FLEET) - set(cut_off))
    sender = WeightSender(config(DEATH_TIMEOUT, trees=trees), "127.0.0.1", port)
    try:
        # its tree neighbours reported the subtree lost once the edges broke: the sender waited for no one's
        # acknowledgement (that would name the timeout), and took far less than the timeout
        pattern = rf"group 0 \(ordinals \[{', '.join(map(str, cut_off))}\]\)"
        error = publish_through_a_death(sender, procs, FLEET, dead, pattern, DEATH_BOUND)
        assert f"ordinal {dead} lost: " in str(error) and "no acknowledgement within" not in str(error), error
        assert error.stats.receivers_acked == others and error.stats.failed == {0: cut_off}
        assert digests_match(wait_reports(sender, lambda r: digests_match(r, others, 2)), others, 2)

        # the orphans registered again; the next publish re-plans the tree without the dead relay
        survivors = sorted(set(FLEET) - {dead})
        wait_members(sender, set(survivors))
        stats = sender.publish(weights_for(3))
        assert stats.receivers_acked == survivors and stats.formed_groups == [0]
        assert digests_match(wait_reports(sender, lambda r: digests_match(r, survivors, 3)), survivors, 3)
    finally:
        sender.close()
    stop(procs)
    for ordinal in others:
        assert applied_versions(procs[ordinal]) == [1, 2, 3]
    for ordinal in sorted(set(cut_off) - {dead}):  # never a torn version 2: they kept 1 (staged) or held none (in
        # place) until 3
        assert applied_versions(procs[ordinal]) == [1, 3]


@pytest.mark.slow
@pytest.mark.timeout(240)
@IN_PLACE
def test_eight_receivers_relaying_hold_identical_weights_after_every_publish(procs, receive):
    publish_to_eight(procs, port_of(receive, 16, 0), receive)


@pytest.mark.slow
@pytest.mark.timeout(240)
@IN_PLACE
def test_relay_killed_mid_publish_fails_only_its_subtree_which_gets_the_next_version(procs, receive):
    # tree (fanout 2): 0 -> 1, 2; 1 -> 3, 4; 2 -> 5, 6; 3 -> 7. Relay 1 dies receiving version 2.
    kill_one_of_eight(procs, port_of(receive, 17, 1), receive, 1, [1, 3, 4, 7])


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_relay_whose_child_is_killed_fails_the_publish_in_seconds_not_its_timeout(procs):
    port = WEIGHTS_SYNC.port(14)
    timeout = 30.0  # long, so a publish that waited for the dead child's acknowledgement could not pass
    # tree (fanout 2): 0 -> 1, 2; 1 -> 3. Leaf 3, relay 1's child, dies once version 2 arrived and was committed,
    # before it acknowledges: relay 1's transfers to it all completed, only its edge breaking tells
    fleet = [0, 1, 2, 3]
    dies = {3: ("--die-in-apply-version", "2")}
    procs += [
        start_receiver(port, o, "--apply-in-receive", *dies.get(o, ()), group_size=8, lifetime=120.0, timeout=timeout)
        for o in fleet
    ]
    sender = WeightSender(config(timeout), "127.0.0.1", port)
    try:
        # relay 1 saw its edge into 3 break and reported 3 lost: the sender did not wait for 3's acknowledgement
        error = publish_through_a_death(sender, procs, fleet, 3, r"group 0 \(ordinals \[3\]\)", timeout / 3)
        assert "ordinal 3 lost: relay 1: " in str(error)
        assert error.stats.receivers_acked == [0, 1, 2]

        # the tree re-forms without the dead child, as after any failure, and the rest get the next version
        wait_members(sender, {0, 1, 2})
        stats = sender.publish(weights_for(3))
        assert (stats.receivers_acked, stats.formed_groups, stats.failed) == ([0, 1, 2], [0], {})
        assert digests_match(wait_reports(sender, lambda r: digests_match(r, [0, 1, 2], 3)), [0, 1, 2], 3)
    finally:
        sender.close()
    stop(procs)
    assert [applied_versions(procs[o]) for o in (0, 1, 2)] == [[1, 2, 3]] * 3


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_stalled_relay_holds_up_only_its_subtree_and_rejoins(procs):
    port = WEIGHTS_SYNC.port(7)
    fleet = [0, 1, 2, 3]  # tree (fanout 2): 0 -> 1, 2; 1 -> 3. Relay 1 stalls (SIGSTOP) before version 2.
    procs += [start_receiver(port, o, group_size=8, lifetime=180.0) for o in fleet]
    sender = WeightSender(config(STALL_TIMEOUT), "127.0.0.1", port)
    try:
        wait_members(sender, set(fleet), timeout=120.0)
        assert sender.publish(weights_for(1)).receivers_acked == fleet
        os.kill(procs[1].pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(WeightSyncError, match=r"group 0 \(ordinals \[1, 3\]\)") as info:
            sender.publish(weights_for(2))
        assert time.monotonic() - start < STALL_TIMEOUT + 2.0  # its parent and sibling did not wait for it
        assert info.value.stats.receivers_acked == [0, 2]
        assert digests_match(wait_reports(sender, lambda r: digests_match(r, [0, 2], 2)), [0, 2], 2)
        os.kill(procs[1].pid, signal.SIGCONT)  # it finds its publish failed, as does its child: both register again

        def acked_by_fleet():  # publishes while they re-register may miss them; the tree is re-planned each time
            try:
                stats = sender.publish(weights_for(sender.version + 1))  # the version it will get
            except WeightSyncError as error:
                stats = error.stats
            return stats if stats.receivers_acked == fleet else None

        stats = wait_for(f"a publish acknowledged by ordinals {fleet}", acked_by_fleet, timeout=90, interval=0.2)
        version = stats.version
        assert digests_match(wait_reports(sender, lambda r: digests_match(r, fleet, version)), fleet, version)
    finally:
        os.kill(procs[1].pid, signal.SIGCONT)
        sender.close()
    stop(procs)
