"""`_fork.ForkedModule`: `python -m MODULE` as a fork, supervised as `subprocess.Popen` would be."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlightning.runtime import _fork

pytestmark = pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forks with a pidfd: Linux only")

CHILD = """
import logging, os, signal, sys, torch
logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="child log %(message)s")
logging.getLogger("fork_child").info("to its own log")
print("env", os.environ.get("FORK_TEST"), "argv", sys.argv[1:], "threads", torch.get_num_threads())
print("own session", os.getsid(0) == os.getpid(), "stdin", sys.stdin.read() == "")
if sys.argv[1] == "raise":
    raise RuntimeError("boom")
if sys.argv[1] == "wait":
    signal.pause()
sys.exit(int(sys.argv[1]))
"""


# The launcher forks from a fresh `rlightning run` process; so does each test, from a fresh interpreter: this
# test runner's worker has native threads (execnet's, gloo's, OpenMP's) whose locks a fork would leave held.
DRIVER = """
import json, logging, os, signal, subprocess, sys, torch
from rlightning import launch
from rlightning.runtime import _fork
scenario, folder = sys.argv[1], sys.argv[2]
sys.path.insert(0, folder)
logging.basicConfig(level=logging.INFO, filename=os.path.join(folder, "parent.log"))  # the child must not inherit it
torch.set_num_threads(2)  # the parent's; the child applies its own OMP_NUM_THREADS
with open(os.path.join(folder, "child.log"), "ab") as out:
    env = {"FORK_TEST": "yes", launch.THREADS_ENV: "1"}
    child = _fork.ForkedModule("fork_child", [scenario], env, out.fileno())
seen = {"threads": torch.get_num_threads(), "env": os.environ.get("FORK_TEST")}
if scenario == "wait":
    try:
        child.wait(timeout=0.2)
    except subprocess.TimeoutExpired:
        seen["timed_out"] = True
    seen["poll_while_running"] = child.poll()
    os.killpg(child.pid, signal.SIGTERM)  # its own process group, as the launcher signals it
seen["code"] = child.wait(timeout=60)
seen["poll"], seen["returncode"] = child.poll(), child.returncode
print(json.dumps(seen))
"""


def run_scenario(tmp_path: Path, scenario: str) -> tuple[dict, str]:
    """Fork `fork_child SCENARIO` from a fresh interpreter; return what that parent saw and the child's log."""
    (tmp_path / "fork_child.py").write_text(textwrap.dedent(CHILD))
    proc = subprocess.run(
        [sys.executable, "-c", DRIVER, scenario, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout), (tmp_path / "child.log").read_text()


def test_a_forked_module_runs_in_its_own_session_with_its_env_and_exit_code(tmp_path: Path) -> None:
    seen, text = run_scenario(tmp_path, "3")
    assert seen["code"] == seen["poll"] == seen["returncode"] == 3
    assert "env yes argv ['3'] threads 1" in text
    assert "own session True stdin True" in text
    assert "child log to its own log" in text and (tmp_path / "parent.log").read_text() == ""
    assert seen["env"] is None and seen["threads"] == 2  # the parent's environment and threads are untouched


def test_an_uncaught_exception_ends_the_fork_with_1_and_its_traceback(tmp_path: Path) -> None:
    seen, text = run_scenario(tmp_path, "raise")
    assert seen["code"] == 1
    assert "RuntimeError: boom" in text


def test_wait_times_out_while_the_fork_runs_and_a_signal_ends_it(tmp_path: Path) -> None:
    seen, _ = run_scenario(tmp_path, "wait")
    assert seen["timed_out"] and seen["poll_while_running"] is None
    assert seen["code"] == -signal.SIGTERM


def test_no_fork_once_cuda_is_initialized(monkeypatch) -> None:
    # a forked child cannot use CUDA once its parent initialized it (mocked: no GPU here)
    monkeypatch.setattr(_fork.threading, "active_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert _fork.available()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not _fork.available()


PRELOAD_DRIVER = """
import json, sys
from rlightning import launch
from rlightning.runtime import _fork
folder = sys.argv[1]
sys.path.insert(0, folder)
_fork.preload(["preload_child", "preload_child", "no_such_module_to_preload"])  # a missing one is skipped
seen = {"dep": "preload_dep" in sys.modules, "child": "preload_child" in sys.modules}
with open(folder + "/child.log", "ab") as out:
    seen["code"] = _fork.ForkedModule("preload_child", [], {launch.THREADS_ENV: "1"}, out.fileno()).wait(timeout=60)
print(json.dumps(seen))
"""


def test_preload_imports_what_a_module_imports_and_its_fork_runs_it_afresh(tmp_path: Path) -> None:
    (tmp_path / "preload_child.py").write_text("import preload_dep\nprint('ran as', __name__)\n")
    (tmp_path / "preload_dep.py").write_text("")
    proc = subprocess.run(
        [sys.executable, "-c", PRELOAD_DRIVER, str(tmp_path)], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])  # after what preload_child printed when preloaded
    assert seen["dep"]  # the child's import, now the launcher's
    assert not seen["child"]  # run afresh by runpy, as in a fresh interpreter
    assert seen["code"] == 0
    text = (tmp_path / "child.log").read_text()
    assert "ran as __main__" in text and "RuntimeWarning" not in text, text
