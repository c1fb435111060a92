"""Ending a runtime process without Python's interpreter finalization.

Weight sync keeps daemon threads that may be inside c10d's C++ with the GIL released when the process ends: a
spare store connection being opened (up to `weights._store.CONNECT_BOUND`), the key watcher's `TCPStore.wait`, a
store call left behind on a dead connection (`weights._store.bounded`). In CPython up to 3.13, a daemon thread that
wants the GIL back during finalization is ended with `pthread_exit`, whose forced unwinding through a `noexcept`
C++ frame calls `std::terminate`: the process then dies of SIGABRT ("terminate called without an active
exception") after it finished its work (python/cpython#87135). Seen once, in an evaluator leaving after a
scale-down. So an evaluator flushes what it wrote and ends with `os._exit`, as its forks in `rlightning run`
already do (`_fork`).
"""

from __future__ import annotations

import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush logging and the standard streams, then end the process with `code` (no atexit handlers, no
    finalization, no daemon thread resumed).

    Args:
        code (int): The exit status, 0-255.
    """
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # closed or broken: nothing more can be written anyway
            pass
    os._exit(code)
