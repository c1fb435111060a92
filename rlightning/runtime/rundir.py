"""The layout of a run directory, and its two append-only records.

```
<run dir>/
  policygroup.yaml      (`contract.SPEC_FILE_NAME`) the manifest the processes run (local runs copy it here)
  metrics.jsonl         one JSON object per training iteration, appended by trainer rank 0
  summary.json          written by trainer rank 0 when training ends
  published.json        the highest weight version trainer rank 0 published, rewritten at each publish
  epoch.json            the newest trainer attempt that started here (`RunDir.mark_epoch`): older ones are fenced
  returns.png           train and eval return against env steps
  tensorboard/          TensorBoard event files of the same rows (when the tensorboard package is installed)
  checkpoints/          iter-00000010.pt (epoch 0), iter-00000012-epoch-1796271000000001.pt ..., the newest
                        `train.checkpoint.keep` by (attempt, iteration) kept
  logs/                 one log per local child process (trainer.log, eval-0.log, ...)
```
The same layout is used in pods (under `ENV_RUN_DIR`) and by `rlightning run`.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from rlightning import contract

_CHECKPOINT_RE = re.compile(r"^iter-(\d+)(?:-epoch-(\d+))?\.pt$")
"""A complete checkpoint's name: its iteration and, from epoch 1 on, the epoch of the trainer attempt that wrote it."""


class FencedError(RuntimeError):
    """A trainer of an older attempt (epoch) than the one the run directory names tried to start or commit a
    checkpoint: it is a pod of an attempt the operator gave up on that came back (a partition), a zombie.
    """


def default_run_dir(group_name: str, now: datetime | None = None, root: Path = Path("runs")) -> Path:
    """The default run directory `runs/<name>-<UTC timestamp>`.

    Args:
        group_name (str): metadata.name of the PolicyGroup.
        now (datetime | None, optional): The time to stamp; defaults to the current UTC time.
        root (Path, optional): Parent directory. Defaults to `runs`.

    Returns:
        Path: For example `runs/cartpole-20260101T120000Z`.
    """
    now = now or datetime.now(UTC)
    return root / f"{group_name}-{now.strftime('%Y%m%dT%H%M%SZ')}"


@dataclass(frozen=True)
class RunDir:
    """Paths inside one run directory.

    Args:
        root (Path): The run directory.
    """

    root: Path

    @property
    def spec_path(self) -> Path:
        """The manifest copy the local processes read."""
        return self.root / contract.SPEC_FILE_NAME

    @property
    def metrics_path(self) -> Path:
        """metrics.jsonl: one JSON object per training iteration."""
        return self.root / "metrics.jsonl"

    @property
    def summary_path(self) -> Path:
        """summary.json: the outcome of the run."""
        return self.root / "summary.json"

    @property
    def error_path(self) -> Path:
        """The first failing trainer rank's own exception (`contract.ENV_ERROR_FILE`, `rlightning.runtime._errors`)."""
        return self.root / contract.ERROR_FILE_NAME

    @property
    def published_path(self) -> Path:
        """published.json: the highest weight version trainer rank 0 published in this directory's runs."""
        return self.root / "published.json"

    def published_version(self) -> int:
        """The highest weight version recorded by `record_published`; 0 when none is (or the record is unreadable)."""
        return _recorded_count(self.published_path, "weight_version")

    def record_published(self, version: int) -> None:
        """Record that weight version `version` was published: a resume from an older checkpoint continues above
        it, so a version never names two sets of weights (one small atomic write per publish).
        """
        write_json_atomic(self.published_path, {"weight_version": version})

    @property
    def plot_path(self) -> Path:
        """The PNG plot of train and eval return against env steps."""
        return self.root / "returns.png"

    @property
    def tensorboard_dir(self) -> Path:
        """Directory of trainer rank 0's TensorBoard event files."""
        return self.root / "tensorboard"

    @property
    def checkpoints_dir(self) -> Path:
        """Directory of checkpoints."""
        return self.root / "checkpoints"

    @property
    def logs_dir(self) -> Path:
        """Directory of the local child processes' logs."""
        return self.root / "logs"

    @property
    def epoch_path(self) -> Path:
        """epoch.json: the newest trainer attempt (epoch) that started on this directory."""
        return self.root / "epoch.json"

    def marked_epoch(self) -> int:
        """The epoch `mark_epoch` recorded; 0 when none is (or the record is unreadable)."""
        return _recorded_count(self.epoch_path, "epoch")

    def mark_epoch(self, epoch: int) -> None:
        """Record that a trainer of attempt `epoch` starts here, before it resumes or writes any checkpoint: from now
        on trainers of older attempts cannot commit checkpoints here (`commit_checkpoint`).

        Args:
            epoch (int): The trainer attempt's epoch (`contract.ENV_TRAIN_EPOCH`, `contract.train_epoch`; 0 locally).

        Raises:
            FencedError: When the directory already names a newer epoch: this trainer is of an older attempt (or
                of a PolicyGroup created earlier than the one that used the directory last).
        """
        self._fence(epoch, "run")
        if self.marked_epoch() < epoch or not self.epoch_path.exists():
            write_json_atomic(self.epoch_path, {"epoch": epoch})

    def _fence(self, epoch: int, action: str) -> None:
        """Raise `FencedError` (saying it may not `action`) when the marker names an epoch newer than `epoch`."""
        marked = self.marked_epoch()
        if marked > epoch:
            raise FencedError(f"{self.epoch_path}: a trainer of epoch {marked} started on this run directory; this "
                              f"trainer of epoch {epoch}, an older attempt, may not {action}")

    def create(self) -> RunDir:
        """Create the directory and its subdirectories (existing ones are kept). Returns self."""
        self.checkpoints_dir.mkdir(parents=True, exist_ok=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        return self

    def checkpoint_path(self, iteration: int, epoch: int = 0) -> Path:
        """Path of the checkpoint written after training iteration `iteration` by a trainer of attempt `epoch`
        (epoch 0's names carry no epoch, as before epochs were recorded).
        """
        suffix = f"-epoch-{epoch}" if epoch else ""
        return self.checkpoints_dir / f"iter-{iteration:08d}{suffix}.pt"

    def checkpoints(self, epoch: int | None = None) -> list[Path]:
        """Complete checkpoints, oldest first by (epoch, iteration) (partially written `.tmp` files are ignored).

        Args:
            epoch (int | None, optional): Only those of this epoch or older ones. Defaults to None: all.
        """
        if not self.checkpoints_dir.is_dir():
            return []
        found = [
            (int(m.group(2) or 0), int(m.group(1)), p)
            for p in self.checkpoints_dir.iterdir()
            if (m := _CHECKPOINT_RE.match(p.name))
        ]
        return [p for e, _, p in sorted(found) if epoch is None or e <= epoch]

    def newest_checkpoint(self, epoch: int | None = None) -> Path | None:
        """The checkpoint to resume: the newest complete one by (epoch, iteration), of `epoch` or an older one.

        A newer epoch's checkpoint wins over an older epoch's of a higher iteration: the newer attempt continued from
        one of the older's and the fleet follows its weight versions; a higher iteration of the older epoch could
        only come from a trainer of that attempt still running when the newer one started (a zombie).

        Args:
            epoch (int | None, optional): The resuming trainer's attempt: checkpoints of newer attempts are never
                read (such a trainer is fenced anyway, `mark_epoch`). Defaults to None: any.

        Returns:
            Path | None: The checkpoint, or None when there is none.
        """
        found = self.checkpoints(epoch)
        return found[-1] if found else None

    def commit_checkpoint(self, staged: Path, iteration: int, epoch: int) -> Path:
        """Move a fully written checkpoint file into place, unless a newer epoch marked the directory.

        Args:
            staged (Path): The written file, in `checkpoints_dir` under a name `checkpoints` ignores.
            iteration (int): The training iteration it holds.
            epoch (int): The attempt of the trainer that wrote it.

        Returns:
            Path: `checkpoint_path(iteration, epoch)`.

        Raises:
            FencedError: When the directory's marker names an epoch newer than `epoch` (the file is deleted). The
                check and the rename are two steps: a checkpoint whose check passed just before a newer attempt
                marked the directory is still committed, under its own older epoch, so it never outranks that
                attempt's checkpoints (`newest_checkpoint`).
        """
        try:
            self._fence(epoch, f"commit the checkpoint of iteration {iteration}")
        except FencedError:
            staged.unlink(missing_ok=True)
            raise
        path = self.checkpoint_path(iteration, epoch)
        os.replace(staged, path)
        return path

    def prune_checkpoints(self, keep: int) -> list[Path]:
        """Delete all but the newest `keep` checkpoints by (epoch, iteration).

        Args:
            keep (int): Checkpoints to keep, >= 1.

        Returns:
            list[Path]: The deleted files.
        """
        old = self.checkpoints()[:-keep]
        for path in old:
            path.unlink(missing_ok=True)
        return old


def _json_safe(value: Any) -> Any:
    """Replace NaN and infinities (not JSON) with None, recursively."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _json_safe(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return value


def append_jsonl(path: Path, row: dict[str, Any]) -> None:
    """Append one JSON object as a line and flush it to the OS (readers tail the file).

    Args:
        path (Path): The JSONL file, created when missing.
        row (dict[str, Any]): JSON-serialisable values; NaN and infinities become null.
    """
    with path.open("a") as f:
        f.write(json.dumps(_json_safe(row), sort_keys=True) + "\n")


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write a JSON file through a temporary file and a rename, so readers never see half of it.

    Args:
        path (Path): Destination.
        data (dict[str, Any]): JSON-serialisable values; NaN and infinities become null.
    """
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_json_safe(data), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """Read every complete line of a JSONL file; a missing file is empty, a torn last line is skipped."""
    return JsonlTail(path).read_new()


class JsonlTail:
    """Follows a JSONL file another process appends to, returning only new complete lines.

    Args:
        path (Path): The file; it may not exist yet.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._offset = 0

    def read_new(self) -> list[dict[str, Any]]:
        """Objects from lines completed since the last call."""
        if not self.path.exists():
            return []
        rows = []
        with self.path.open("rb") as f:
            f.seek(self._offset)
            for line in f:
                if not line.endswith(b"\n"):
                    break
                self._offset += len(line)
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError:
                    continue
        return rows


def _recorded_count(path: Path, key: str) -> int:
    """The integer `key` of the JSON object in `path`; 0 when the file is missing or unreadable (a record is a
    floor, and none means nothing to stay above).
    """
    try:
        return int(json.loads(path.read_text())[key])
    except (OSError, ValueError, KeyError, TypeError):
        return 0
