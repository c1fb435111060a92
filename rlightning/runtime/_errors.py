"""A failing process's own exception, first: in torch elastic's error file and in a file the user sees.

torchrun's `ChildFailedError` banner ends a failed run's log, above it hides the rank's own exception. The train
entrypoint is wrapped with `record`: torch's `torch.distributed.elastic.multiprocessing.errors.record` (the rank's
JSON error file, which torchrun copies into its own and shows in the banner), plus one short text in
`contract.ENV_ERROR_FILE` (`reported`): the exception's type and message, then where it was raised. The eval
entrypoint is wrapped with `reported` alone (no torchrun runs it). In a pod that file is the container's
termination message (`/dev/termination-log`, which the operator shows in the PolicyGroup's conditions); torch's
error file cannot be that path, since torchrun replaces an existing file by deleting it, and a termination log is
a mount point. Locally `rlightning run` prints the trainer's first when the trainer fails.
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
from rlightning.runtime import settings

log = logging.getLogger("rlightning.runtime")

MAX_MESSAGE_BYTES = 4096
"""A termination message's size limit: the kubelet keeps the last 4096 bytes of the file
(`MaxContainerTerminationMessageLength`), so a longer text would lose its first line, the one that matters."""


def _process() -> str:
    """Which process this is: `evaluator N` (`contract.ENV_ROLE` eval), else the trainer's `rank N`."""
    if os.environ.get(contract.ENV_ROLE) == contract.PolicyRole.EVAL:
        try:
            return f"evaluator {settings.eval_ordinal(os.environ)}"
        except settings.SettingsError:
            return "evaluator"
    try:
        return f"rank {contract.TorchrunEnv.from_env(os.environ).rank}"
    except ValueError:  # describing a failure must not fail on a malformed RANK
        return "a trainer rank"


def describe(error: BaseException) -> str:
    """The exception's type and message, then where it was raised (its innermost frame) and the process.

    Args:
        error (BaseException): The exception, with its traceback.

    Returns:
        str: Two lines (more when the message has several), for example `ValueError: bad action space` then
            `  at File "policy.py", line 12, in __init__ (rank 1)` (an evaluator: `(evaluator 3)`); at most
            `MAX_MESSAGE_BYTES` bytes of UTF-8.
    """
    frames = traceback.extract_tb(error.__traceback__)
    where = f'File "{frames[-1].filename}", line {frames[-1].lineno}, in {frames[-1].name}' if frames else "?"
    text = f"{type(error).__name__}: {error}\n  at {where} ({_process()})"
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


def reported(main: Callable[[], int | None]) -> Callable[[], int]:
    """Wrap an entrypoint: on an exception, `write_first` its `describe` to `contract.ENV_ERROR_FILE` (when set),
    then the exception goes on (the exit code stays Python's 1).

    Args:
        main (Callable[[], int | None]): The entrypoint (it returns an exit code).

    Returns:
        Callable[[], int]: The wrapped entrypoint.
    """

    @functools.wraps(main)
    def wrapper() -> int:
        try:
            return cast(int, main())  # torch's `record` types its wrapper's result Optional; an entrypoint's is int
        except Exception as error:
            path = os.environ.get(contract.ENV_ERROR_FILE)
            if path:
                write_first(Path(path), describe(error))
            raise

    return wrapper


def record(main: Callable[[], int]) -> Callable[[], int]:
    """Wrap a trainer rank's entrypoint: on an exception, torch's error file (`errors.record`), then `reported`.

    Args:
        main (Callable[[], int]): The entrypoint.

    Returns:
        Callable[[], int]: The wrapped entrypoint.
    """
    return reported(elastic_errors.record(main))
