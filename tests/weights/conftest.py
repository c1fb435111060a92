"""Fixtures shared by the weight-sync tests that start real receiver and sender processes."""

from __future__ import annotations

import os
import signal

import pytest


@pytest.fixture
def procs():
    """Processes a test started (append to the list); killed (stopped ones resumed first) and reaped after it.

    A process whose stderr was piped and not read by the test gets its tail printed, so a failure shows it.
    """
    started: list = []
    yield started
    for p in started:
        if p.poll() is None:
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
        p.wait(10)
        if p.stderr is not None and not p.stderr.closed:
            print(f"--- pid {p.pid} stderr (tail) ---\n{p.stderr.read()[-3000:]}")
