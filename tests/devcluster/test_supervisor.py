"""What owns host processes (control plane, real node, add-on) waits on them one way: a process that exits ends
the wait with the owner's error and that process's log tail; a deadline that passes names what was awaited, with
every log's tail."""

from __future__ import annotations

import pathlib
import time

import pytest

from devcluster import _process


class _Failed(RuntimeError):
    pass


class _Owner(_process.Supervisor):
    error = _Failed

    def __init__(self, log_dir: pathlib.Path) -> None:
        self.log_dir = log_dir
        self.processes = []

    def log_paths(self) -> list[pathlib.Path]:
        return [self.log_dir / "first.log", self.log_dir / "absent.log"]


def test_a_process_that_exits_ends_the_wait_with_its_log_tail(tmp_path):
    owner = _Owner(tmp_path)
    owner.processes.append(_process.start("first", ["/bin/sh", "-c", "echo boom; exit 3"], tmp_path / "first.log",
                                          detach=False))
    with pytest.raises(_Failed, match=r"(?s)waiting for readiness: first exited with status 3.*boom"):
        owner._wait("readiness", time.monotonic() + 30, lambda: False)
    with pytest.raises(_Failed, match="first exited with status 3"):
        owner.check_alive()


def test_a_deadline_that_passes_names_what_was_awaited_with_the_log_tails(tmp_path):
    owner = _Owner(tmp_path)
    (tmp_path / "first.log").write_text("last words\n")
    with pytest.raises(_Failed, match=r"(?s)timed out waiting for readiness\n----- .*first\.log .*last words") as info:
        owner._wait("readiness", time.monotonic(), lambda: None)
    assert "absent.log" not in str(info.value), "a log that does not exist is skipped"


def test_a_truthy_check_ends_the_wait():
    _Owner(pathlib.Path("/nonexistent"))._wait("a value", time.monotonic(), lambda: {"tls.crt": "..."})
