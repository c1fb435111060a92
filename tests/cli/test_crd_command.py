"""`rlightning crd` prints the CRD generated from the models, or writes it to a file."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

from rlightning import contract

REPO = Path(__file__).resolve().parents[2]


def test_crd_to_stdout_and_file(tmp_path: Path) -> None:
    printed = subprocess.run(
        [sys.executable, "-m", "rlightning", "crd"], capture_output=True, text=True, timeout=60, check=True
    ).stdout
    crd = yaml.safe_load(printed)
    assert crd["kind"] == "CustomResourceDefinition"
    assert crd["metadata"]["name"] == contract.CRD_NAME
    out = tmp_path / "sub" / "crd.yaml"
    subprocess.run(
        [sys.executable, "-m", "rlightning", "crd", "--output", str(out)], capture_output=True, timeout=60, check=True
    )
    assert out.read_text() == printed
