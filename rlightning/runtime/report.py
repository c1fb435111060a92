"""The outcome of a run: summary.json and the plot of returns against env steps.

Both are derived from what trainer rank 0 records (metrics.jsonl rows and the sync statistics it sums up),
so the launcher can redraw the plot of any run directory.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

NOT_COMPARED = "no evaluator reported weights that could be checked"
"""`consistent_reason` when nothing was compared: `consistent` is then null (unknown), never true."""


@dataclass
class SyncTotals:
    """Weight-sync statistics summed over a run.

    Attributes:
        count (int): Publishes that completed.
        failures (int): Publishes that raised or reached no receiver.
        bytes (int): Bytes sent, summed over publishes.
        seconds (float): Seconds spent publishing, summed.
        last_bytes (int | None): Bytes of the last publish.
        last_seconds (float | None): Seconds of the last publish.
    """

    count: int = 0
    failures: int = 0
    bytes: int = 0
    seconds: float = 0.0
    last_bytes: int | None = None
    last_seconds: float | None = None

    def add(self, nbytes: int, seconds: float) -> None:
        """Record one completed publish of `nbytes` bytes that took `seconds`."""
        self.count += 1
        self.bytes += int(nbytes)
        self.seconds += float(seconds)
        self.last_bytes, self.last_seconds = int(nbytes), float(seconds)


@dataclass
class RunSummary:
    """What summary.json holds.

    Attributes:
        name (str): metadata.name of the PolicyGroup.
        stop_reason (str): `target_eval_return`, `total_env_steps` or `interrupted`.
        iterations (int): Training iterations done, including those before a resume.
        env_steps (int): Environment steps summed over ranks, including those before a resume.
        wall_seconds (float): Seconds this trainer process ran.
        weight_version (int): Newest weight version published.
        final_eval_return (float | None): Mean return the evaluators reported last.
        final_eval_version (int | None): The weight version that return was measured with: the final one unless
            the run was interrupted or the evaluators did not evaluate it in time (`final_eval_note`).
        final_eval_note (str | None): Why `final_eval_version` is not `weight_version`, in one line; None when it is.
        final_train_return (float | None): Mean return of recent training episodes.
        target_eval_return (float | None): spec.train.targetEvalReturn.
        reached_target (bool): Whether final_eval_return >= target_eval_return.
        consistent (bool | None): Whether the expected evaluators (the local launcher's count, else every one
            registered) hold the final version and every report matches what the trainer published (exact
            digest and L2 fingerprint); None when no report was compared (no evaluator).
        evaluators (dict[str, dict[str, Any]]): Last report per evaluator ordinal.
        consistent_reason (str | None): Why `consistent` is not true (`NOT_COMPARED` when it is None); None
            when it is true.
        sync (SyncTotals): Weight-sync statistics.
        resumed_from (str | None): The checkpoint this run resumed from.
        env_steps_by_evaluator (dict[str, int] | None): Env steps trained on per evaluator ordinal when the
            evaluators produced the data; None when the trainers collected their own.
        env_steps_by_rank (list[int] | None): Env steps of evaluator batches each trainer rank received and trained
            on, by rank.
        dropped_batches (int): Evaluator batches dropped (older than train.maxPolicyLag, invalid, or acted with an
            older trainer attempt's weights).
        policy_lag_mean (float | None): Mean policy lag of the batches trained on, in weight versions.
        policy_lag_max (int | None): Largest policy lag trained on.
        policy_lag_counts (list[int] | None): The lag distribution: fleet batches trained on by their lag, index `k`
            counting those `k` versions old (0..train.maxPolicyLag); None when the trainers collected their own data.
        importance_weights (dict[str, float] | None): Of a policy that corrects for lag (V-trace,
            `rlightning.policy.appo`): `mean` (of `pi/mu`) and `clipped_share` (above rho-bar), each the mean over
            the run's `updates` of the update's figure; None for other policies.
        dropped (dict[str, Any] | None): Why evaluator batches were not trained on (`reasons`: batches per reason)
            and their `share` of those produced (`rlightning.runtime._rank_zero.dropped_summary`); None when the
            trainers collected their own data.
        startup_seconds (dict[str, float]): Seconds from the launch to the end of each start-up phase of trainer
            rank 0 (`rlightning.runtime._startup.PHASES`).
    """

    name: str
    stop_reason: str
    iterations: int
    env_steps: int
    wall_seconds: float
    weight_version: int
    final_eval_return: float | None
    final_eval_version: int | None
    final_train_return: float | None
    target_eval_return: float | None
    reached_target: bool
    consistent: bool | None
    evaluators: dict[str, dict[str, Any]] = field(default_factory=dict)
    consistent_reason: str | None = None
    sync: SyncTotals = field(default_factory=SyncTotals)
    resumed_from: str | None = None
    env_steps_by_evaluator: dict[str, int] | None = None
    env_steps_by_rank: list[int] | None = None
    dropped_batches: int = 0
    policy_lag_mean: float | None = None
    policy_lag_max: int | None = None
    policy_lag_counts: list[int] | None = None
    importance_weights: dict[str, float] | None = None
    dropped: dict[str, Any] | None = None
    startup_seconds: dict[str, float] = field(default_factory=dict)
    final_eval_note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        """The JSON form (sync statistics nested under `sync`)."""
        return asdict(self)


def plot_returns(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path | None:
    """Plot train and eval return against env steps into a PNG (matplotlib, Agg backend).

    Args:
        rows (list[dict[str, Any]]): metrics.jsonl rows with `env_steps`, `train_return`, `eval_return`.
        path (Path): The PNG to write.
        title (str, optional): Plot title. Defaults to "".

    Returns:
        Path | None: `path`, or None when there is nothing to plot.
    """
    if not rows:
        return None
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib import pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=100)
    for key, label in (("train_return", "train return"), ("eval_return", "eval return")):
        points = [(r["env_steps"], r[key]) for r in rows if r.get(key) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, label=label, marker="." if len(points) < 50 else None)
    ax.set_xlabel("env steps")
    ax.set_ylabel("episode return")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return path
