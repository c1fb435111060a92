"""Reading TensorBoard event files back with TensorBoard's own reader, as `tensorboard --logdir` does."""

from __future__ import annotations

from pathlib import Path

from tensorboard.backend.event_processing import event_accumulator


def read_scalars(log_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar series in `log_dir` (all its event files, orphaned steps of earlier attempts purged).

    Returns:
        dict[str, list[tuple[int, float]]]: tag -> [(step, value), ...] in the order written.
    """
    reader = event_accumulator.EventAccumulator(str(log_dir), size_guidance={event_accumulator.SCALARS: 0})
    reader.Reload()
    return {tag: [(e.step, e.value) for e in reader.Scalars(tag)] for tag in reader.Tags()["scalars"]}
