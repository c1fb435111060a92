"""`SyncTimings`: every weight-sync bound derived from `weightSync.timeoutSeconds` in one place."""

from __future__ import annotations

import dataclasses

import pytest

from rlightning.config import SyncTimings, WeightSyncConfig


def test_every_bound_is_the_factor_of_the_timeout_its_docstring_gives():
    timings = WeightSyncConfig(timeout_seconds=60.0).timings
    assert timings == SyncTimings(
        step=60.0,
        edge_from_parent=120.0,
        commit_wait=120.0,
        commit_bound=180.0,
        pause=30.0,
        apply=30.0,
        heartbeat_period=15.0,
        heartbeat_check=15.0,
        heartbeat_stale=120.0,
        trainer_waits=180,
        drain=60,
    )


def test_whole_second_bounds_round_each_step_up():
    timings = SyncTimings.from_timeout(1.5)
    assert (timings.trainer_waits, timings.drain) == (6, 2)  # 3 x ceil(1.5), not ceil(4.5)


def test_timings_are_frozen_and_refuse_a_timeout_that_is_not_positive():
    timings = SyncTimings.from_timeout(5.0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        timings.step = 1.0
    with pytest.raises(ValueError, match="timeoutSeconds: must be > 0, got 0"):
        SyncTimings.from_timeout(0)
