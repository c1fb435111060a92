"""Start-up phases of a run: seconds from the launch to each milestone of trainer rank 0, for summary.json.

The launch is `ENV_LAUNCH_TIME` (epoch seconds when `rlightning run` started, set for its children); in pods, where
it is unset, the start of rank 0's own process. Phases, in the order they are reached (`PHASES`):

- `process`: rank 0's process started (the launcher's imports and checks, spawning, torchrun's agent);
- `imports`: its modules imported (torch, tensordict, the runtime);
- `rendezvous`: the DDP default group joined (every rank up);
- `policy`: the policy built and wrapped for DDP, the resume decided;
- `registration`: the evaluators registered with the weight sender (`_fleet.Fleet.await_rejoin`);
- `first_publish`: the first weights acknowledged by the evaluators;
- `first_batch`: every rank holds its first dataset;
- `first_iteration`: the first update trained and recorded.
"""

from __future__ import annotations

import os
import time

PHASES = (
    "process", "imports", "rendezvous", "policy", "registration", "first_publish", "first_batch", "first_iteration",
)  # fmt: skip


def process_start_time() -> float | None:
    """Epoch seconds when this process started, to the kernel's clock tick (Linux `/proc/self/stat` field 22).

    Returns:
        float | None: The start time; None where `/proc` or `CLOCK_BOOTTIME` is missing.
    """
    try:
        with open("/proc/self/stat", encoding="ascii") as stat:
            fields = stat.read().rpartition(")")[2].split()  # the name in parentheses may hold spaces
        ticks = int(fields[19])  # field 22, starttime: clock ticks after boot; fields[0] is field 3
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return time.time() - age


class StartupClock:
    """Marks the start-up phases of trainer rank 0 against the launch.

    Args:
        launched_at (float | None): Epoch seconds of the launch (`ProcessSettings.launch_time`); None: this
            process's start (`process_start_time`), else now.

    Examples:
        >>> clock = StartupClock(launched_at=None)
        >>> clock.mark("imports")
        >>> clock.seconds()  # {"process": 0.0, "imports": 2.31}
    """

    def __init__(self, launched_at: float | None) -> None:
        started = process_start_time()
        self.launched_at = launched_at or started or time.time()
        self._marks: dict[str, float] = {}
        self.mark("process", started or self.launched_at)

    def mark(self, phase: str, at: float | None = None) -> None:
        """Record that `phase` ended now (or at epoch `at`); a phase already marked keeps its first time.

        Raises:
            ValueError: `phase` is not one of `PHASES`.
        """
        if phase not in PHASES:
            raise ValueError(f"phase: must be one of {PHASES}, got {phase!r}")
        self._marks.setdefault(phase, round(max(0.0, (time.time() if at is None else at) - self.launched_at), 3))

    def seconds(self) -> dict[str, float]:
        """Seconds from the launch to the end of each phase marked so far, in `PHASES` order."""
        return {phase: self._marks[phase] for phase in PHASES if phase in self._marks}
