"""Signals: a stop request from SIGTERM or SIGINT checked at a safe point, and ranks that die with torchrun."""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading

PR_SET_PDEATHSIG = 1
"""prctl(2) option: the signal this process gets when its parent dies (linux/prctl.h)."""


_received: list[str] = []
"""Names of the stop signals a `StopRequest` of this process took, in order."""


def stop_signal() -> str | None:
    """The first stop signal (`SIGTERM`, `SIGINT`) a `StopRequest` of this process took, or None."""
    return _received[0] if _received else None


class StopRequest:
    """Turns SIGTERM and SIGINT into a flag (installed on construction, main thread only).

    Kubernetes sends SIGTERM before it kills a pod; torchrun forwards it to its ranks; `rlightning run`
    sends it on Ctrl-C. The loop finishes its step, then checkpoints and exits.
    """

    def __init__(self) -> None:
        self.event = threading.Event()
        self.signal_name: str | None = None
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._handle)

    def _handle(self, signum: int, frame: object) -> None:
        del frame
        self.signal_name = signal.Signals(signum).name
        _received.append(self.signal_name)
        self.event.set()

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.event.is_set()


def die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (torchrun's agent) dies.

    torchrun starts every rank in a session of its own, so when the agent itself is killed (SIGKILL, OOM) no
    signal reaches the ranks and they train on as orphans; `rlightning run` cannot reach them through the
    agent's process group either. (In a pod the container's end takes them anyway.) Linux only (prctl(2),
    PR_SET_PDEATHSIG); elsewhere a no-op.

    Raises:
        OSError: When prctl fails.
        SystemExit: With code 1 when the parent died before the call took effect.
    """
    if not sys.platform.startswith("linux"):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent:
        raise SystemExit(1)
