"""The file behind a pod's probe (`contract.ENV_HEALTH_FILE`, `rlightning.launch.probe`): created, touched, removed.

Outside pods there is no file (the path is None) and every call does nothing.
"""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger(__name__)


def touch(path: Path | None) -> None:
    """Create the file or refresh its modification time; an OSError is logged, never raised (a probe that fails is
    the kubelet's signal, not a reason to stop).
    """
    if path is None:
        return
    try:
        path.touch()
    except OSError as error:
        log.warning("cannot touch the probe's file %s: %s", path, error)


def remove(path: Path | None) -> None:
    """Remove the file (an evaluator leaving: no longer ready); a missing file is fine."""
    if path is not None:
        path.unlink(missing_ok=True)
