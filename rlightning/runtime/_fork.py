"""`python -m MODULE ARGS` as a fork of this process: a child that starts with this process's imports.

The local launcher imports torch, tensordict, gymnasium and the policy class for its deep checks before it
starts anything; an evaluator or torchrun's agent started with `subprocess` imports them all again (seconds of
CPU each, on cores the trainer ranks need). A fork shares them. The child is otherwise what `subprocess.Popen`
with `start_new_session=True` would start: a session of its own, stdin from /dev/null, stdout and stderr to
one file, the given environment, default SIGINT and SIGTERM handlers, an unconfigured root logger, and exit
codes as the interpreter gives them (a `SystemExit` code, 1 for an uncaught exception). As with multiprocessing's
`fork` start method, the child ends with `os._exit`: the parent's atexit handlers do not run twice. Linux only
(`available`).
"""

from __future__ import annotations

import importlib
import logging
import os
import runpy
import select
import signal
import subprocess
import sys
import threading
import traceback
from collections.abc import Iterable, Mapping, Sequence
from typing import NoReturn

from rlightning import launch


def available() -> bool:
    """Whether a fork is safe here: the platform forks and waits on a pid with a timeout (`os.fork`,
    `os.pidfd_open`: Linux), this process runs one thread (a fork copies only the calling thread, so a lock
    another thread held, in a library or an embedding such as a pytest-xdist worker, would stay held in the child),
    and it has not initialized CUDA (a forked child cannot use CUDA then: "Cannot re-initialize CUDA in forked
    subprocess", PyTorch's multiprocessing notes; a policy module that touched CUDA at import would do that).
    """
    torch = sys.modules.get("torch")
    cuda_initialized = torch is not None and torch.cuda.is_initialized()
    return hasattr(os, "fork") and hasattr(os, "pidfd_open") and threading.active_count() == 1 and not cuda_initialized


def preload(modules: Iterable[str]) -> None:
    """Import here, before forking, what `modules` import, so that forks that run them begin with it.

    Each child runs its module with `runpy` as `__main__`; its imports (for a trainer rank, the runtime's weight
    sync, trajectories and records) would otherwise be imported again by every child that runs it. A module not
    yet imported leaves `sys.modules` again once its own imports are cached, so the child runs it afresh, as a
    fresh interpreter would (runpy warns of a module already imported under its own name).

    Args:
        modules (Iterable[str]): Module names, for example `rlightning.runtime.train`; repeats are imported once. One
            that cannot be imported is skipped: the child that runs it fails on it and says why in its own log.
    """
    for module in dict.fromkeys(modules):
        if module in sys.modules:
            continue
        try:
            importlib.import_module(module)
        except ImportError:
            continue
        del sys.modules[module]


class ForkedModule:
    """A running fork of this process that runs `python -m module args`; `subprocess.Popen`'s supervision API.

    Args:
        module (str): The module run as `__main__`, for example `rlightning.runtime.eval`.
        args (Sequence[str]): Its arguments (`sys.argv[1:]`).
        env (Mapping[str, str]): Its whole environment.
        log_fd (int): File descriptor its stdout and stderr go to.

    Attributes:
        pid (int): The child's process id, also its session's and process group's.
        returncode (int | None): Exit code; minus the signal number when a signal ended it; None while running.
    """

    def __init__(self, module: str, args: Sequence[str], env: Mapping[str, str], log_fd: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()  # else the child writes this process's buffered output again
        session_read, session_write = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.close(session_read)
            _run_child(module, args, env, log_fd, session_write)
        os.close(session_write)
        # EOF once the child leads its own session (or died): only then does its process group exist to be
        # signalled (`os.killpg(pid, ...)`), as after `subprocess.Popen(start_new_session=True)`.
        os.read(session_read, 1)
        os.close(session_read)
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """Exit code, or None while running (reaps the child when it ended)."""
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to end.

        Args:
            timeout (float | None, optional): Seconds; None waits without bound. Defaults to None.

        Returns:
            int: The exit code (see `returncode`).

        Raises:
            subprocess.TimeoutExpired: The child still runs after `timeout` seconds.
        """
        if self.poll() is not None:
            return self.returncode  # type: ignore[return-value]  # poll() set it
        pidfd = os.pidfd_open(self.pid)
        try:
            readable, _, _ = select.select([pidfd], [], [], timeout)
        finally:
            os.close(pidfd)
        if not readable:
            raise subprocess.TimeoutExpired(f"pid {self.pid}", timeout or 0.0)
        _, status = os.waitpid(self.pid, 0)
        self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


def run_module(module: str, args: Sequence[str]) -> None:
    """In a forked child: undo what it inherited that a fresh interpreter would not have, then run `python -m
    module args` (`runpy`, as `__main__`). Its exceptions and `SystemExit` propagate to the caller.

    Reset: SIGINT, SIGTERM, SIGHUP and SIGQUIT to their defaults (the launcher's and torchrun's agent's handlers
    would act for the child), the root logger (an inherited handler would make an entrypoint's `logging.basicConfig`
    do nothing and send its records where the parent logs), and torch's intra-op threads from `OMP_NUM_THREADS`
    (torch read it when the parent imported it).

    Args:
        module (str): The module run as `__main__`, for example `rlightning.runtime.train`.
        args (Sequence[str]): Its arguments (`sys.argv[1:]`).
    """
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(signum, signal.SIG_DFL)
    for handler in logging.root.handlers[:]:
        logging.root.removeHandler(handler)
    logging.root.setLevel(logging.WARNING)
    torch = sys.modules.get("torch")
    threads = os.environ.get(launch.THREADS_ENV, "")
    if torch is not None and threads.isdigit():
        torch.set_num_threads(int(threads))
    sys.argv = [module, *args]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


def _run_child(module: str, args: Sequence[str], env: Mapping[str, str], log_fd: int, session_fd: int) -> NoReturn:
    """In the forked child: become a fresh `python -m module args` as far as it can see, run it, exit.

    `session_fd` is closed once the child leads its own session: the parent waits for that.
    """
    code = 1
    try:
        os.setsid()
        os.close(session_fd)
        null = os.open(os.devnull, os.O_RDONLY)
        os.dup2(null, 0)
        os.dup2(log_fd, 1)
        os.dup2(log_fd, 2)
        # New stream objects: a lock that another thread of the parent held at the fork stays held in the copies.
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the interpreter's own stream, never closed
        sys.stdout = open(1, "w", buffering=1, closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", buffering=1, closefd=False)  # noqa: SIM115
        os.environ.clear()
        os.environ.update(env)
        run_module(module, args)
        code = 0
    except SystemExit as done:
        if done.code is None or isinstance(done.code, int):
            code = done.code or 0
        else:
            print(done.code, file=sys.stderr)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(code)
