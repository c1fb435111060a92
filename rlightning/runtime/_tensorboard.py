"""TensorBoard event files of trainer rank 0: the scalars of each metrics.jsonl row, env steps as the step axis.

Optional: the writer is torch's `SummaryWriter`, which needs the `tensorboard` package (`pip install
rlightning[tensorboard]`). Without it there is no writer, nothing is imported or written, and rank 0 logs one info
line saying so.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch.utils.tensorboard import SummaryWriter

log = logging.getLogger("rlightning.train")

TAGS: dict[str, str] = {
    "train_return": "returns/train",
    "eval_return": "returns/eval",
    "env_steps_per_second": "throughput/env_steps_per_second",
    "trainer_idle_fraction": "throughput/trainer_idle_fraction",
    "update_seconds": "throughput/update_seconds",
    "policy_lag_mean": "policy_lag/mean",
    "policy_lag_max": "policy_lag/max",
    "dropped_batches": "policy_lag/dropped_batches",
    "weight_version": "weight_sync/weight_version",
    "consistent": "weight_sync/consistent",
    "sync_seconds": "weight_sync/seconds",
    "sync_bytes": "weight_sync/bytes",
    "sync_failures": "weight_sync/failures",
    "iteration": "progress/iteration",
}
"""metrics.jsonl key -> TensorBoard tag (grouped by section, as SB3 and CleanRL do). The policy's own `train()`
statistics (`train/<key>`: losses, entropy, importance weights, ...) keep their row keys as tags, and the lag
distribution (`policy_lag_counts`) is one scalar a lag, `policy_lag/batches_at_lag_<k>`."""


def available() -> bool:
    """Whether the `tensorboard` package is installed (found, not imported: the launcher's check costs nothing)."""
    return importlib.util.find_spec("tensorboard") is not None


def logdir_hint(log_dir: Path) -> str:
    """The line `rlightning run` prints: where the event files are and how to view them."""
    return f"TensorBoard event files in {log_dir}: tensorboard --logdir {log_dir}"


class TensorBoardWriter:
    """Writes metrics rows as TensorBoard scalars into `log_dir`.

    Args:
        writer (SummaryWriter): The open writer; use `open`.
    """

    def __init__(self, writer: SummaryWriter) -> None:
        self._writer = writer

    @classmethod
    def open(cls, log_dir: Path, env_steps: int) -> TensorBoardWriter | None:
        """A writer into `log_dir`, or None (one info line) when the `tensorboard` package is absent.

        Args:
            log_dir (Path): The directory of the event files (`RunDir.tensorboard_dir`), created when missing.
            env_steps (int): The env steps the run starts (or resumes) from. Events an earlier attempt wrote at
                larger steps (beyond the checkpoint resumed from) are marked orphaned, so TensorBoard's reader drops
                them and shows one curve, not two (`SummaryWriter`'s `purge_step`).

        Returns:
            TensorBoardWriter | None: The writer, or None.
        """
        try:
            from torch.utils.tensorboard import SummaryWriter
        except ImportError:
            log.info("no TensorBoard event files: the tensorboard package is not installed "
                     "(pip install 'rlightning[tensorboard]')")
            return None
        log.info("TensorBoard event files in %s", log_dir)
        return cls(SummaryWriter(log_dir=str(log_dir), purge_step=env_steps + 1))

    def write(self, row: Mapping[str, Any]) -> None:
        """Add the row's numeric values at step `row["env_steps"]` and flush (a crash loses no row).

        Args:
            row (Mapping[str, Any]): A metrics.jsonl row (`_records.Recorder.iteration`); None values are skipped,
                booleans are written as 0 or 1.
        """
        step = int(row["env_steps"])
        for key, value in row.items():
            tag = TAGS.get(key, key if key.startswith("train/") else None)
            if tag is not None and isinstance(value, int | float):  # bool is an int
                self._writer.add_scalar(tag, float(value), step)
        for lag, batches in enumerate(row.get("policy_lag_counts") or ()):
            self._writer.add_scalar(f"policy_lag/batches_at_lag_{lag}", float(batches), step)
        self._writer.flush()

    def close(self) -> None:
        """Flush and close the event file."""
        self._writer.close()
