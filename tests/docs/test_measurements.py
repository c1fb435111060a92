"""docs/measurements.md and its one writer, `benchmarks/_record.py` (the `--record` flag of the benchmarks and of
tools/test_phases.py): a row appended extends the table, whole, also when several processes append at once; a file
the row would land outside the table, or a figure that would break the row, is refused. No cluster needed."""

from __future__ import annotations

import datetime
import os
import shutil
import subprocess
import sys
import textwrap
import xml.etree.ElementTree as ElementTree

import pytest

from benchmarks import _record
from tools import test_phases

REPO = _record.REPO
APPENDERS, ROWS_EACH = 4, 50
"""Processes appending at once in the concurrency test, and rows each appends."""
APPEND_SECONDS = 120.0
"""Bound on those processes (each imports only the stdlib)."""


def table_rows(text: str) -> list[list[str]]:
    """The cells of every row below the measurements table's header (the separator line left out)."""
    header = "| " + " | ".join(_record.COLUMNS) + " |"
    lines = text.rstrip("\n").split("\n")
    rows = lines[lines.index(header) + 2 :]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in rows]


@pytest.fixture
def measurements(tmp_path):
    """A copy of the real docs/measurements.md."""
    copy = tmp_path / "measurements.md"
    shutil.copyfile(_record.MEASUREMENTS, copy)
    return copy


def test_the_real_file_ends_with_its_table_of_whole_rows():
    rows = table_rows(_record.MEASUREMENTS.read_text())
    assert rows, "docs/measurements.md has no rows"
    for row in rows:
        assert len(row) == len(_record.COLUMNS), row
        assert row[0][:4].isdigit() and row[2].startswith("`"), row


def test_a_row_is_appended_to_the_table_with_its_date_commit_command_and_machine(measurements):
    before = measurements.read_text()
    when = datetime.datetime(2026, 1, 2, 5, 4, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))  # 03:04 UTC
    row = _record.append_row("1119 passed | 0 failed", command="python tools/test_phases.py --record",
                             path=measurements, now=when, commit="abc1234", machine_text="2 cores")
    text = measurements.read_text()
    assert text == before + row + "\n"
    assert table_rows(text)[-1] == ["2026-01-02 03:04", "abc1234", "`python tools/test_phases.py --record`",
                                    "1119 passed \\| 0 failed", "2 cores"]


def test_the_defaults_are_this_run_and_this_machine(measurements):
    _record.append_row("3 s", path=measurements)
    date, commit, command, _, machine = table_rows(measurements.read_text())[-1]
    head = subprocess.run(["git", "rev-parse", "--short=7", "HEAD"], cwd=REPO, capture_output=True, text=True,
                          check=True, timeout=30).stdout.strip()
    assert commit.split("-")[0] == head
    assert command.startswith("`python ")
    assert machine.startswith(f"{os.cpu_count()} cores")
    assert abs(datetime.datetime.strptime(date, "%Y-%m-%d %H:%M").replace(tzinfo=datetime.UTC)
               - datetime.datetime.now(datetime.UTC)) < datetime.timedelta(minutes=2)


def test_the_command_names_the_script_from_the_repository_root():
    assert _record.command_line([str(REPO / "benchmarks" / "weight_sync.py"), "--sizes", "10M x"]) == (
        "python benchmarks/weight_sync.py --sizes '10M x'")


def test_rows_appended_by_processes_at_once_are_all_whole(measurements):
    script = textwrap.dedent(f"""
        import pathlib, sys
        from benchmarks import _record
        for index in range({ROWS_EACH}):
            _record.append_row(f"row {{sys.argv[1]}}-{{index}}", path=pathlib.Path(sys.argv[2]),
                               command="c", commit="c", machine_text="m")
    """)
    procs = [subprocess.Popen([sys.executable, "-c", script, str(n), str(measurements)], cwd=REPO)
             for n in range(APPENDERS)]
    for proc in procs:
        assert proc.wait(timeout=APPEND_SECONDS) == 0
    figures = [row[3] for row in table_rows(measurements.read_text()) if row[3].startswith("row ")]
    assert sorted(figures) == sorted(f"row {n}-{i}" for n in range(APPENDERS) for i in range(ROWS_EACH))


@pytest.mark.parametrize(
    ("tail", "message"),
    [
        ("Some prose after the table.\n", "must be the last thing in the file, found 'Some prose after the table.'"),
        (None, "no measurements table headed"),
    ],
)
def test_a_file_that_does_not_end_with_the_table_is_refused(measurements, tail, message):
    if tail is None:
        measurements.write_text("# Measurements\n\nNo table yet.\n")
    else:
        measurements.write_text(measurements.read_text() + tail)
    before = measurements.read_text()
    with pytest.raises(ValueError, match=message) as raised:
        _record.append_row("3 s", path=measurements, command="c", commit="c", machine_text="m")
    assert str(measurements) in str(raised.value)
    assert measurements.read_text() == before


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"figures": "3 s\n4 s"}, "figures must be one line"),
        ({"figures": " "}, "figures must not be empty"),
        ({"figures": "3 s", "commit": ""}, "commit must not be empty"),
    ],
)
def test_a_row_that_would_break_the_table_is_refused(measurements, arguments, message):
    before = measurements.read_text()
    with pytest.raises(ValueError, match=message):
        _record.append_row(**{"command": "c", "machine_text": "m", "commit": "c", **arguments}, path=measurements)
    assert measurements.read_text() == before


def test_make_test_records_its_outcomes_and_each_phase(tmp_path):
    junit = tmp_path / "suite.xml"
    suite = ElementTree.Element("testsuite")
    for outcome in ("passed", "passed", "failure", "skipped"):
        case = ElementTree.SubElement(suite, "testcase", name=outcome, time="1.0")
        if outcome != "passed":
            ElementTree.SubElement(case, outcome)
    ElementTree.ElementTree(suite).write(junit)
    phases = [test_phases.Phase("install", 0.2, True), test_phases.Phase("lint", 7.4, True),
              test_phases.Phase("suite", 798.0, False, junit)]
    figures = test_phases._figures(phases, test_phases.Phase("go builds", 1.0, True), 810.0, 4)
    assert figures == ("2 passed, 1 failed, 1 skipped; install 0 s, lint 7 s, suite 798 s FAILED, "
                       "go builds 1 s (background); total 13.5 min, 4 workers")


def test_every_tool_that_records_offers_the_flag():
    for tool in (
        "tools/test_phases.py", "benchmarks/weight_sync.py", "benchmarks/operator_scale.py", "benchmarks/capped_pods.py"
    ):
        shown = subprocess.run([sys.executable, tool, "--help"], cwd=REPO, capture_output=True, text=True,
                               timeout=APPEND_SECONDS)
        assert shown.returncode == 0, shown.stderr
        assert "--record" in shown.stdout and "docs/measurements.md" in " ".join(shown.stdout.split()), tool
