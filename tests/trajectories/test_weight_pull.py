"""A restarted trainer's pull of the weights the evaluators hold, over the trajectory connections: real sender
processes answer an intake's `pull_weights`.

Ports: TRAJECTORIES 5 (reused from test_flow_control.py, one test after the other; each closes its intake).
"""

from __future__ import annotations

import time

import pytest
import torch
from traj_helpers import SENDER, WorkerProcess, held_state

from rlightning.trajectories import TrajectoryIntake, decode_weights, encode_weights
from rlightning.trajectories._intake import PULL_ANSWER_SECONDS
from tests._ports import TRAJECTORIES

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

PULL_SECONDS = 60.0


def _exactly(state: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> bool:
    return state.keys() == expected.keys() and all(
        state[name].dtype == expected[name].dtype and torch.equal(state[name], expected[name]) for name in expected
    )


def test_weights_round_trip_bit_for_bit_with_their_version_and_ordinal() -> None:
    held = decode_weights(encode_weights(9, 4, held_state(9)))
    assert (held.version, held.ordinal) == (9, 4)
    assert _exactly(held.state, held_state(9))
    with pytest.raises(ValueError, match="metadata.version"):
        decode_weights(encode_weights(9, 4, held_state(9)).replace(b'"version":"9"', b'"version":"x"'))


def test_the_pull_ends_with_the_evaluator_holding_the_fleets_version_and_keeps_its_batches(senders, intakes) -> None:
    port = TRAJECTORIES.port(5)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    endpoint = f"127.0.0.1:{port}"
    # One evaluator that holds nothing yet, one that holds version 7; both stream batches meanwhile.
    empty = WorkerProcess(SENDER, "--endpoints", endpoint, "--ordinal", "0", "--count", "0", "--hold-version", "0")
    holder = WorkerProcess(SENDER, "--endpoints", endpoint, "--ordinal", "1", "--count", "0", "--hold-version", "7",
                           "--versions", "7")
    senders.extend([empty, holder])
    held = intake.pull_weights(7, PULL_SECONDS)
    assert held is not None, "no evaluator answered"
    assert (held.version, held.ordinal) == (7, 1)
    assert _exactly(held.state, held_state(7))
    # The batches read during the pull were kept for the next fill, judged and acknowledged there.
    assert intake.fill(2, version=7, max_policy_lag=0, timeout=PULL_SECONDS)
    assert {(stamp.ordinal, stamp.version) for _, stamp in intake.drain()} == {(1, 7)}
    assert intake.stats.invalid == 0


def test_without_the_fleets_version_the_pull_takes_the_newest_answer(senders, intakes) -> None:
    port = TRAJECTORIES.port(5)
    intake = TrajectoryIntake(port, bind_host="127.0.0.1")
    intakes.append(intake)
    older = WorkerProcess(SENDER, "--endpoints", f"127.0.0.1:{port}", "--ordinal", "2", "--count", "0",
                          "--hold-version", "3")
    senders.append(older)
    started = time.monotonic()
    held = intake.pull_weights(4, PULL_SECONDS)  # version 4's holder is gone
    assert held is not None and (held.version, held.ordinal) == (3, 2)
    assert _exactly(held.state, held_state(3))
    assert time.monotonic() - started < PULL_SECONDS - PULL_ANSWER_SECONDS  # ended once every evaluator answered


def test_with_no_evaluator_the_pull_ends_empty_at_its_timeout(intakes) -> None:
    intake = TrajectoryIntake(TRAJECTORIES.port(5), bind_host="127.0.0.1")
    intakes.append(intake)
    started = time.monotonic()
    assert intake.pull_weights(1, 1.5) is None
    assert 1.5 <= time.monotonic() - started < 5.0
