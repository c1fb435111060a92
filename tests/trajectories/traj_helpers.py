"""Batches whose content proves they arrived whole, and bounded readers of worker processes' JSON lines."""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
from tensordict import TensorDict

from tests._polling import wait_for

HERE = Path(__file__).resolve().parent
FEATURES = 16


def make_batch(ordinal: int, sequence: int, rows: int, omit: str = "") -> TensorDict:
    """A `[rows]` batch: float32 observations all equal to `marker(ordinal, sequence)`, int64 actions, bool dones."""
    batch = TensorDict(
        {
            "observation": torch.full((rows, FEATURES), marker(ordinal, sequence), dtype=torch.float32),
            "action": torch.arange(rows, dtype=torch.int64),
            "next": {"done": torch.arange(rows) % 2 == 0, "reward": torch.ones(rows, dtype=torch.float32)},
        },
        batch_size=[rows],
    )
    if omit:
        del batch[omit]
    return batch


def held_state(version: int) -> dict[str, torch.Tensor]:
    """Weights an evaluator stand-in holds at `version` (none at 0): values that differ by version, three dtypes."""
    if version == 0:
        return {}
    generator = torch.Generator().manual_seed(version)
    return {
        "agent.fc.weight": torch.randn(8, 4, generator=generator),
        "agent.fc.bias": torch.randn(8, generator=generator).to(torch.bfloat16),
        "agent.norm.num_batches_tracked": torch.tensor(version, dtype=torch.int64),
    }


def marker(ordinal: int, sequence: int) -> float:
    """The value every observation of a batch holds (exact in float32 for the counts the tests use)."""
    return float(ordinal * 10_000 + sequence)


def is_whole(batch: TensorDict, ordinal: int, sequence: int, rows: int) -> bool:
    """Whether a received batch is the one `make_batch` built, every element intact."""
    obs = batch["observation"]
    return (
        tuple(batch.batch_size) == (rows,)
        and tuple(obs.shape) == (rows, FEATURES)
        and bool((obs == marker(ordinal, sequence)).all())
        and bool((batch["action"] == torch.arange(rows)).all())
        and bool((batch["next", "done"] == (torch.arange(rows) % 2 == 0)).all())
    )


SENDER = "traj_sender.py"
"""An evaluator stand-in streaming batches."""
INTAKE = "traj_intake.py"
"""A trainer rank stand-in reading batches."""


class WorkerProcess:
    """`SENDER` or `INTAKE` in its own process; its JSON stdout lines are parsed on a reader thread."""

    def __init__(self, script: str, *args: str) -> None:
        path = [str(HERE), str(HERE.parents[1]), os.environ.get("PYTHONPATH", "")]  # its neighbours, and `tests`
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / script), *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        self.events: queue.Queue[dict] = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.events.put(json.loads(line))

    def poll_event(self, kind: str, since: int = 0) -> dict | None:
        """The first event of `kind` among those seen from index `since` on, reading what has arrived without
        waiting; None when none yet."""
        while True:
            try:
                self.seen.append(self.events.get_nowait())
            except queue.Empty:
                break
        return next((event for event in self.seen[since:] if event["event"] == kind), None)

    def next_event(self, timeout: float, kind: str | None = None) -> dict:
        """The next event (of `kind`, skipping others), waiting at most `timeout` seconds in all."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                event = self.events.get(timeout=max(left, 0.001))
            except queue.Empty:
                raise AssertionError(f"no {kind or 'event'} from the worker within {timeout}s "
                                     f"(exit code {self.proc.poll()})") from None
            self.seen.append(event)
            if kind is None or event["event"] == kind:
                return event


def fill_until_done(intake, senders: list[WorkerProcess], version: int, max_policy_lag: int, timeout: float) -> list:
    """Let `intake` read (never reaching its count) until every sender reported "done"; return their done events.

    Raises:
        AssertionError: After `timeout` seconds.
    """
    deadline = time.monotonic() + timeout
    while True:
        done = [sender.poll_event("done") for sender in senders]
        if all(done):
            return done
        if time.monotonic() > deadline:
            raise AssertionError(f"senders not done within {timeout}s: {[s.seen[-3:] for s in senders]}")
        intake.fill(intake.held + 1_000_000, version=version, max_policy_lag=max_policy_lag, timeout=0.2)


def pump_until(what: str, condition, sender, timeout: float) -> None:
    """Process `sender`'s acknowledgements and notices until `condition()` holds, at most `timeout` seconds
    (`tests._polling.wait_for`, which names `what` when it times out)."""
    def pumped() -> bool:
        if condition():
            return True
        sender.wait_for_credit(0.05)  # bounded: the sender handles its acknowledgements and notices meanwhile
        return False

    wait_for(what, pumped, timeout, interval=0)
