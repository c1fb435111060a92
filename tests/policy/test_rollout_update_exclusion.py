"""Rollouts and weight updates: failures release the policy, notifies are never lost, no interleaving."""

from __future__ import annotations

import asyncio
import threading
import time

import pytest
import torch
from policy_helpers import BOX_META, ToyPolicy, obs

from rlightning import weights
from rlightning.config import PolicyConfig, WeightBufferConfig
from tests._polling import wait_for

torch.set_num_threads(1)


def _eval_policy(mode: str = "sync", strategy: str = "single") -> ToyPolicy:
    config = PolicyConfig(device="cpu", rollout_mode=mode, weight_buffer=WeightBufferConfig(buffer_strategy=strategy))
    policy = ToyPolicy(config, "eval")
    policy.init_eval(BOX_META, seed=0)
    return policy


def _state(value: float, like: ToyPolicy) -> dict[str, torch.Tensor]:
    return {name: torch.full_like(t, value) for name, t in weights.named_state(like).items()}


@pytest.mark.timeout(30)
def test_exception_in_rollout_step_leaves_the_policy_usable() -> None:
    policy = _eval_policy()
    try:
        with pytest.raises(RuntimeError, match="boom"):
            policy.rollout({**obs(), "fail": True})
        assert policy.get_num_requests() == 0 and policy.check_idle(timeout=2.0)
        assert policy.rollout(obs()).shape == (4, 2)  # the next rollout runs
        assert policy.push_weights(1, _state(0.5, policy))
        assert policy.wait_for_weight_update_done(timeout=5.0)  # and the next weight update
        assert policy.weight_version == 1 and policy.scale_value == 0.5
    finally:
        policy.close()


@pytest.mark.timeout(30)
def test_exception_in_async_rollout_leaves_the_policy_usable() -> None:
    policy = _eval_policy("async")

    async def scenario() -> None:
        with pytest.raises(RuntimeError, match="boom"):
            await policy.rollout_async({**obs(), "fail": True})
        assert (await policy.rollout_async(obs())).shape == (4, 2)

    try:
        asyncio.run(asyncio.wait_for(scenario(), 10))
        assert policy.push_weights(1, _state(0.25, policy)) and policy.wait_for_weight_update_done(5.0)
    finally:
        policy.close()


@pytest.mark.timeout(30)
def test_a_notify_during_an_update_is_not_lost() -> None:
    policy = _eval_policy()
    policy.hold_update = threading.Event()
    try:
        assert policy.push_weights(1, _state(1.0, policy))
        assert policy.update_entered.wait(5.0)  # the update thread is inside the first update
        assert policy.push_weights(2, _state(2.0, policy))  # staged + notified during it
        assert not policy.wait_for_weight_update_done(timeout=0.2)
        policy.hold_update.set()
        assert policy.wait_for_weight_update_done(timeout=5.0)
        assert policy.weight_version == 2 and policy.scale_value == 2.0
    finally:
        policy.hold_update.set()
        policy.close()


@pytest.mark.timeout(30)
def test_a_failed_update_is_reported_and_the_thread_keeps_serving() -> None:
    policy = _eval_policy()
    try:
        bad = _state(1.0, policy)
        bad["scale"] = torch.ones(5)  # wrong shape
        assert policy.push_weights(1, bad)
        assert not policy.wait_for_weight_update_done(timeout=5.0)
        assert isinstance(policy.weight_update_error, ValueError) and policy.weight_version == 0
        assert policy.push_weights(2, _state(3.0, policy)) and policy.wait_for_weight_update_done(timeout=5.0)
        assert policy.weight_update_error is None and policy.weight_version == 2
    finally:
        policy.close()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("strategy", ["single", "none"])
def test_weight_updates_never_overlap_a_forward_pass_sync_mode(strategy: str) -> None:
    policy = _eval_policy("sync", strategy)
    policy.update_sleep = 0.002
    stop = threading.Event()
    errors: list[BaseException] = []

    def roll() -> None:
        try:
            while not stop.is_set():
                policy.rollout({**obs(), "sleep": 0.003}, timeout=10.0)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=roll) for _ in range(3)]
    for thread in threads:
        thread.start()
    try:
        version, deadline = 0, time.monotonic() + 30
        while version < 40 or (policy.log.count("rollout_enter") < 20 and time.monotonic() < deadline):
            version += 1
            policy.push_weights(version, _state(float(version), policy))
            time.sleep(0.004)
        assert policy.wait_for_weight_update_done(timeout=10.0)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10.0)
        policy.close()
    assert not errors
    rollouts, updates = policy.log.check_exclusion()
    assert rollouts > 20 and updates > 5
    assert policy.weight_version == version and policy.scale_value == float(version)
    assert _peak_concurrency(policy) == 1  # sync mode admits one rollout at a time


def _peak_concurrency(policy: ToyPolicy) -> int:
    depth = peak = 0
    for event, _ in policy.log.events:
        depth += {"rollout_enter": 1, "rollout_exit": -1}.get(event, 0)
        peak = max(peak, depth)
    return peak


@pytest.mark.timeout(60)
def test_async_mode_overlaps_rollouts_but_never_with_updates() -> None:
    policy = _eval_policy("async")
    policy.update_sleep = 0.002

    async def client(count: int) -> None:
        for _ in range(count):
            await policy.rollout_async({**obs(), "sleep": 0.004})

    async def updater() -> None:
        for version in range(1, 21):
            policy.push_weights(version, _state(float(version), policy))
            await asyncio.sleep(0.005)

    async def scenario() -> None:
        # concurrent requests overlap in the executor while no update is pending
        await asyncio.gather(*(policy.rollout_async({**obs(), "sleep": 0.05}) for _ in range(4)))
        assert _peak_concurrency(policy) > 1
        await asyncio.gather(*(client(15) for _ in range(4)), updater())

    try:
        asyncio.run(asyncio.wait_for(scenario(), 30))
        assert policy.wait_for_weight_update_done(timeout=10.0)
    finally:
        policy.close()
    rollouts, updates = policy.log.check_exclusion()
    assert rollouts == 64 and updates > 3
    assert policy.weight_version == 20 and policy.get_num_requests() == 0


@pytest.mark.timeout(30)
def test_cancelled_async_rollouts_release_the_policy() -> None:
    policy = _eval_policy("async")
    policy.hold_update = threading.Event()

    async def scenario() -> None:
        policy.push_weights(1, _state(1.0, policy))
        assert await asyncio.to_thread(policy.update_entered.wait, 5.0)
        waiting = asyncio.ensure_future(policy.rollout_async(obs()))  # blocked at admission by the update
        await asyncio.sleep(0.05)
        assert not waiting.done()
        waiting.cancel()
        running_task = None
        policy.hold_update.set()
        await asyncio.to_thread(policy.wait_for_weight_update_done, 5.0)
        running_task = asyncio.ensure_future(policy.rollout_async({**obs(), "sleep": 0.1}))
        await asyncio.sleep(0.02)
        running_task.cancel()  # the forward finishes in its worker and releases the gate
        with pytest.raises(asyncio.CancelledError):
            await waiting

    try:
        asyncio.run(asyncio.wait_for(scenario(), 20))
        assert policy.check_idle(timeout=5.0) and policy.get_num_requests() == 0
        assert policy.push_weights(2, _state(2.0, policy)) and policy.wait_for_weight_update_done(5.0)
        assert policy.rollout(obs()).shape == (4, 2)
    finally:
        policy.hold_update.set()
        policy.close()
    policy.log.check_exclusion()


@pytest.mark.timeout(30)
def test_a_rollout_waits_for_admission_with_a_timeout() -> None:
    policy = _eval_policy()
    policy.hold_update = threading.Event()
    try:
        policy.push_weights(1, _state(1.0, policy))
        assert policy.update_entered.wait(5.0)
        with pytest.raises(TimeoutError, match="not admitted"):
            policy.rollout(obs(), timeout=0.1)
        policy.hold_update.set()
        assert policy.rollout(obs(), timeout=5.0).shape == (4, 2)
    finally:
        policy.hold_update.set()
        policy.close()


def test_older_versions_are_ignored() -> None:
    policy = _eval_policy()
    try:
        assert policy.push_weights(3, _state(3.0, policy)) and policy.wait_for_weight_update_done(5.0)
        assert not policy.push_weights(2, _state(2.0, policy))
        assert policy.weight_version == 3 and policy.scale_value == 3.0
    finally:
        policy.close()


@pytest.mark.timeout(30)
def test_a_receive_in_place_keeps_rollouts_out_and_a_torn_one_leaves_no_version() -> None:
    policy = _eval_policy(strategy="none")
    try:
        assert policy.begin_weight_receive(timeout=2.0)
        # a rollout waits for the receive; it times out meanwhile
        with pytest.raises(TimeoutError):
            policy.rollout(obs(), timeout=0.2)
        for tensor in policy.receive_targets().values():
            tensor.fill_(0.5)  # what the receiver writes, straight into the policy
        policy.end_weight_receive(3)
        assert policy.weight_version == 3 and policy.scale_value == 0.5
        assert policy.rollout(obs(), timeout=2.0).shape == (4, 2)

        assert policy.begin_weight_receive(timeout=2.0)
        policy.end_weight_receive(None)  # stopped part way
        assert policy.weight_version == 0
        assert policy.rollout(obs(), timeout=2.0).shape == (4, 2)  # the gate is free again
        with pytest.raises(RuntimeError, match="without a matching"):
            policy.end_weight_receive(4)
    finally:
        policy.close()


@pytest.mark.timeout(30)
def test_a_receive_in_place_waits_for_a_running_rollout() -> None:
    policy = _eval_policy(strategy="none")
    entered = threading.Event()
    try:
        assert policy._gate.enter_rollout(2.0)  # a rollout in flight (held open by the test)
        assert not policy.begin_weight_receive(0.1)  # it does not drain in time: nothing may be written
        waiter = threading.Thread(target=lambda: entered.set() if policy.begin_weight_receive(5.0) else None)
        waiter.start()
        # the receive waits for it: seen waiting (the gate counts it) before the wait for it to get through starts,
        # so that wait is long enough whatever the machine's load
        wait_for("the receive to begin waiting", lambda: policy._gate.updates_waiting > 0 or entered.is_set(),
                 timeout=5.0, interval=0.01)
        assert not entered.wait(0.3)
        policy._gate.exit_rollout()
        assert entered.wait(5.0)
        waiter.join(5.0)
        policy.end_weight_receive(1)
    finally:
        policy.close()
