"""Start control-plane processes in their own process groups, and stop them by pid and group.

Each process runs in a new session (its pid is its process-group id), writes stdout and stderr to one log file,
and, unless it must outlive the launcher (``devcluster up``), gets ``PR_SET_PDEATHSIG=SIGKILL`` so that it also
ends when the launcher is killed without running its cleanup. SIGKILL, not SIGTERM: terminated together,
kube-apiserver and etcd wait on each other's connections for about a minute before exiting, and the data of a
test cluster is thrown away anyway.
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
import pathlib
import signal
import subprocess
import time
from collections.abc import Callable
from collections.abc import Iterable
from typing import ClassVar

_PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>

STOP_TIMEOUT_SECONDS = 10.0
"""Grace period between SIGTERM and SIGKILL."""


@dataclasses.dataclass
class Managed:
    """A started process.

    Attributes:
        name (str): Component name (``etcd``, ``kube-apiserver``, ...).
        pid (int): Process id, also its process-group id.
        log_path (pathlib.Path): File receiving its stdout and stderr.
        popen (subprocess.Popen | None): Handle when started by this Python process (None when loaded from a
            pid file by ``devcluster down``).
        argv (list[str]): Its command line (empty when loaded from a pid file).
        env (dict[str, str] | None): The environment it was started with (None: this process's).
    """

    name: str
    pid: int
    log_path: pathlib.Path
    popen: subprocess.Popen | None = None
    argv: list[str] = dataclasses.field(default_factory=list)
    env: dict[str, str] | None = None

    def exit_code(self) -> int | None:
        """Return the exit status, or None while it runs (always None for processes not started here)."""
        return self.popen.poll() if self.popen is not None else None


def _die_with_parent() -> None:
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def start(
    name: str, argv: list[str], log_path: pathlib.Path, *, detach: bool, env: dict[str, str] | None = None
) -> Managed:
    """Start a process in a new session with its output appended to a log file.

    Args:
        name (str): Component name for messages.
        argv (list[str]): Command line; ``argv[0]`` is an absolute path.
        log_path (pathlib.Path): Log file (created; parents created).
        detach (bool): True to let the process outlive this Python process (no parent-death signal).
        env (dict[str, str] | None, optional): Environment. Defaults to this process's environment.

    Returns:
        Managed: The started process.
    """
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        log.write(f"# {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            env=env,
            preexec_fn=None if detach else _die_with_parent,
        )
    return Managed(name=name, pid=popen.pid, log_path=log_path, popen=popen, argv=argv, env=env)


def alive(pid: int) -> bool:
    """Return True when a process with this pid exists and is not a zombie.

    Args:
        pid (int): Process id.
    """
    try:
        state = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def stop(proc: Managed, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """Stop a process and its process group: SIGTERM, wait up to ``timeout``, then SIGKILL.

    A process started here is waited for (reaped), so none is left even as a zombie. One known only by pid (from
    a pid file) is signalled only while it still leads a process group of that id, so a reused pid of an
    unrelated process is left alone.

    Args:
        proc (Managed): The process to stop.
        timeout (float, optional): Seconds to wait after SIGTERM. Defaults to :data:`STOP_TIMEOUT_SECONDS`.
    """
    if proc.popen is not None:
        if proc.popen.poll() is not None:
            return
        _signal_group(proc.pid, signal.SIGTERM)
        try:
            proc.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            _signal_group(proc.pid, signal.SIGKILL)
            proc.popen.wait(timeout)
        return
    if not _leads_group(proc.pid):
        return
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while alive(proc.pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    if alive(proc.pid):
        _signal_group(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + timeout
        while alive(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.05)


def kill(proc: Managed, timeout: float = STOP_TIMEOUT_SECONDS) -> None:
    """SIGKILL a process started here and its process group (a crash: no graceful shutdown) and reap it.

    Args:
        proc (Managed): A process started by :func:`start` in this Python process.
        timeout (float, optional): Seconds to wait for it to be gone. Defaults to :data:`STOP_TIMEOUT_SECONDS`.

    Raises:
        ValueError: When it was not started here (known only by pid).
        subprocess.TimeoutExpired: When it is not gone within ``timeout``.
    """
    if proc.popen is None:
        raise ValueError(f"{proc.name} (pid {proc.pid}) was not started here")
    if proc.popen.poll() is None:
        _signal_group(proc.pid, signal.SIGKILL)
    proc.popen.wait(timeout)


def _leads_group(pid: int) -> bool:
    try:
        return alive(pid) and os.getpgid(pid) == pid
    except ProcessLookupError:
        return False


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


TIMED_OUT = "timed out"
"""What `wait_until` returns when its deadline passed."""


def wait_until(
    check: Callable[[], bool], deadline: float, processes: list[Managed], interval: float = 0.2
) -> str | None:
    """Poll `check` until it holds, a process of `processes` exits, or `deadline` passes.

    Args:
        check (Callable[[], bool]): The condition.
        deadline (float): `time.monotonic()` bound, in seconds.
        processes (list[Managed]): Processes whose exit ends the wait early.
        interval (float, optional): Seconds between polls. Defaults to 0.2.

    Returns:
        str | None: None when `check` held; `TIMED_OUT`; or `exit_report`'s text when a process exited.
    """
    while True:
        report = exit_report(processes)
        if report is not None:
            return report
        if check():
            return None
        if time.monotonic() > deadline:
            return TIMED_OUT
        time.sleep(interval)


def exit_report(processes: list[Managed]) -> str | None:
    """Say which of `processes` exited first, with its status and log tail; None while all run.

    Args:
        processes (list[Managed]): Processes started here, in start order.
    """
    for proc in processes:
        code = proc.exit_code()
        if code is not None:
            return f"{proc.name} exited with status {code}; last lines of {proc.log_path}:\n{log_tail(proc.log_path)}"
    return None


def log_tail(path: pathlib.Path, lines: int = 40) -> str:
    """Return the last lines of a log file ("" when it does not exist).

    Args:
        path (pathlib.Path): Log file.
        lines (int, optional): How many lines. Defaults to 40.
    """
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 64 * 1024))
            data = handle.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def log_tails(paths: Iterable[pathlib.Path], lines: int = 40) -> str:
    """Return the last lines of each log file that exists, each under a header naming it.

    Args:
        paths (Iterable[pathlib.Path]): Log files, in the order to show them.
        lines (int, optional): Lines per file. Defaults to 40.
    """
    return "\n".join(
        f"----- {path} (last {lines} lines) -----\n{log_tail(path, lines)}" for path in paths if path.exists()
    )


class Supervisor:
    """What owns host processes (the control plane, a real node, an add-on): waits on them, reports the first that
    exited, and shows their log tails, raising its own error type.

    Subclasses set :attr:`error` and :attr:`processes` and implement :meth:`log_paths`.

    Attributes:
        error (type[Exception]): What :meth:`_wait` and :meth:`check_alive` raise.
        processes (list[Managed]): The processes started here, in start order.
    """

    error: ClassVar[type[Exception]] = RuntimeError
    processes: list[Managed]

    def log_paths(self) -> list[pathlib.Path]:
        """The log files :meth:`log_tails` shows (those that do not exist are skipped)."""
        raise NotImplementedError

    def log_tails(self, lines: int = 40) -> str:
        """Return the last lines of every log of :meth:`log_paths`, each under a header.

        Args:
            lines (int, optional): Lines per log. Defaults to 40.
        """
        return log_tails(self.log_paths(), lines)

    def stop(self) -> None:
        """Stop every process started here and undo what starting changed; idempotent."""
        raise NotImplementedError

    def _start_or_stop(self, start: Callable[[float], None], timeout: float) -> float:
        """Run ``start(deadline)``; on any failure (an interrupt included) :meth:`stop` what it started, and re-raise.

        Args:
            start (Callable[[float], None]): The start steps, given their ``time.monotonic()`` deadline.
            timeout (float): Seconds from now for ``start``.

        Returns:
            float: Seconds ``start`` took.
        """
        began = time.monotonic()
        try:
            start(began + timeout)
        except BaseException:
            self.stop()
            raise
        return time.monotonic() - began

    def check_alive(self) -> None:
        """Raise when a process started here has exited.

        Raises:
            Exception: :attr:`error`, naming the process and its exit status, with its log tail.
        """
        report = exit_report(self.processes)
        if report is not None:
            raise self.error(report)

    def _wait(self, what: str, deadline: float, check: Callable[[], object]) -> None:
        """Poll ``check`` until it holds (is truthy).

        Args:
            what (str): What is awaited, for the error.
            deadline (float): ``time.monotonic()`` bound, in seconds.
            check (Callable[[], object]): The condition.

        Raises:
            Exception: :attr:`error` when a process exited first (with its log tail) or the deadline passed (with
                every log's tail).
        """
        failure = wait_until(lambda: bool(check()), deadline, self.processes)
        if failure == TIMED_OUT:
            raise self.error(f"timed out waiting for {what}\n{self.log_tails()}")
        if failure is not None:
            raise self.error(f"waiting for {what}: {failure}")
