"""A stop request from SIGTERM or SIGINT, checked by a process's main loop at a safe point."""

from __future__ import annotations

import signal
import threading


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
        self.event.set()

    @property
    def requested(self) -> bool:
        """Whether a stop signal arrived."""
        return self.event.is_set()
