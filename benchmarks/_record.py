"""Append one measurement to docs/measurements.md: the `--record` flag of the benchmarks and of tools/test_phases.py.

Stdlib only: tools/test_phases.py imports it before pip has installed anything. The table is the last thing in
the file, so a row appended at the end extends it; rows are never rewritten.
"""

from __future__ import annotations

import datetime
import fcntl
import os
import pathlib
import shlex
import subprocess
import sys
from collections.abc import Sequence

REPO = pathlib.Path(__file__).resolve().parents[1]
MEASUREMENTS = REPO / "docs" / "measurements.md"
"""The one file of measured figures; its table's columns are `COLUMNS`."""
COLUMNS = ("date (UTC)", "commit", "command", "figures", "machine")
RECORD_HELP = "append this run's figures to docs/measurements.md as one row (date, commit, command, machine)"
"""The `--record` flag's help, the same in every tool."""


def command_line(argv: Sequence[str] | None = None, *, cwd: pathlib.Path | None = None) -> str:
    """The command as run, for a row: ``python`` and the script relative to the repository, then its arguments.

    Args:
        argv (Sequence[str], optional): The arguments, script first. Defaults to ``sys.argv``.
        cwd (pathlib.Path, optional): Where a relative script path is resolved from. Defaults to the working directory.

    Returns:
        str: Shell-quoted, e.g. ``python benchmarks/weight_sync.py --sizes 10M --record``.
    """
    args = list(sys.argv if argv is None else argv)
    script = pathlib.Path(args[0])
    resolved = ((cwd or pathlib.Path.cwd()) / script).resolve()
    if resolved.is_relative_to(REPO):
        args[0] = resolved.relative_to(REPO).as_posix()
    return shlex.join(["python", *args])


def short_commit(repo: pathlib.Path = REPO) -> str:
    """The checked-out commit, abbreviated, with ``-dirty`` when tracked files differ from it (``git describe``'s mark).

    Args:
        repo (pathlib.Path, optional): The repository. Defaults to this one.

    Returns:
        str: For example ``49c2f8a`` or ``49c2f8a-dirty``; ``unknown`` outside a git checkout or without git.
    """
    try:
        head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=repo, capture_output=True, text=True,
                              check=True, timeout=30).stdout.strip()
        dirty = subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=repo, capture_output=True,
                               timeout=30).returncode != 0
    except (OSError, subprocess.CalledProcessError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{head}-dirty" if dirty else head


def machine() -> str:
    """This machine in a few words: cores, memory and the 1-minute load average now.

    Returns:
        str: For example ``2 cores, 24 GiB, load average 1.3`` (memory from ``os.sysconf``; GiB = 2**30 bytes).
    """
    parts = [f"{os.cpu_count()} cores"]
    try:
        parts.append(f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB")
    except (ValueError, OSError):  # a platform without these sysconf names
        pass
    parts.append(f"load average {os.getloadavg()[0]:.1f}")
    return ", ".join(parts)


def _check_table_last(path: pathlib.Path, lines: list[str]) -> None:
    """Refuse a file whose last lines are not the table headed by `COLUMNS` (a row appended would land elsewhere)."""
    header = "| " + " | ".join(COLUMNS) + " |"
    if header not in lines:
        raise ValueError(f"{path}: no measurements table headed {header!r}")
    after = lines[lines.index(header) + 1:]
    stray = next((line for line in after if not line.startswith("|")), None)
    if stray is not None:
        raise ValueError(f"{path}: the measurements table must be the last thing in the file, found {stray!r} after it")


def _cell(text: str, column: str) -> str:
    """One table cell: a pipe escaped so it stays in its cell; an empty cell or a line break is refused."""
    cell = " ".join(text.split())
    if not cell:
        raise ValueError(f"measurement row: {column} must not be empty")
    if "\n" in text.strip():
        raise ValueError(f"measurement row: {column} must be one line, got {text!r}")
    return cell.replace("|", "\\|")


def append_row(
    figures: str,
    *,
    command: str | None = None,
    path: pathlib.Path = MEASUREMENTS,
    now: datetime.datetime | None = None,
    commit: str | None = None,
    machine_text: str | None = None,
) -> str:
    """Append one row to the measurements table and return it.

    Signature for the benchmarks: ``append_row(figures, *, command=None, path=MEASUREMENTS, now=None, commit=None,
    machine_text=None) -> str``; a benchmark passes only ``figures`` (``command`` defaults to its own command line).
    The file is locked (``fcntl.flock``) while the row is written, so runs that finish together append whole rows.

    Args:
        figures (str): The measured figures as one short line, units included, e.g.
            ``"1119 passed, 0 failed; total 13.5 min"``. A ``|`` is escaped.
        command (str, optional): The command as run. Defaults to :func:`command_line` of ``sys.argv``.
        path (pathlib.Path, optional): The Markdown file whose last lines are the table. Defaults to
            docs/measurements.md.
        now (datetime.datetime, optional): When it ran; naive values are taken as UTC. Defaults to now.
        commit (str, optional): The commit measured. Defaults to :func:`short_commit`.
        machine_text (str, optional): The machine. Defaults to :func:`machine`.

    Returns:
        str: The row as written, without its line break.

    Raises:
        ValueError: `figures`, `command`, `commit` or the machine is empty or spans lines, or the file does not
            end with the table headed by `COLUMNS`.
        FileNotFoundError: `path` does not exist.
    """
    when = now or datetime.datetime.now(datetime.UTC)
    when = when.replace(tzinfo=datetime.UTC) if when.tzinfo is None else when.astimezone(datetime.UTC)
    cells = [
        when.strftime("%Y-%m-%d %H:%M"),
        _cell(commit if commit is not None else short_commit(), "commit"),
        "`" + _cell(command if command is not None else command_line(), "command").replace("`", "'") + "`",
        _cell(figures, "figures"),
        _cell(machine_text if machine_text is not None else machine(), "machine"),
    ]
    row = "| " + " | ".join(cells) + " |"
    with open(path, "r+", encoding="utf-8") as file:
        fcntl.flock(file, fcntl.LOCK_EX)
        text = file.read()
        _check_table_last(path, text.rstrip("\n").split("\n"))
        file.write(("" if text.endswith("\n") else "\n") + row + "\n")
    return row
