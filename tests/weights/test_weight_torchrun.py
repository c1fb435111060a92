"""The sender works from inside a torchrun-launched DDP rank (TORCHELASTIC_USE_AGENT_STORE set)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from wsync_helpers import HERE, PYTHON, start_receiver, stop, weights_for

from rlightning.weights import tensor_digests
from tests._ports import WEIGHTS_TORCHRUN

pytestmark = pytest.mark.slow  # each test starts processes that import torch (seconds apiece)

MASTER_PORT, WSYNC_PORT = WEIGHTS_TORCHRUN.port(0), WEIGHTS_TORCHRUN.port(1)


@pytest.mark.timeout(180)
def test_sender_inside_torchrun_rank(tmp_path: Path):
    receiver = start_receiver(WSYNC_PORT, 0)
    result = tmp_path / "result.json"
    cmd = [
        str(Path(PYTHON).with_name("torchrun")), "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
        "--master-port", str(MASTER_PORT), str(HERE / "wsync_torchrun_sender.py"), str(WSYNC_PORT), str(result),
    ]
    # keep the caller's path (a checkout other than the installed one) after the helpers' directory
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=path)
    try:
        run = subprocess.run(cmd, capture_output=True, text=True, timeout=150, env=env)
        assert run.returncode == 0, run.stderr[-4000:]
    finally:
        stop([receiver])
    doc = json.loads(result.read_text())
    assert doc["agent_store"] == "True" and doc["world_size"] == 2
    assert doc["acked"] == [0]
    assert doc["report_digest"] == tensor_digests(weights_for(1))
    assert doc["all_reduce"] == 2.0
