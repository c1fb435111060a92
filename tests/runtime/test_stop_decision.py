"""The stop decision (`rlightning.runtime._stop`): a table of inputs and the reason they give, in milliseconds."""

from __future__ import annotations

import dataclasses

import pytest

from rlightning.runtime._stop import (
    RETRY_TARGET_AFTER_ITERATIONS,
    StopInputs,
    StopReason,
    confirmation_due,
    decide,
)

BASE = StopInputs(iteration=10, env_steps=500, total_env_steps=1000, target_eval_return=475.0, fleet_return=None)


def case(**changes: object) -> StopInputs:
    return dataclasses.replace(BASE, **changes)


@pytest.mark.parametrize(
    ("inputs", "due", "reason"),
    [
        (BASE, False, None),  # no report yet
        (case(fleet_return=400.0), False, None),  # below the target
        (case(fleet_return=475.0), True, None),  # reached: confirm on the newest weights first
        (case(fleet_return=475.0, confirmed_return=500.0), True, StopReason.TARGET_EVAL_RETURN),
        (case(fleet_return=475.0, confirmed_return=470.0), True, None),  # fell short on the newest weights
        (case(fleet_return=500.0, last_shortfall=10 - RETRY_TARGET_AFTER_ITERATIONS + 1), False, None),  # too soon
        (case(fleet_return=500.0, last_shortfall=10 - RETRY_TARGET_AFTER_ITERATIONS), True, None),  # ask again
        (case(target_eval_return=None, fleet_return=1e9, confirmed_return=1e9), False, None),  # no target
        (case(env_steps=1000), False, StopReason.TOTAL_ENV_STEPS),
        (case(env_steps=1000, fleet_return=500.0, confirmed_return=500.0), False, StopReason.TOTAL_ENV_STEPS),
        (case(interrupted=True, fleet_return=500.0), False, StopReason.INTERRUPTED),  # no confirmation wait
        (case(interrupted=True, env_steps=2000), False, StopReason.INTERRUPTED),
    ],
)
def test_stop_decision(inputs: StopInputs, due: bool, reason: StopReason | None) -> None:
    assert confirmation_due(inputs) is due
    assert decide(inputs) is reason


def test_the_more_urgent_reason_wins_the_max_all_reduce_and_keeps_its_summary_label() -> None:
    assert StopReason.INTERRUPTED > StopReason.TARGET_EVAL_RETURN > StopReason.TOTAL_ENV_STEPS > 0
    assert [r.label for r in StopReason] == ["total_env_steps", "target_eval_return", "interrupted"]
