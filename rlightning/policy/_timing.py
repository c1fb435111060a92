"""Durations of a policy's phases (`rollout`, `update_weights`) as running aggregates.

A pod runs for days and rolls out millions of times, so no per-call sample is kept: each phase holds a count,
a total and a maximum, and its memory does not grow with the number of calls.
"""

from __future__ import annotations

import dataclasses
import threading


@dataclasses.dataclass
class PhaseStats:
    """Running aggregates of one phase's durations.

    Attributes:
        count (int): Calls recorded.
        total_s (float): Sum of their durations, in seconds.
        max_s (float): The longest duration, in seconds; 0.0 before any call.
    """

    count: int = 0
    total_s: float = 0.0
    max_s: float = 0.0

    @property
    def mean_s(self) -> float:
        """float: Mean duration in seconds; 0.0 before any call."""
        return self.total_s / self.count if self.count else 0.0


class PhaseTimings:
    """Thread-safe `PhaseStats` by phase name (rollouts of async mode record from executor threads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._stats: dict[str, PhaseStats] = {}

    def record(self, phase: str, seconds: float) -> None:
        """Add one duration to `phase`'s aggregates.

        Args:
            phase (str): The phase name, for example `rollout`.
            seconds (float): The duration, in seconds.
        """
        with self._lock:
            stats = self._stats.setdefault(phase, PhaseStats())
            stats.count += 1
            stats.total_s += seconds
            stats.max_s = max(stats.max_s, seconds)

    def stats(self, phase: str) -> PhaseStats:
        """A copy of `phase`'s aggregates.

        Args:
            phase (str): The phase name.

        Returns:
            PhaseStats: The aggregates; all zero when the phase was never recorded.
        """
        with self._lock:
            return dataclasses.replace(self._stats.get(phase, PhaseStats()))

    def snapshot(self, reset: bool = False) -> dict[str, PhaseStats]:
        """Copies of every phase's aggregates.

        Args:
            reset (bool, optional): Forget every phase in the same step, so no duration recorded meanwhile is
                lost. Defaults to False.

        Returns:
            dict[str, PhaseStats]: Aggregates by phase name, sorted by name.
        """
        with self._lock:
            copies = {phase: dataclasses.replace(stats) for phase, stats in sorted(self._stats.items())}
            if reset:
                self._stats.clear()
            return copies
