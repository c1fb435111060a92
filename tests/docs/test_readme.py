"""README.md is a guide: short, no history, and the figures it quotes are rows of docs/measurements.md. No cluster
needed."""

from __future__ import annotations

import re
import subprocess

import pytest

from benchmarks import _record

REPO = _record.REPO
README = REPO / "README.md"
MAX_README_BYTES = 15_000
"""The guide's size bound (issue 39: kopf's README is about 7 KB, JobSet's 8 KB)."""
FIGURE = re.compile(r"\b\d+(?:\.\d+)?(?: s\b| min\b|x\b| passed\b)")
"""A measured figure as the README writes one: seconds, minutes, a ratio or a count of passed tests."""
HISTORY = re.compile(r"session [0-9]|stop [0-9]", re.IGNORECASE)
"""Development history: numbered work sessions or stops (the issue's own grep)."""


def test_the_readme_is_a_short_guide():
    text = README.read_text()
    assert len(text.encode()) <= MAX_README_BYTES
    assert text.count("2026-") <= 3
    assert "The test command is `make test`." in text  # .ci/run's contract


def test_every_figure_the_readme_quotes_is_in_docs_measurements():
    figures = FIGURE.findall(README.read_text())
    assert figures, "README.md quotes no figure"
    measured = _record.MEASUREMENTS.read_text()
    assert [figure for figure in figures if figure not in measured] == []


def test_no_history_in_the_readme_the_docs_or_the_code():
    tracked = subprocess.run(["git", "ls-files", "README.md", "docs", "rlightning", "operator", "benchmarks", "tools",
                              "devcluster", "examples", "charts", "tests"], cwd=REPO, capture_output=True,
                             text=True, check=True, timeout=60).stdout.split()
    found = []
    for name in tracked:
        path = REPO / name
        if not path.is_file() or path.suffix not in {".py", ".md", ".yaml", ".yml", ".txt", ".toml", ".json"}:
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if HISTORY.search(line) and path != REPO / "tests" / "docs" / "test_readme.py":
                found.append(f"{name}:{number}: {line.strip()}")
    assert found == []


@pytest.mark.parametrize("heading", ["## Quick start", "## On a cluster", "## Running locally", "## Your own policy",
                                     "## Where to read more"])
def test_the_guide_has_its_sections(heading):
    assert heading + "\n" in README.read_text()
