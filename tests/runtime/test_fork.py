"""`_fork.ForkedModule`: `python -m MODULE` as a fork, supervised as `subprocess.Popen` would be."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from rlightning import launch
from rlightning.runtime import _fork

pytestmark = pytest.mark.skipif(not _fork.available(), reason="forks with a pidfd: Linux only")

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


@pytest.fixture
def start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    (tmp_path / "fork_child.py").write_text(textwrap.dedent(CHILD))
    monkeypatch.syspath_prepend(str(tmp_path))
    log = tmp_path / "child.log"
    started = []

    def run(arg: str) -> tuple[_fork.ForkedModule, Path]:
        with log.open("ab") as out:
            child = _fork.ForkedModule("fork_child", [arg], {"FORK_TEST": "yes", launch.THREADS_ENV: "1"}, out.fileno())
        started.append(child)
        return child, log

    yield run
    for child in started:
        if child.poll() is None:
            os.kill(child.pid, signal.SIGKILL)
            child.wait(timeout=30)


def test_a_forked_module_runs_in_its_own_session_with_its_env_and_exit_code(start, caplog) -> None:
    assert logging.root.handlers  # caplog's: a handler the child must not inherit
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # the parent's; the child applies its own OMP_NUM_THREADS
    try:
        child, log = start("3")
    finally:
        torch.set_num_threads(threads)
    assert child.wait(timeout=60) == 3
    assert child.poll() == 3 and child.returncode == 3
    text = log.read_text()
    assert "env yes argv ['3'] threads 1" in text
    assert "own session True stdin True" in text
    assert "child log to its own log" in text and not caplog.records
    assert "FORK_TEST" not in os.environ  # the parent's environment is untouched


def test_an_uncaught_exception_ends_the_fork_with_1_and_its_traceback(start) -> None:
    child, log = start("raise")
    assert child.wait(timeout=60) == 1
    assert "RuntimeError: boom" in log.read_text()


def test_wait_times_out_while_the_fork_runs_and_a_signal_ends_it(start) -> None:
    child, log = start("wait")
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    assert child.poll() is None
    os.killpg(child.pid, signal.SIGTERM)  # its own process group, as the launcher signals it
    assert child.wait(timeout=60) == -signal.SIGTERM


def test_no_fork_once_cuda_is_initialized(monkeypatch) -> None:
    # a forked child cannot use CUDA once its parent initialized it (mocked: no GPU here)
    monkeypatch.setattr(_fork.threading, "active_count", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert _fork.available()
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert not _fork.available()


def test_preload_imports_what_a_module_imports_and_its_fork_runs_it_afresh(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "preload_child.py").write_text("import preload_dep\nprint('ran as', __name__)\n")
    (tmp_path / "preload_dep.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        _fork.preload(["preload_child", "preload_child", "no_such_module_to_preload"])  # a missing one is skipped
        assert "preload_dep" in sys.modules  # the child's import, now the launcher's
        assert "preload_child" not in sys.modules  # run afresh by runpy, as in a fresh interpreter
        log = tmp_path / "child.log"
        with log.open("ab") as out:
            child = _fork.ForkedModule("preload_child", [], {launch.THREADS_ENV: "1"}, out.fileno())
        assert child.wait(timeout=60) == 0
        text = log.read_text()
        assert "ran as __main__" in text and "RuntimeWarning" not in text, text
    finally:
        sys.modules.pop("preload_dep", None)
