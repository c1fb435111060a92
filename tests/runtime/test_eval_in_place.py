"""An evaluator that receives in place (`bufferStrategy: none`): Ready once it holds a version, and after a receive
that stopped part way it holds none: not Ready, no pull answered, no evaluation episode until the next version.

The evaluator runs in this process (its main loop on a thread) against a real `WeightSender`; the torn receive is
what `WeightReceiver` does when a transfer fails after the first one landed (`begin_weight_receive`, then
`end_weight_receive(None)`), which tests/weights/test_weight_relay.py causes for real by killing a relay.
"""

from __future__ import annotations

import pytest
import torch

from rlightning import weights
from tests._polling import wait_for


@pytest.mark.timeout(120)
def test_in_place_evaluator_holds_no_version_after_a_torn_receive_until_the_next(evaluator_in_process) -> None:
    evaluator, sender, runner = evaluator_in_process("in-place", policy={"weightBuffer": {"bufferStrategy": "none"}})
    health = evaluator.health_file
    assert health is not None and evaluator._in_place is evaluator
    runner.start()
    wait_for("the evaluator to register", lambda: 0 in sender.members, 30.0, interval=0.05)
    state = {n: torch.full_like(t, 0.01) for n, t in weights.named_state(evaluator.policy).items()}
    assert sender.publish(state).receivers_acked == [0]  # an ack means applied: in the policy's own tensors
    assert evaluator.policy.weight_version == 1
    wait_for("readiness with version 1", health.exists, 10.0, interval=0.05)  # touched once the receive returned
    wait_for("an evaluation episode with version 1", lambda: evaluator.record.episodes > 0, 30.0, interval=0.05)

    played: list[tuple[int, int]] = []  # (version at the start, at the end) of every episode counted
    count = evaluator.record.add

    def add(ret: float, before: int, after: int, enough: int | None = None) -> dict[str, float] | None:
        played.append((before, after))
        return count(ret, before, after, enough)

    evaluator.record.add = add
    assert evaluator.begin_weight_receive(5.0)  # a receive in place that fails after its first transfer
    evaluator.end_weight_receive(None)
    assert evaluator.policy.weight_version == 0 and not health.exists()
    assert evaluator.held_weights() == (0, {})  # a restarted trainer pulls from another evaluator
    stats = sender.publish({n: torch.full_like(t, 0.02) for n, t in state.items()})
    assert stats.receivers_acked == [0] and evaluator.policy.weight_version == 2
    wait_for("readiness with version 2", health.exists, 10.0, interval=0.05)
    wait_for("an evaluation episode with version 2", lambda: (2, 2) in played, 30.0, interval=0.05)
    # nothing counted was played with the torn weights: none started without a version
    assert all(before != 0 for before, _ in played), played
    held_version, held = evaluator.held_weights()
    assert held_version == 2 and all(torch.all(t == 0.02) for t in held.values() if t.is_floating_point())
