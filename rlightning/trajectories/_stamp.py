"""`BatchStamp`: where a trajectory batch came from and which weights produced it (pure data, no I/O)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class BatchStamp:
    """What the trainer needs to judge and account for one trajectory batch.

    Attributes:
        version (int): The weight version applied when the batch's first step was taken, so the oldest in it (>= 0).
        ordinal (int): The evaluator that produced it (its StatefulSet ordinal, >= 0).
        sequence (int): The batch's number at that evaluator, from 1; a restarted evaluator starts again at 1.
        env_steps (int): Environment steps in the batch (every env of every time step, >= 0).
        episode_returns (tuple[float, ...]): Undiscounted returns of the episodes that finished inside the batch.
        episode_lengths (tuple[int, ...]): Their lengths in steps, in the same order.
        epoch (int): The epoch (trainer attempt) of the publish `version` came from (>= 0): a trainer drops batches
            acted with an older attempt's weights than its own (`rlightning.weights._epoch`).

    Raises:
        ValueError: Naming the field, when a field breaks the rule above (a bool is not an int here).
    """

    version: int
    ordinal: int
    sequence: int
    env_steps: int
    episode_returns: tuple[float, ...] = ()
    episode_lengths: tuple[int, ...] = ()
    epoch: int = 0

    def __post_init__(self) -> None:
        for name, low in (("version", 0), ("ordinal", 0), ("sequence", 1), ("env_steps", 0), ("epoch", 0)):
            value = getattr(self, name)
            if not _is_int(value) or value < low:
                raise ValueError(f"stamp.{name}: must be an integer >= {low}, got {value!r}")
        if not isinstance(self.episode_returns, tuple) or not all(
            isinstance(r, (int, float)) and not isinstance(r, bool) for r in self.episode_returns
        ):
            raise ValueError(f"stamp.episode_returns: must be a tuple of numbers, got {self.episode_returns!r}")
        if not isinstance(self.episode_lengths, tuple) or not all(
            _is_int(n) and n >= 1 for n in self.episode_lengths
        ):
            raise ValueError(f"stamp.episode_lengths: must be a tuple of integers >= 1, got {self.episode_lengths!r}")
        if len(self.episode_returns) != len(self.episode_lengths):
            raise ValueError(
                f"stamp.episode_lengths: must have one entry per episode return ({len(self.episode_returns)}), "
                f"got {len(self.episode_lengths)}"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
