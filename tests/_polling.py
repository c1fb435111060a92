"""Polling until a condition holds, for tests against real processes and the real API server."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_for(
    what: str,
    check: Callable[[], T],
    timeout: float,
    interval: float = 0.3,
    explain: Callable[[], str] | None = None,
) -> T:
    """Call `check()` every `interval` seconds until it returns a truthy value, and return that value.

    Args:
        what (str): What is awaited, for the error message.
        check (Callable[[], T]): The condition; a falsy result means "not yet".
        timeout (float): Seconds before giving up.
        interval (float, optional): Seconds between calls. Defaults to 0.3.
        explain (Callable[[], str] | None, optional): Extra context for the error (a log tail). Defaults to None.

    Raises:
        AssertionError: After `timeout` seconds, naming `what`, the last result and `explain()`.
    """
    deadline = time.monotonic() + timeout
    while True:
        last = check()
        if last:
            return last
        if time.monotonic() > deadline:
            extra = f"\n{explain()}" if explain is not None else ""
            raise AssertionError(f"timed out after {timeout}s waiting for {what} (last: {last!r}){extra}")
        time.sleep(interval)
