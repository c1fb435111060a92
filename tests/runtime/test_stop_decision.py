"""The stop decision (`rlightning.runtime._stop`): a table of inputs and the reason they give, in milliseconds."""

from __future__ import annotations

import dataclasses

import pytest

from rlightning.runtime._stop import (
    RETRY_TARGET_AFTER_ITERATIONS,
    RecentReturns,
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
        (case(train_return=480.0), True, None),  # the training episodes reached it: confirm too
        (case(fleet_return=400.0, train_return=470.0), False, None),  # neither reached it
        (case(train_return=500.0, confirmed_return=470.0), True, None),  # training return alone never stops the run
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


def test_recent_returns_mean_the_latest_iterations_holding_enough_episodes():
    recent = RecentReturns(5)
    recent.add(900.0, 3)
    assert recent.mean() is None  # fewer than 5 episodes so far
    recent.add(0.0, 0)  # an iteration where no episode finished changes nothing
    recent.add(1000.0, 2)
    assert recent.mean() == 380.0
    recent.add(2500.0, 5)  # alone enough: the older iterations drop out
    assert recent.mean() == 500.0
