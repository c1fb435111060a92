"""WeightBufferMixin: staging, ordering, thread safety, plain-int version."""

from __future__ import annotations

import random
import threading

import pytest
import torch
from wsync_helpers import Net, Policy, weights_for

from rlightning.weights import WeightBufferMixin, named_state, tensor_digests

torch.set_num_threads(1)


def test_stage_then_apply_and_older_versions_are_ignored():
    policy = Policy()
    assert policy.weight_version == 0 and policy.update_weights_from_buffer() is None
    assert policy.stage_weights(2, weights_for(2))
    assert not policy.stage_weights(1, weights_for(1))  # older than the staged one
    assert policy.staged_weight_version == 2
    assert policy.update_weights_from_buffer() == 2
    assert policy.weight_version == 2 and type(policy.weight_version) is int
    assert tensor_digests(named_state(policy)) == tensor_digests(weights_for(2))
    assert not policy.stage_weights(2, weights_for(1))  # equal to the applied one
    assert policy.update_weights_from_buffer() is None
    assert tensor_digests(named_state(policy)) == tensor_digests(weights_for(2))


def test_resumed_version_blocks_older_updates():
    policy = Policy()
    policy.weight_version = 10  # as restored from a checkpoint
    assert not policy.stage_weights(9, weights_for(9))
    assert policy.stage_weights(11, weights_for(11)) and policy.update_weights_from_buffer() == 11


def test_bad_state_raises_and_keeps_version():
    policy = Policy()
    policy.stage_weights(1, {"nope": torch.zeros(1)})
    with pytest.raises(KeyError):
        policy.update_weights_from_buffer()
    assert policy.weight_version == 0 and policy.staged_weight_version is None


def test_strategy_none_applies_on_stage():
    class Direct(Net, WeightBufferMixin):
        def __init__(self) -> None:
            super().__init__()
            self.__init_weight_buffer_mixin__("none")

    policy = Direct()
    assert policy.stage_weights(3, weights_for(3)) and policy.weight_version == 3
    assert not policy.stage_weights(2, weights_for(2))
    assert policy.update_weights_from_buffer() is None
    assert tensor_digests(named_state(policy)) == tensor_digests(weights_for(3))
    with pytest.raises(ValueError, match="'none' or 'single'"):
        Direct().__init_weight_buffer_mixin__("double")


@pytest.mark.timeout(60)
def test_concurrent_stagers_and_appliers_end_at_the_newest_version_monotonically():
    policy = Policy()
    states = {v: weights_for(v) for v in range(1, 9)}
    seen: list[list[int]] = [[] for _ in range(2)]

    def stager(seed: int) -> None:
        versions = list(states) * 5
        random.Random(seed).shuffle(versions)
        for v in versions:
            policy.stage_weights(v, states[v])

    def applier(k: int) -> None:
        for _ in range(200):
            if policy.update_weights_from_buffer() is not None:
                seen[k].append(policy.weight_version)

    threads = [threading.Thread(target=stager, args=(s,)) for s in range(3)] + [
        threading.Thread(target=applier, args=(k,)) for k in range(2)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    policy.update_weights_from_buffer()
    assert policy.weight_version == 8
    assert tensor_digests(named_state(policy)) == tensor_digests(states[8])
    for versions in seen:
        assert versions == sorted(versions)
