"""What `rlightning run` imports before it forks its children: the local path needs no cluster client."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "cartpole.yaml"
CLUSTER_PACKAGES = {"kubernetes", "kopf", "rlightning_operator"}
"""The operator's and the pods' status reporter's imports (`rlightning.runtime._status_reporter` imports the
Kubernetes client only in a pod)."""

LAUNCHER = """
import sys
from pathlib import Path
from rlightning.runtime import _fork
from rlightning.runtime.local import LocalRun
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.validate import validate_file

run = LocalRun(validate_file(sys.argv[1]), "", RunDir(Path(sys.argv[2])), fork=True)  # as `rlightning run`
modules = [module for child in run.children() for module in child.forked_modules()]
_fork.preload(modules)
print("preloaded", sorted(set(modules)))
print("imported", sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[3].split(","))))
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forks with a pidfd: Linux only")
def test_the_launcher_imports_its_childrens_modules_and_no_cluster_client(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(LAUNCHER), str(EXAMPLE), str(tmp_path / "run"),
         ",".join(sorted(CLUSTER_PACKAGES))],
        capture_output=True, text=True, timeout=300, cwd=REPO,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    modules = ["rlightning.runtime.eval", "rlightning.runtime.torchrun", "rlightning.runtime.train"]
    assert f"preloaded {modules}" in lines, result.stdout
    assert "imported []" in lines, result.stdout
