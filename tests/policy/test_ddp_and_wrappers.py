"""DDP (real gloo groups, real processes) and state dicts of wrapped models loading into plain ones."""

from __future__ import annotations

import datetime
import weakref
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from rlightning.config import EnvConfig, PolicyConfig
from rlightning.policy import EnvMeta, PolicyGroup, PPOPolicy, _ddp
from tests._gloo_workers import run_ranks

torch.set_num_threads(1)
HERE = Path(__file__).resolve().parent
CONFIG = PolicyConfig(device="cpu", policy_kwargs={"hiddenSizes": [16]})
META = EnvMeta.from_env_config(EnvConfig(id="Pendulum-v1"))  # Box actions: a bare log-std parameter too


def _policy(seed: int) -> PPOPolicy:
    policy = PPOPolicy(CONFIG, "train")
    policy.init_train(META, seed=seed)
    return policy


@pytest.fixture
def one_rank_group():
    store = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=datetime.timedelta(seconds=30))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.mark.timeout(60)
def test_ddp_wrapped_state_dict_loads_into_a_plain_policy(one_rank_group) -> None:
    source = _policy(seed=1)
    source.agent = torch.nn.parallel.DistributedDataParallel(source.agent)  # CPU: no device_ids
    keys = list(source.state_dict())
    assert "agent.module.log_std" in keys and all(key.startswith("agent.module.") for key in keys)
    assert "agent.log_std" in source.get_param_fingerprint()  # fingerprints use clean names
    target = _policy(seed=2)
    assert target.get_param_digests() != source.get_param_digests()
    target.load_state_dict(source.state_dict())
    assert target.get_param_digests() == source.get_param_digests()


@pytest.mark.timeout(60)
def test_ddp_wrapping_on_cpu_and_the_bare_parameter_rule(one_rank_group) -> None:
    from policy_helpers import BOX_META, ToyPolicy

    policy = _policy(seed=1)
    # world size 2 is what a 2-rank run sees; the 1-rank group stands in for it
    policy.model_list = _ddp.wrap_children_in_ddp(policy, policy.model_list, policy.device, world_size=2)
    assert isinstance(policy.agent, torch.nn.parallel.DistributedDataParallel) and policy.agent.device_ids is None
    assert policy.model_list == [("agent", policy.agent)] and policy.network is policy.agent.module
    digests, wrapper = policy.get_param_digests(), weakref.ref(policy.agent)
    policy.close()  # the wrapper's reducer holds the group: gone before destroy_process_group
    assert wrapper() is None and policy.model_list == [("agent", policy.agent)] and policy.agent is policy.network
    assert policy.get_param_digests() == digests
    toy = ToyPolicy(role_type="train")
    toy.init_train(BOX_META, seed=0)
    with pytest.raises(ValueError, match=r"\['scale'\] are not inside a child module"):
        _ddp.wrap_children_in_ddp(toy, toy.model_list, toy.device, world_size=2)


@pytest.mark.timeout(60)
def test_a_ddp_wrapped_trainer_syncs_to_a_plain_evaluator(one_rank_group) -> None:
    trainer = _policy(seed=1)
    trainer.agent = torch.nn.parallel.DistributedDataParallel(trainer.agent)
    evaluator = PPOPolicy(CONFIG, "eval")
    evaluator.init_eval(META, seed=2)
    try:
        group = PolicyGroup(trainer, [evaluator])
        group.sync_weights()
        assert group.wait_for_eval_weights(timeout=10.0) and group.verify_eval_weight_consistency()
        assert evaluator.get_param_digests() == trainer.get_param_digests()
    finally:
        evaluator.close()


def test_compiled_state_dict_loads_into_a_plain_policy() -> None:
    source = _policy(seed=1)
    source.agent = torch.compile(source.agent)  # lazy: nothing is compiled unless called
    assert any("_orig_mod" in key for key in source.state_dict())
    target = _policy(seed=2)
    target.load_state_dict(source.state_dict())
    assert target.get_param_digests() == source.get_param_digests()


def test_strict_load_rejects_foreign_keys_and_non_strict_loads_the_overlap() -> None:
    source, target = _policy(seed=1), _policy(seed=2)
    state = dict(source.state_dict())
    state["agent.extra"] = torch.zeros(1)
    with pytest.raises(KeyError, match="agent.extra"):
        target.load_state_dict(state)
    del state["agent.log_std"]
    target.load_state_dict(state, strict=False)
    digests, expected = target.get_param_digests(), source.get_param_digests()
    assert all(digests[name] == expected[name] for name in expected if name != "agent.log_std")


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_rank_ddp_update_keeps_ranks_identical(tmp_path: Path) -> None:
    results = run_ranks(HERE / "ddp_worker.py", 2, tmp_path, [[], []])
    for result in results:
        assert result["ddp"] and result["world_size"] == 2
        assert result["env_steps"] == 32 * 4 * 2  # summed over ranks
    assert results[0]["after_wrap"] == results[1]["after_wrap"]  # DDP broadcast rank 0's initial weights
    assert results[0]["observation_sum"] != results[1]["observation_sum"]  # each rank collected its own envs
    assert results[0]["after_update"] == results[1]["after_update"]  # gradients were all-reduced
    assert results[0]["after_update"] != results[0]["after_wrap"]


@pytest.mark.timeout(60)
def test_parallel_ddp_wraps_even_at_world_size_1(one_rank_group) -> None:
    from rlightning.config import TrainConfig

    forced = PPOPolicy(CONFIG, "train")
    forced.init_train(META, TrainConfig(parallel="ddp"), seed=1)
    assert isinstance(forced.agent, torch.nn.parallel.DistributedDataParallel)
    default = PPOPolicy(CONFIG, "train")
    default.init_train(META, TrainConfig(), seed=1)  # parallel unset: DDP only above world size 1
    assert not isinstance(default.agent, torch.nn.parallel.DistributedDataParallel)


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_two_ranks_share_observation_statistics_and_the_kl_early_stop(tmp_path: Path) -> None:
    import json

    kwargs = json.dumps(
        {"hiddenSizes": [16], "updateEpochs": 6, "numMinibatches": 2, "normalizeObservations": True, "targetKl": 1e-9}
    )
    results = run_ranks(HERE / "ddp_worker.py", 2, tmp_path, [[kwargs], [kwargs]])
    assert results[0]["observation_sum"] != results[1]["observation_sum"]  # each rank collected its own envs
    assert results[0]["after_update"] == results[1]["after_update"]  # weights and statistics alike
    assert "agent.obs_norm.mean" in results[0]["after_update"]
    both = [(a + b) / 2 for a, b in zip(results[0]["observation_mean"], results[1]["observation_mean"], strict=True)]
    assert results[0]["obs_norm_mean"] == pytest.approx(both, rel=1e-6, abs=1e-9)  # moments of both ranks' data
    assert [r["metrics"]["epochs"] for r in results] == [1.0, 1.0]  # stopped alike, after the first epoch
