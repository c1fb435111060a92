"""Running a small script as the ranks of a real gloo group, for tests of DDP behaviour across processes."""

from __future__ import annotations

import datetime
import json
import os
import subprocess
import sys
from pathlib import Path

import torch.distributed as dist

WORKER_TIMEOUT_SECONDS = 150.0
"""Bound for each rank's process to finish."""


def run_ranks(script: Path, world_size: int, tmp_path: Path, extra_args: list[list[str]]) -> list[dict]:
    """Start `script` once per rank and return each rank's JSON result.

    Each rank runs `python script STORE_PORT RANK WORLD_SIZE *extra_args[rank] OUT` and writes a JSON object to
    OUT; the test process hosts the TCPStore they rendezvous on (port chosen by the OS).

    Args:
        script (Path): The worker script.
        world_size (int): Number of ranks.
        tmp_path (Path): Where the result files go.
        extra_args (list[list[str]]): Arguments per rank, placed between WORLD_SIZE and OUT.

    Returns:
        list[dict]: The results, by rank.

    Raises:
        AssertionError: When a rank exits non-zero (its output is in the message).
        subprocess.TimeoutExpired: When a rank runs past WORKER_TIMEOUT_SECONDS (all ranks are killed).
    """
    store = dist.TCPStore(
        "127.0.0.1", 0, world_size + 1, True, timeout=datetime.timedelta(seconds=60), wait_for_workers=False
    )
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONFAULTHANDLER="1")  # an abort prints every thread's stack
    outs = [tmp_path / f"rank{rank}.json" for rank in range(world_size)]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(store.port), str(rank), str(world_size), *extra_args[rank], str(out)],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        for rank, out in enumerate(outs)
    ]
    try:
        for proc in procs:
            output, _ = proc.communicate(timeout=WORKER_TIMEOUT_SECONDS)
            assert proc.returncode == 0, output
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    return [json.loads(out.read_text()) for out in outs]
