"""Pure planning of broadcast groups from membership."""

from __future__ import annotations

from rlightning.weights._membership import Member, Membership, plan_groups


def members(*ordinals: int, session: str = "s") -> dict[int, Member]:
    return {o: Member(o, f"{session}{o}") for o in ordinals}


def test_groups_by_ordinal_and_only_changed_groups_get_a_new_generation():
    plans, nxt = plan_groups(members(0, 1, 2, 5), 2, {}, 1)
    assert {g: [m.ordinal for m in p.members] for g, p in plans.items()} == {0: [0, 1], 1: [2], 2: [5]}
    assert [p.generation for p in plans.values()] == [1, 2, 3] and nxt == 4

    again, nxt2 = plan_groups(members(0, 1, 2, 3, 5), 2, plans, nxt)  # ordinal 3 joins group 1
    assert again[0] is plans[0] and again[2] is plans[2]
    assert again[1].generation == 4 and nxt2 == 5

    restarted = {**members(0, 1, 2, 3, 5), 0: Member(0, "new")}  # a new session of ordinal 0
    third, _ = plan_groups(restarted, 2, again, nxt2)
    assert third[0].generation == 5 and third[1] is again[1]


def test_generations_are_never_reused_after_a_group_empties():
    plans, nxt = plan_groups(members(4), 2, {}, 7)
    gone, nxt = plan_groups({}, 2, plans, nxt)
    back, _ = plan_groups(members(4), 2, gone, nxt)
    assert gone == {} and back[2].generation > plans[2].generation


def test_stale_leave_is_ignored_and_eviction_is_per_session():
    m = Membership()
    m.join(Member(1, "a"))
    m.join(Member(1, "b"))  # restarted
    m.evict(1, "a")  # the old process's leave arrives late
    assert m.members[1].session == "b"
    m.evict(1, "a")
    assert 1 in m.members
    m.evict(1, "b")
    assert m.members == {} and m.seen == {1}
