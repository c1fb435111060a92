"""named_state / load_named_state / clean_state_dict_keys, including DDP and torch.compile wrappers."""

from __future__ import annotations

import datetime

import pytest
import torch
import torch.distributed as dist
from torch import nn
from wsync_helpers import Net, weights_for

from rlightning.weights import clean_state_dict_keys, load_named_state, named_state, tensor_digests
from tests._ports import WEIGHTS_STATE

torch.set_num_threads(1)
EXPECTED = {
    "fc1.weight", "fc1.bias", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var",
    "bn.num_batches_tracked", "head.weight", "head.bias", "scale", "big", "steps", "stats64",
}


def test_named_state_has_parameters_and_persistent_buffers_only():
    net = Net()
    state = named_state(net)
    assert set(state) == EXPECTED  # `scratch` is a non-persistent buffer
    assert set(state) == set(net.state_dict())
    assert not any(t.requires_grad for t in state.values())
    assert state["scale"].data_ptr() == net.scale.data_ptr()  # detached views, no copy


def test_named_state_strips_compile_prefix():
    net = Net()
    compiled = torch.compile(net)
    assert isinstance(compiled, torch.nn.Module)  # an OptimizedModule; torch.compile is typed as any callable
    assert any(k.startswith("_orig_mod.") for k in compiled.state_dict())
    assert set(named_state(compiled)) == EXPECTED
    load_named_state(compiled, weights_for(4))
    assert tensor_digests(named_state(net)) == tensor_digests(weights_for(4))


@pytest.mark.timeout(60)
def test_named_state_strips_ddp_prefix_on_one_rank_gloo_group():
    store = dist.TCPStore("127.0.0.1", WEIGHTS_STATE.port(0), 1, True, datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        net = Net()
        ddp = nn.parallel.DistributedDataParallel(net)
        assert all(k.startswith("module.") for k in ddp.state_dict())
        assert set(named_state(ddp)) == EXPECTED
        compiled_ddp = torch.compile(ddp)
        assert set(named_state(compiled_ddp)) == EXPECTED
        load_named_state(ddp, weights_for(2))
        assert tensor_digests(named_state(net)) == tensor_digests(weights_for(2))
    finally:
        dist.destroy_process_group()


def test_clean_state_dict_keys():
    assert list(clean_state_dict_keys({"module._orig_mod.a.w": 1, "module._orig_mod.b": 2})) == ["a.w", "b"]
    assert list(clean_state_dict_keys({"_orig_mod.module.a": 1})) == ["a"]
    assert list(clean_state_dict_keys({"enc._orig_mod.w": 1, "x": 2})) == ["enc.w", "x"]  # compiled submodule
    # a user's child named `module` is kept when not every key carries the prefix
    assert list(clean_state_dict_keys({"module.w": 1, "head.w": 2})) == ["module.w", "head.w"]
    with pytest.raises(ValueError, match="collide"):
        clean_state_dict_keys({"a._orig_mod.w": 1, "a.w": 2})


def test_load_named_state_rejects_mismatches_and_copies_nothing():
    net = Net()
    before = tensor_digests(named_state(net))
    good = weights_for(1)
    with pytest.raises(KeyError, match=r"missing \['big'\], unexpected \['extra'\]"):
        load_named_state(net, {**{k: v for k, v in good.items() if k != "big"}, "extra": torch.zeros(1)})
    with pytest.raises(ValueError, match="fc1.weight"):
        load_named_state(net, {**good, "fc1.weight": torch.zeros(3, 3)})
    with pytest.raises(ValueError, match="stats64"):
        load_named_state(net, {**good, "stats64": good["stats64"].float()})
    assert tensor_digests(named_state(net)) == before
    load_named_state(net, good)
    assert tensor_digests(named_state(net)) == tensor_digests(good)
    assert net.bn.num_batches_tracked.item() == 7
