"""Concurrent callers of one policy: served in arrival order, and a weight update goes before queued rollouts."""

from __future__ import annotations

import threading

import pytest
import torch
from policy_helpers import BOX_META, ToyPolicy, obs

from rlightning import weights
from rlightning.config import PolicyConfig
from tests._polling import wait_for

torch.set_num_threads(1)

CALLERS = 4
ROLLOUTS = 240


def _sync_policy() -> ToyPolicy:
    policy = ToyPolicy(PolicyConfig(device="cpu", rollout_mode="sync"), "eval")
    policy.init_eval(BOX_META, seed=0)
    return policy


def _enters_by_thread(policy: ToyPolicy) -> list[int]:
    return [thread for event, thread in policy.log.events if event == "rollout_enter"]


@pytest.mark.timeout(60)
def test_looping_callers_share_a_sync_policy_fairly() -> None:
    policy = _sync_policy()
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                # The forward releases the GIL (as torch's kernels do), so the loser of an unfair lock is starved.
                policy.rollout({**obs(), "sleep": 0.001}, timeout=10.0)
                if policy.log.count("rollout_enter") >= ROLLOUTS:
                    stop.set()
        except BaseException as error:  # surfaced below
            errors.append(error)
            stop.set()

    threads = [threading.Thread(target=loop) for _ in range(CALLERS)]
    try:
        for thread in threads:
            thread.start()
        assert stop.wait(40.0), "the callers did not finish their rollouts"
    finally:
        stop.set()
        for thread in threads:
            thread.join(10.0)
        policy.close()
    assert not errors
    enters = _enters_by_thread(policy)
    counts = [enters.count(thread.ident) for thread in threads]
    # Arrival order: a caller that loops is queued behind every caller already waiting, so shares are even.
    assert min(counts) >= 0.6 * len(enters) / CALLERS, counts
    # And no caller runs twice in a row while all are looping (the first and last rounds are ramps).
    steady = enters[CALLERS * 2 : -CALLERS * 2]
    repeats = sum(a == b for a, b in zip(steady[:-1], steady[1:], strict=True))
    assert repeats <= len(steady) // 50, f"{repeats} back-to-back rollouts by one caller of {len(steady)}"


@pytest.mark.timeout(30)
def test_a_caller_that_loops_is_queued_behind_the_waiting_ones() -> None:
    policy = _sync_policy()
    hold = threading.Event()

    def loop() -> None:
        policy.rollout({**obs(), "hold": hold})
        policy.rollout(obs())
        policy.rollout(obs())

    threads = [threading.Thread(target=loop)]
    try:
        threads[0].start()
        wait_for("the looping caller's first forward pass", lambda: policy.log.count("rollout_enter"), 10, 0.01)
        for queued in (2, 3):
            threads.append(threading.Thread(target=policy.rollout, args=(obs(),)))
            threads[-1].start()
            wait_for(f"{queued} requests", lambda n=queued: policy.get_num_requests() == n, 10, 0.01)
        hold.set()
        for thread in threads:
            thread.join(10.0)
    finally:
        hold.set()
        policy.close()
    looper, first, second = (thread.ident for thread in threads)
    assert _enters_by_thread(policy) == [looper, first, second, looper, looper]


@pytest.mark.timeout(30)
def test_an_update_waits_for_the_forward_in_progress_then_goes_before_queued_rollouts() -> None:
    policy = _sync_policy()
    hold = threading.Event()
    threads = [threading.Thread(target=policy.rollout, args=({**obs(), "hold": hold},))]
    try:
        threads[0].start()
        wait_for("the first rollout to be in its forward pass", lambda: policy.log.count("rollout_enter"), 10, 0.01)
        for queued in (2, 3):  # two callers queue behind it, one after the other
            threads.append(threading.Thread(target=policy.rollout, args=(obs(),)))
            threads[-1].start()
            wait_for(f"{queued} requests", lambda n=queued: policy.get_num_requests() == n, 10, 0.01)
        state = {name: torch.full_like(t, 2.0) for name, t in weights.named_state(policy).items()}
        assert policy.push_weights(1, state)
        wait_for("the update to wait for admission", lambda: policy._gate.updates_waiting, 10, 0.01)
        assert policy.weight_version == 0 and policy.get_num_requests() == 3
        hold.set()
        for thread in threads:
            thread.join(10.0)
        assert policy.wait_for_weight_update_done(10.0) and policy.weight_version == 1
    finally:
        hold.set()
        policy.close()
    names = [event for event, _ in policy.log.events]
    one_rollout = ["rollout_enter", "rollout_exit"]
    assert names == [*one_rollout, "update_enter", "update_exit", *one_rollout, *one_rollout]
    assert _enters_by_thread(policy) == [thread.ident for thread in threads]  # the queue kept arrival order
