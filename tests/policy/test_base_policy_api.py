"""The seed's BasePolicy API and module functions, member by member."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

import pytest
import torch
from policy_helpers import BOX_META, ToyPolicy, obs, toy_batch

import rlightning.policy
from rlightning.config import OptimConfig, PolicyConfig, TrainConfig
from rlightning.policy import (
    BasePolicy,
    PolicyRole,
    build_policy,
    clone_checkpoint_value,
    infer_train_dp_world_size,
    load_policy_class,
    set_nested_attr,
)
from rlightning.policy._optim import make_optimizer

torch.set_num_threads(1)


def test_policy_role_values() -> None:
    assert [role.value for role in PolicyRole] == ["train", "eval"]
    assert PolicyRole("train") is PolicyRole.TRAIN and PolicyRole.EVAL == "eval"


def test_bad_role_is_a_value_error_naming_the_choices() -> None:
    with pytest.raises(ValueError, match=r"role_type must be one of 'train', 'eval', got 'serve'"):
        ToyPolicy(role_type="serve")


def test_config_must_be_a_policy_config() -> None:
    with pytest.raises(TypeError, match="PolicyConfig"):
        ToyPolicy(config={"policy_class": "x:Y"})


def test_constructor_state_before_init() -> None:
    policy = ToyPolicy(role_type=PolicyRole.EVAL)
    assert policy.role_type is PolicyRole.EVAL
    assert not policy.is_initialized()
    assert policy.device == torch.device("cpu")
    assert policy.rollout_mode == "sync" and policy.model_list == [] and policy.weight_version == 0
    with pytest.raises(RuntimeError, match="init_eval or init_train"):
        policy.rollout(obs())


def test_init_eval_builds_in_eval_mode_and_finds_models() -> None:
    policy = ToyPolicy()
    policy.init_eval(BOX_META, seed=1)
    try:
        assert policy.is_initialized()
        assert not policy.training and not policy.net.training
        assert [name for name, _ in policy.model_list] == ["net"]
        assert policy.rollout(obs(2)).shape == (2, 2)
        assert policy._update_thread.is_alive()
    finally:
        policy.close()
    assert not policy._update_thread.is_alive()


def test_eval_switches_mode_without_running_the_training_step() -> None:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, seed=0)
    assert policy.training
    assert policy.eval() is policy and not policy.net.training
    assert policy.iteration == 0  # `train` (the update) did not run


def test_init_train_builds_optimizer_and_counts() -> None:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, TrainConfig(total_env_steps=100), seed=0)
    assert policy.training and policy.optimizer is not None and policy.dp_world_size == 1
    before = policy.get_param_fingerprint()
    policy.update_dataset(toy_batch(0))
    policy.train()
    assert policy.iteration == 1 and policy.env_steps == 16
    assert policy.get_param_fingerprint() != before


def test_reset_training_state_rebuilds_deterministically_and_keeps_weight_version() -> None:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, seed=3)
    initial = policy.get_param_digests()
    policy.update_dataset(toy_batch(0))
    policy.train()
    policy.weight_version = 7
    policy.reset_training_state(TrainConfig(), BOX_META, seed=3)
    assert policy.get_param_digests() == initial
    assert policy.iteration == 0 and policy.env_steps == 0 and policy.weight_version == 7
    evaluator = ToyPolicy()
    with pytest.raises(RuntimeError, match="role 'train'"):
        evaluator.reset_training_state(TrainConfig(), BOX_META, seed=0)


def test_fingerprint_and_digests_cover_bare_parameters_and_buffers() -> None:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, seed=0)
    fingerprint = policy.get_param_fingerprint()
    for name in ("scale", "net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked", "net.0.weight"):
        assert name in fingerprint
    assert fingerprint["scale"] == pytest.approx(1.0)
    assert set(policy.get_param_digests()) == set(fingerprint)


def test_get_trainable_parameters_is_per_module() -> None:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, seed=0)
    params = policy.get_trainable_parameters()
    assert list(params) == ["net"] and "1.running_mean" in params["net"]


def test_request_accounting_and_timing_summary(capsys: pytest.CaptureFixture[str]) -> None:
    policy = ToyPolicy()
    policy.init_eval(BOX_META)
    try:
        assert policy.get_num_requests() == 0 and policy.check_idle(timeout=1.0)
        for _ in range(3):
            policy.rollout(obs())
        summary = policy.print_timing_summary(reset=True)
        row = summary["rollout"]
        assert row["count"] == 3 and row["total_s"] > 0
        assert row["mean_s"] == pytest.approx(row["total_s"] / 3) and row["mean_s"] <= row["max_s"] <= row["total_s"]
        assert "rollout" in capsys.readouterr().out
        assert policy.print_timing_summary() == {}
    finally:
        policy.close()


def test_timings_stay_bounded_however_many_rollouts() -> None:
    # A pod rolls out for days: the memory the policy package holds for timings must not grow per call.
    policy = ToyPolicy()
    policy.init_eval(BOX_META)
    policy_files = tracemalloc.Filter(True, str(Path(rlightning.policy.__file__).parent / "*"))
    try:
        for _ in range(50):  # warm up: first-call allocations (dicts, caches) are not growth
            policy.rollout(obs(1))
        tracemalloc.start()
        try:
            before = tracemalloc.take_snapshot().filter_traces([policy_files])
            for _ in range(2000):
                policy.rollout(obs(1))
            after = tracemalloc.take_snapshot().filter_traces([policy_files])
        finally:
            tracemalloc.stop()
        grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
        assert grown < 4096, f"timings grew by {grown} bytes over 2000 rollouts"
        assert policy.timings.stats("rollout").count == 2050
    finally:
        policy.close()


def test_set_nested_attr() -> None:
    policy = ToyPolicy()
    policy.init_eval(BOX_META)
    policy.close()
    replacement = torch.nn.Linear(3, 8)
    set_nested_attr(policy, "net.0", replacement)
    assert policy.net[0] is replacement
    with pytest.raises(AttributeError):
        set_nested_attr(policy, "missing.child", 1)


def test_infer_train_dp_world_size(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    assert infer_train_dp_world_size() == 1
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert infer_train_dp_world_size() == 4
    monkeypatch.setenv("WORLD_SIZE", "zero")
    with pytest.raises(ValueError, match="WORLD_SIZE"):
        infer_train_dp_world_size()


def test_init_train_with_world_size_above_one_needs_a_process_group(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="not initialised"):
        ToyPolicy(role_type="train").init_train(BOX_META)


def test_clone_checkpoint_value_is_deep() -> None:
    tensor = torch.ones(3, requires_grad=True)
    value = {"a": [tensor, (tensor, 2)], "b": {"c": "x"}}
    clone = clone_checkpoint_value(value)
    with torch.no_grad():
        tensor.add_(1)
    value["b"]["c"] = "y"
    assert torch.equal(clone["a"][0], torch.ones(3)) and not clone["a"][0].requires_grad
    assert isinstance(clone["a"][1], tuple) and clone["a"][1][1] == 2 and clone["b"]["c"] == "x"


def test_load_policy_class_and_its_errors() -> None:
    from rlightning.policy.ppo import PPOPolicy

    assert load_policy_class("rlightning.policy.ppo:PPOPolicy") is PPOPolicy
    with pytest.raises(ValueError, match="package.module:ClassName"):
        load_policy_class("rlightning.policy.ppo.PPOPolicy")
    with pytest.raises(ImportError, match="no_such_module"):
        load_policy_class("no_such_module:X")
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        load_policy_class("rlightning.policy.ppo:Nope")
    with pytest.raises(TypeError, match="not a subclass"):
        load_policy_class("rlightning.policy.ppo:PPOKwargs")
    with pytest.raises(TypeError, match="abstract"):
        load_policy_class("rlightning.policy.base_policy:BasePolicy")


def test_build_policy_from_spec_validates_kwargs() -> None:
    policy = build_policy(PolicyConfig(policy_kwargs={"hiddenSizes": [16]}), "eval")
    assert isinstance(policy, BasePolicy) and policy.kwargs.hidden_sizes == [16]
    with pytest.raises(ValueError, match="clipCoef"):
        build_policy(PolicyConfig(policy_kwargs={"clipCoef": -1}), "eval")


@pytest.mark.parametrize(("name", "fused"), [("adam", True), ("adamw", True), ("sgd", None)])
def test_adam_on_cpu_parameters_is_fused_and_takes_parameters_or_groups(name: str, fused: bool | None) -> None:
    layer = torch.nn.Linear(3, 2)
    cfg = OptimConfig(name=name, lr=0.1)
    plain = make_optimizer(layer.parameters(), cfg)
    grouped = make_optimizer([{"params": [layer.weight]}, {"params": iter([layer.bias]), "lr": 0.5}], cfg)
    assert plain.defaults.get("fused") == fused and grouped.defaults.get("fused") == fused
    assert [len(g["params"]) for g in plain.param_groups] == [2]
    assert [(len(g["params"]), g["lr"]) for g in grouped.param_groups] == [(1, 0.1), (1, 0.5)]
    layer(torch.ones(1, 3)).sum().backward()
    before = layer.weight.detach().clone()
    plain.step()
    assert not torch.equal(layer.weight, before)
