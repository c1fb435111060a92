"""PolicyGroup: sync to in-process and remote evaluators, consistency checks, checkpoints.

Ports: POLICY of tests/_ports.py (one test; no free-port probing).
"""

from __future__ import annotations

import inspect
import threading

import pytest
import torch
from policy_helpers import BOX_META, ToyPolicy, toy_batch

from rlightning import weights
from rlightning.config import PolicyConfig, WeightBufferConfig, WeightSyncConfig
from rlightning.policy import PolicyGroup
from rlightning.policy._consistency import DEFAULT_RTOL, VersionLedger
from tests._polling import wait_for
from tests._ports import POLICY

torch.set_num_threads(1)


def _trainer(seed: int = 0) -> ToyPolicy:
    policy = ToyPolicy(role_type="train")
    policy.init_train(BOX_META, seed=seed)
    for step in range(3):  # moves the weights and the BatchNorm running statistics
        policy.update_dataset(toy_batch(step))
        policy.train()
    with torch.no_grad():
        policy.scale.fill_(1.75)
    return policy


def _evaluator(strategy: str = "single", seed: int = 99) -> ToyPolicy:
    config = PolicyConfig(device="cpu", weight_buffer=WeightBufferConfig(buffer_strategy=strategy))
    policy = ToyPolicy(config, "eval")
    policy.init_eval(BOX_META, seed=seed)
    return policy


@pytest.fixture
def group() -> PolicyGroup:
    evaluators = [_evaluator("single"), _evaluator("none")]
    yield PolicyGroup(_trainer(), evaluators)
    for policy in evaluators:
        policy.close()


@pytest.mark.timeout(30)
def test_sync_makes_every_tensor_equal_including_buffers_and_bare_parameters(group: PolicyGroup) -> None:
    trainer = group.train_policy
    assert not group.verify_eval_weight_consistency()  # evaluators start from other random weights
    assert float(weights.named_state(trainer)["net.1.running_mean"].abs().sum()) > 0
    assert group.sync_weights() == 1 and trainer.weight_version == 1
    assert group.wait_for_eval_weights(timeout=5.0)
    assert group.verify_eval_weight_consistency(rtol=1e-6)
    for evaluator in group.eval_policies:
        assert evaluator.weight_version == 1
        assert evaluator.get_param_digests() == trainer.get_param_digests()
        fingerprint = evaluator.get_param_fingerprint()
        assert fingerprint == trainer.get_param_fingerprint()
        assert fingerprint["scale"] == pytest.approx(1.75)
        assert {"net.1.running_mean", "net.1.running_var", "net.1.num_batches_tracked"} <= set(fingerprint)


@pytest.mark.timeout(30)
def test_training_after_a_sync_does_not_leak_into_evaluators(group: PolicyGroup) -> None:
    group.sync_weights()
    assert group.wait_for_eval_weights(timeout=5.0)
    trainer = group.train_policy
    trainer.update_dataset(toy_batch(10))
    trainer.train()  # the synced snapshot was a copy: evaluators keep version 1's weights
    assert group.verify_eval_weight_consistency()
    assert group.eval_policies[0].get_param_digests() != trainer.get_param_digests()
    assert group.sync_weights() == 2 and group.wait_for_eval_weights(timeout=5.0)
    assert group.verify_eval_weight_consistency()
    assert group.eval_policies[1].get_param_digests() == trainer.get_param_digests()


@pytest.mark.timeout(30)
def test_a_corrupted_evaluator_is_detected(group: PolicyGroup) -> None:
    group.sync_weights()
    assert group.wait_for_eval_weights(timeout=5.0) and group.verify_eval_weight_consistency()
    with torch.no_grad():
        group.eval_policies[1].net[1].running_var.mul_(2.0)
    assert not group.verify_eval_weight_consistency()
    problems = group.eval_weight_mismatches()
    assert list(problems) == ["local-1"] and "net.1.running_var" in " ".join(problems["local-1"])


@pytest.mark.timeout(30)
def test_a_change_below_the_fingerprint_tolerance_is_caught_by_the_digest(group: PolicyGroup) -> None:
    group.sync_weights()
    assert group.wait_for_eval_weights(timeout=5.0)
    with torch.no_grad():
        scale = group.eval_policies[0].scale
        scale.copy_(torch.nextafter(scale, torch.tensor(10.0)))  # one ulp: fingerprint within 1e-6
    problems = group.eval_weight_mismatches(rtol=1e-6)
    assert problems == {"local-0": ["fingerprint or digest differs for ['scale']"]}


@pytest.mark.timeout(30)
def test_an_evaluator_that_has_not_applied_yet_is_inconsistent_and_sync_waits_for_it(group: PolicyGroup) -> None:
    held = group.eval_policies[0]
    held.hold_update = threading.Event()
    syncing = threading.Thread(target=group.sync_weights)
    try:
        syncing.start()
        assert held.update_entered.wait(5.0)
        assert "weight version" in " ".join(group.eval_weight_mismatches().get("local-0", ["weight version"]))
        assert syncing.is_alive()  # sync_weights returns only once the evaluator applied the version
    finally:
        held.hold_update.set()
        syncing.join(10.0)
    assert not syncing.is_alive() and group.verify_eval_weight_consistency()


@pytest.mark.timeout(60)
def test_every_evaluator_serves_the_new_version_right_after_sync_returns(group: PolicyGroup) -> None:
    stop = threading.Event()
    observation = {"observation": toy_batch(0)["observation"][:4]}

    def serve(policy) -> None:  # rollouts keep running: each apply waits for one to finish
        while not stop.is_set():
            policy.rollout_step({**observation, "sleep": 0.01})  # a rollout in flight delays each apply

    servers = [threading.Thread(target=serve, args=(p,), daemon=True) for p in group.eval_policies]
    for server in servers:
        server.start()
    trainer = group.train_policy
    try:
        for round_ in range(30):  # only `scale` changes: version r serves (the synced net's output) * (1 + r)
            with torch.no_grad():
                trainer.scale.fill_(1.0 + round_)
            version = group.sync_weights()
            for evaluator in group.eval_policies:
                assert evaluator.weight_version == version, (round_, evaluator.weight_version, version)
                served = evaluator.rollout_step(observation)
                with torch.no_grad():
                    expected = evaluator.net(observation["observation"]) * (1.0 + round_)
                assert torch.equal(served, expected), round_
    finally:
        stop.set()
        for server in servers:
            server.join(10.0)


@pytest.mark.timeout(30)
def test_a_bfloat16_evaluator_gets_the_weights_cast_to_bfloat16() -> None:
    low = _evaluator("single").to(torch.bfloat16)
    full = _evaluator("none")
    group = PolicyGroup(_trainer(), [low, full])
    try:
        group.sync_weights()
        held, trainer = weights.named_state(low), weights.named_state(group.train_policy)
        assert {t.dtype for t in held.values() if t.is_floating_point()} == {torch.bfloat16}
        assert all(torch.equal(held[n], t.to(held[n].dtype)) for n, t in trainer.items())
        assert full.get_param_digests() == group.train_policy.get_param_digests()  # its own dtypes: float32
        assert group.verify_eval_weight_consistency()  # each compared with what it was handed
        with torch.no_grad():
            low.scale.add_(1.0)
        assert list(group.eval_weight_mismatches()) == ["local-0"]
    finally:
        low.close()
        full.close()


def test_group_checkpoint_holds_the_weight_version(group: PolicyGroup, tmp_path) -> None:
    group.sync_weights()
    group.sync_weights()
    path = group.save_checkpoint(tmp_path / "ckpt" / "0001.pt")
    state = torch.load(path, weights_only=True)
    assert state["weight_version"] == 2 and "scale" in state["weights"]
    assert state["counters"] == {"iteration": 3, "env_steps": 48}


@pytest.mark.timeout(120)
def test_remote_evaluator_through_a_weight_sender() -> None:
    config = WeightSyncConfig(timeout_seconds=20.0, group_size=2, bucket_size_bytes=4096)
    port = POLICY.port(0)
    sender = weights.WeightSender(config, "127.0.0.1", port)
    evaluator = _evaluator("single")
    receiver = weights.WeightReceiver(config, "127.0.0.1", port, ordinal=0)
    stop = threading.Event()
    corrupt = threading.Event()

    def serve() -> None:  # what an evaluator process does: receive, apply between rollouts, report
        while not stop.is_set():
            got = receiver.receive(timeout=0.5)
            if got is not None:
                evaluator.push_weights(*got)
                evaluator.wait_for_weight_update_done(10.0)
            if corrupt.is_set():
                with torch.no_grad():
                    evaluator.scale.add_(1.0)
                corrupt.clear()
            receiver.report(weights.WeightRecord.of(evaluator.weight_version, weights.named_state(evaluator)), {})

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    group = PolicyGroup(_trainer(), sender=sender)
    try:

        def registered() -> bool:
            sender.reports()
            return 0 in sender.members

        wait_for("evaluator 0 to register", registered, timeout=60, interval=0.1)
        assert group.sync_weights() == 1
        assert group.last_sync_stats is not None and group.last_sync_stats.receivers_acked == [0]
        wait_for("the evaluator consistent with the trainer", group.verify_eval_weight_consistency, timeout=30)
        assert evaluator.get_param_digests() == group.train_policy.get_param_digests()
        corrupt.set()
        wait_for("eval-0 reported as mismatched", lambda: "eval-0" in group.eval_weight_mismatches(), timeout=30)
        assert not group.verify_eval_weight_consistency()
    finally:
        stop.set()
        thread.join(10.0)
        receiver.close()
        sender.close()
        evaluator.close()


@pytest.mark.timeout(30)
@pytest.mark.parametrize(("relative_error", "consistent"), [(4e-6, True), (4e-5, False)])
def test_the_local_and_the_report_check_agree_at_the_default_tolerance(relative_error: float, consistent: bool) -> None:
    """One rtol (`DEFAULT_RTOL`) and one comparison for in-process evaluators and for remote reports."""
    group = PolicyGroup(_trainer())
    version = group.sync_weights()
    state = weights.named_state(group.train_policy)
    fingerprint = {name: value * (1 + relative_error) for name, value in weights.l2_fingerprint(state).items()}
    report = weights.ReceiverReport(0, weights.WeightRecord(version, fingerprint), {}, 0.0)  # no digests
    verdict = group.check_reports({0: report})
    assert verdict.consistent is consistent and verdict.on_latest == [0]
    for method in (PolicyGroup.eval_weight_mismatches, PolicyGroup.verify_eval_weight_consistency,
                   PolicyGroup.check_reports, VersionLedger.check):  # fmt: skip
        assert inspect.signature(method).parameters["rtol"].default == DEFAULT_RTOL
