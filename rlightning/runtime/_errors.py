"""The failing trainer rank's own exception, first: in torch elastic's error file and in a file the user sees.

torchrun's `ChildFailedError` banner ends a failed run's log, above it hides the rank's own exception. The train
entrypoint is wrapped with `record`: torch's `torch.distributed.elastic.multiprocessing.errors.record` (the rank's
JSON error file, which torchrun copies into its own and shows in the banner), plus one short text in
`contract.ENV_ERROR_FILE`: the exception's type and message, then where it was raised. In a pod that file is the
container's termination message (`/dev/termination-log`, which the operator shows in the PolicyGroup's
conditions); torch's error file cannot be that path, since torchrun replaces an existing file by deleting it, and
a termination log is a mount point. Locally `rlightning run` prints it first when the trainer fails.
"""

from __future__ import annotations

import fcntl
import functools
import logging
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import cast

from torch.distributed.elastic.multiprocessing import errors as elastic_errors

from rlightning import contract

log = logging.getLogger("rlightning.train")

MAX_MESSAGE_BYTES = 4096
"""A termination message's size limit: the kubelet keeps the last 4096 bytes of the file
(`MaxContainerTerminationMessageLength`), so a longer text would lose its first line, the one that matters."""


def describe(error: BaseException) -> str:
    """The exception's type and message, then where it was raised (its innermost frame) and the rank.

    Args:
        error (BaseException): The exception, with its traceback.

    Returns:
        str: Two lines (more when the message has several), for example `ValueError: bad action space` then
            `  at File "policy.py", line 12, in __init__ (rank 1)`; at most `MAX_MESSAGE_BYTES` bytes of UTF-8.
    """
    frames = traceback.extract_tb(error.__traceback__)
    where = f'File "{frames[-1].filename}", line {frames[-1].lineno}, in {frames[-1].name}' if frames else "?"
    text = f"{type(error).__name__}: {error}\n  at {where} (rank {os.environ.get(contract.TORCHRUN_RANK, '0')})"
    return text.encode()[:MAX_MESSAGE_BYTES].decode(errors="ignore")


def write_first(path: Path, text: str) -> bool:
    """Write `text` to `path` unless a rank already wrote there (the first failure is the one to show).

    The file may exist empty (a pod's termination log, created by the kubelet): it is written in place, never
    replaced. Ranks of one node serialise on an exclusive lock.

    Args:
        path (Path): The file.
        text (str): What to write.

    Returns:
        bool: True when written; False when the file already held another rank's text or could not be written
            (logged).
    """
    try:
        with path.open("a+", encoding="utf-8") as file:
            fcntl.flock(file, fcntl.LOCK_EX)
            file.seek(0)
            if file.read(1):
                return False
            file.write(text)
            return True
    except OSError as error:
        log.warning("could not write the error to %s: %s", path, error)
        return False


def record(main: Callable[[], int]) -> Callable[[], int]:
    """Wrap an entrypoint: on an exception, torch's error file (`errors.record`) and `write_first` to
    `contract.ENV_ERROR_FILE` (when set), then the exception goes on (the exit code stays Python's 1).

    Args:
        main (Callable[[], int]): The entrypoint.

    Returns:
        Callable[[], int]: The wrapped entrypoint.
    """
    recorded = elastic_errors.record(main)

    @functools.wraps(main)
    def wrapper() -> int:
        try:
            return cast(int, recorded())  # torch types its wrapper's result Optional; `main`'s is an int
        except Exception as error:
            path = os.environ.get(contract.ENV_ERROR_FILE)
            if path:
                write_first(Path(path), describe(error))
            raise

    return wrapper
