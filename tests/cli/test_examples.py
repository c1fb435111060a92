"""Every manifest under examples/ passes `rlightning validate` (structural and deep checks)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples").glob("*.yaml"))


def test_there_are_examples() -> None:
    assert any(p.name == "cartpole.yaml" for p in EXAMPLES)


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_example_validates(path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "rlightning", "validate", str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "valid PolicyGroup" in result.stdout
