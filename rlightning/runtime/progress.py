"""The terminal view of a local run: a live rich panel on a TTY, plain lines otherwise.

The launcher feeds it metrics.jsonl rows (see `rlightning.runtime.rundir`) and the state of its child
processes; the view never reads files or processes itself.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from rich.console import Console, Group
from rich.live import Live
from rich.progress_bar import ProgressBar
from rich.table import Table
from rich.text import Text


def _num(value: float | None, fmt: str = "{:.1f}") -> str:
    return "-" if value is None else fmt.format(value)


def _consistent(value: bool | None) -> str:
    return {True: "yes", False: "NO", None: "-"}[value]


def format_row(row: dict[str, Any], total_env_steps: int) -> str:
    """One plain line for a metrics row.

    Args:
        row (dict[str, Any]): A metrics.jsonl row.
        total_env_steps (int): spec.train.totalEnvSteps, for the percentage.

    Returns:
        str: For example `iter 12  steps 24576/300000 (8%)  train 41.2  eval 55.0@v11  version 12  consistent yes`.
    """
    steps = row.get("env_steps", 0)
    eval_version = row.get("eval_version")
    eval_at = f"@v{eval_version}" if eval_version is not None else ""
    return (
        f"iter {row.get('iteration', 0)}  steps {steps}/{total_env_steps} "
        f"({100 * steps / max(total_env_steps, 1):.0f}%)"
        f"  train {_num(row.get('train_return'))}  eval {_num(row.get('eval_return'))}{eval_at}"
        f"  version {row.get('weight_version', 0)}  consistent {_consistent(row.get('consistent'))}"
        f"  {_num(row.get('env_steps_per_second'), '{:.0f}')} steps/s{_lag(row)}"
        f"  elapsed {_num(row.get('elapsed_seconds'), '{:.0f}s')}"
    )


def _lag(row: dict[str, Any]) -> str:
    """`  lag 0.4 (max 1)  dropped 3` for fleet data; empty when the trainers collected their own."""
    if row.get("policy_lag_mean") is None:
        return ""
    return (
        f"  lag {row['policy_lag_mean']:.1f} (max {row.get('policy_lag_max')})"
        f"  dropped {row.get('dropped_batches', 0)}"
    )


class PlainProgress:
    """Prints one line per metrics row, at most one every `min_interval` seconds (for logs and pipes).

    Args:
        total_env_steps (int): spec.train.totalEnvSteps.
        stream (TextIO | None, optional): Where to print. Defaults to sys.stdout.
        min_interval (float, optional): Seconds between printed rows; the last row is always printed by
            `stop`. Defaults to 5.0.
    """

    def __init__(self, total_env_steps: int, stream: TextIO | None = None, min_interval: float = 5.0) -> None:
        self.total_env_steps = total_env_steps
        self.stream = stream or sys.stdout
        self.min_interval = min_interval
        self._last_print = float("-inf")
        self._pending: dict[str, Any] | None = None

    def __enter__(self) -> PlainProgress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def update(self, rows: list[dict[str, Any]], processes: dict[str, str]) -> None:
        """Take new metrics rows and the processes' states (name -> state word)."""
        del processes  # a plain log shows process changes through `message`
        if rows:
            self._pending = rows[-1]
        now = time.monotonic()
        if self._pending is not None and now - self._last_print >= self.min_interval:
            self._print(self._pending)
            self._last_print = now

    def message(self, text: str) -> None:
        """Print a line of its own (process started, stopped, failed)."""
        print(text, file=self.stream, flush=True)

    def stop(self) -> None:
        """Print the last row if it was not printed yet."""
        if self._pending is not None:
            self._print(self._pending)

    def _print(self, row: dict[str, Any]) -> None:
        print(format_row(row, self.total_env_steps), file=self.stream, flush=True)
        self._pending = None


class LiveProgress:
    """A live panel: progress bar over env steps, returns, weight version, consistency and processes.

    Args:
        title (str): Heading, for example the PolicyGroup name and the run directory.
        total_env_steps (int): spec.train.totalEnvSteps.
        target_eval_return (float | None): spec.train.targetEvalReturn, shown beside the eval return.
        console (Console | None, optional): Defaults to a console on stdout.
    """

    def __init__(
        self,
        title: str,
        total_env_steps: int,
        target_eval_return: float | None,
        console: Console | None = None,
    ) -> None:
        self.title = title
        self.total_env_steps = total_env_steps
        self.target_eval_return = target_eval_return
        self.console = console or Console()
        self._row: dict[str, Any] = {}
        self._processes: dict[str, str] = {}
        self._live = Live(self._render(), console=self.console, refresh_per_second=4, transient=False)

    def __enter__(self) -> LiveProgress:
        self._live.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def update(self, rows: list[dict[str, Any]], processes: dict[str, str]) -> None:
        """Take new metrics rows and the processes' states (name -> state word) and redraw."""
        if rows:
            self._row = rows[-1]
        self._processes = dict(processes)
        self._live.update(self._render())

    def message(self, text: str) -> None:
        """Print a line above the live panel."""
        self._live.console.print(text, markup=False, highlight=False)

    def stop(self) -> None:
        """Draw the final state and leave it on screen."""
        if self._live.is_started:
            self._live.update(self._render())
            self._live.stop()

    def _render(self) -> Group:
        row = self._row
        steps = row.get("env_steps", 0)
        table = Table.grid(padding=(0, 2))
        table.add_column(style="bold")
        table.add_column()
        # A ProgressBar ends without a newline: it gets a row of its own, sized to fit 80 columns.
        bar = ProgressBar(total=max(self.total_env_steps, 1), completed=min(steps, self.total_env_steps), width=50)
        table.add_row("progress", bar)
        table.add_row("env steps", f"{steps:,} / {self.total_env_steps:,}   iteration {row.get('iteration', 0)}")
        table.add_row("train return", _num(row.get("train_return")))
        idle = row.get("trainer_idle_fraction")
        data = f"{_num(row.get('env_steps_per_second'), '{:.0f}')} env steps/s{_lag(row)}"
        if idle is not None:
            data += f"   trainers idle {100 * idle:.0f}%"
        table.add_row("data", data)
        target = f"   (target {self.target_eval_return:g})" if self.target_eval_return is not None else ""
        eval_version = row.get("eval_version")
        at = f" on version {eval_version}" if eval_version is not None else ""
        table.add_row("eval return", f"{_num(row.get('eval_return'))}{at}{target}")
        sync = ""
        if row.get("sync_seconds") is not None:
            sync = f"   last sync {row['sync_seconds'] * 1000:.0f} ms, {row.get('sync_bytes', 0) / 1024:.0f} KiB"
        table.add_row("weight version", f"{row.get('weight_version', 0)}{sync}")
        consistent = row.get("consistent")
        style = {True: "green", False: "red", None: "dim"}[consistent]
        table.add_row("consistent", Text(_consistent(consistent), style=style))
        table.add_row("elapsed", _num(row.get("elapsed_seconds"), "{:.0f} s"))
        table.add_row("processes", "  ".join(f"{name}: {state}" for name, state in self._processes.items()))
        return Group(Text(self.title, style="bold"), table)


View = LiveProgress | PlainProgress
"""Either view: a context manager with `update(rows, processes)`, `message(text)` and `stop()`."""


def make_progress(
    title: str, total_env_steps: int, target_eval_return: float | None, plain: bool | None = None
) -> View:
    """The live panel on a terminal, plain lines otherwise.

    Args:
        title (str): Heading of the live panel.
        total_env_steps (int): spec.train.totalEnvSteps.
        target_eval_return (float | None): spec.train.targetEvalReturn.
        plain (bool | None, optional): Force plain lines (True) or the live panel (False); None decides by
            whether stdout is a terminal. Defaults to None.

    Returns:
        View: The live panel or the plain printer.
    """
    if plain is None:
        plain = not sys.stdout.isatty()
    if plain:
        print(title, flush=True)
        return PlainProgress(total_env_steps)
    return LiveProgress(title, total_env_steps, target_eval_return)
