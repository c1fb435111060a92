"""Fixtures of the trajectory tests: worker processes killed and reaped after each test, intakes closed."""

from __future__ import annotations

import pytest


@pytest.fixture
def senders():
    """`traj_helpers.WorkerProcess`es a test started (append to the list); killed and reaped after it."""
    started: list = []
    yield started
    for sender in started:
        if sender.proc.poll() is None:
            sender.proc.kill()
        sender.proc.wait(10)
        if sender.proc.returncode not in (0, -9):
            print(f"--- sender pid {sender.proc.pid} stderr (tail) ---\n{sender.proc.stderr.read()[-3000:]}")


@pytest.fixture
def intakes():
    """`TrajectoryIntake`s a test opened (append to the list); closed after it."""
    opened: list = []
    yield opened
    for intake in opened:
        intake.close()
