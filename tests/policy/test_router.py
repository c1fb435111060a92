"""The rollout router: requests go to the least-loaded replica by `get_num_requests`, updates still exclude them."""

from __future__ import annotations

import threading

import pytest
import torch
from policy_helpers import BOX_META, ToyPolicy, obs

from rlightning import weights
from rlightning.config import PolicyConfig
from rlightning.policy import RolloutRouter
from tests._polling import wait_for

torch.set_num_threads(1)


def _replicas(count: int, mode: str) -> list[ToyPolicy]:
    replicas = []
    for _ in range(count):
        policy = ToyPolicy(PolicyConfig(device="cpu", rollout_mode=mode), "eval")
        policy.init_eval(BOX_META, seed=0)
        replicas.append(policy)
    return replicas


def test_a_router_needs_a_replica() -> None:
    with pytest.raises(ValueError, match="at least one policy replica"):
        RolloutRouter([])


@pytest.mark.timeout(30)
def test_each_request_goes_to_the_replica_with_the_fewest_requests() -> None:
    replicas = _replicas(3, "sync")
    router = RolloutRouter(replicas)
    hold = threading.Event()
    threads: list[threading.Thread] = []

    def held(call, load: list[int]) -> None:
        threads.append(threading.Thread(target=call, args=({**obs(), "hold": hold},)))
        threads[-1].start()
        wait_for(f"loads {load}", lambda: [r.get_num_requests() for r in replicas] == load, 10, 0.01)

    try:
        held(replicas[0].rollout, [1, 0, 0])
        held(replicas[0].rollout, [2, 0, 0])  # one in its forward pass, one queued: both count
        held(replicas[1].rollout, [2, 1, 0])
        assert router.pick() is replicas[2] and router.get_num_requests() == 3
        held(router.rollout, [2, 1, 1])  # routed to the idle replica
        held(router.rollout, [2, 2, 1])  # the first of the least loaded after the last pick, round-robin
        held(router.rollout, [2, 2, 2])
        assert not router.check_idle(timeout=0.05)
        hold.set()
        for thread in threads:
            thread.join(10.0)
        assert router.check_idle(timeout=5.0) and router.get_num_requests() == 0
    finally:
        hold.set()
        for replica in replicas:
            replica.close()
    assert [replica.log.count("rollout_enter") for replica in replicas] == [2, 2, 2]


@pytest.mark.timeout(60)
def test_routed_concurrent_rollouts_spread_and_never_overlap_updates() -> None:
    replicas = _replicas(2, "async")
    router = RolloutRouter(replicas)
    for replica in replicas:
        replica.update_sleep = 0.002
    stop = threading.Event()
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                router.rollout({**obs(), "sleep": 0.002}, timeout=10.0)
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=loop) for _ in range(4)]
    for thread in threads:
        thread.start()
    try:
        for version in range(1, 31):
            state = {name: torch.full_like(t, float(version)) for name, t in weights.named_state(replicas[0]).items()}
            assert all(replica.push_weights(version, state) for replica in replicas)
            assert all(replica.wait_for_weight_update_done(10.0) for replica in replicas)
    finally:
        stop.set()
        for thread in threads:
            thread.join(10.0)
        for replica in replicas:
            replica.close()
    assert not errors
    served = []
    for replica in replicas:
        rollouts, updates = replica.log.check_exclusion()  # raises when an update overlapped a forward pass
        served.append(rollouts)
        assert updates >= 1 and replica.weight_version == 30 and replica.scale_value == 30.0
    assert min(served) >= 0.25 * sum(served), served  # four callers over two replicas: both carry load
