"""`rlightning.runtime.torchrun --start-method=fork -m MODULE`: the ranks of a local run are forks of torchrun's agent.

They begin with the agent's imports, yet see what a fresh rank sees (torchrun's variables, default signal handlers,
no root log handler), and torchrun's agent supervises them as its own: restarts and exit codes as before.
"""

from __future__ import annotations

import itertools
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from rlightning import contract, launch
from tests._ports import RUNTIME_TORCHRUN

# The forks happen in torchrun's agent, a fresh process of one thread: only the platform decides, never this test
# runner's threads (`_fork.available` in this process would read them).
FORKS = hasattr(os, "fork") and hasattr(os, "pidfd_open")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not FORKS, reason="forks with a pidfd: Linux only")]

REPO = Path(__file__).resolve().parents[2]
_RUNS = itertools.count()

RANK = """
import logging, os, signal, sys
env = os.environ
print(f"rank {env['RANK']}/{env['WORLD_SIZE']} local {env['LOCAL_RANK']} restart {env['TORCHELASTIC_RESTART_COUNT']}"
      f" agent's imports {'torch.distributed.run' in sys.modules}"  # the agent's; this module imports nothing
      f" fresh {signal.getsignal(signal.SIGTERM) is signal.SIG_DFL and not logging.root.handlers} argv {sys.argv[1:]}")
if env["RANK"] == "1" and env["TORCHELASTIC_RESTART_COUNT"] == "0":
    sys.exit(3)
"""


def torchrun(tmp_path: Path, *options: str) -> subprocess.CompletedProcess[str]:
    """Run 2 ranks of the module `RANK` under `rlightning.runtime.torchrun` with `options`, loopback only."""
    (tmp_path / "fork_rank.py").write_text(textwrap.dedent(RANK))
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(tmp_path), str(REPO), os.environ.get("PYTHONPATH", "")]),
        contract.ENV_BIND_HOST: contract.LOOPBACK_HOST,
        launch.THREADS_ENV: "1",
    }
    argv = [
        sys.executable, "-m", launch.LOOPBACK_TORCHRUN_MODULE, *options, "--nnodes=1", "--nproc-per-node=2",
        f"--master-addr={contract.LOOPBACK_HOST}", f"--master-port={RUNTIME_TORCHRUN.port(next(_RUNS))}",
        "--monitor-interval=0.1", "-m", "fork_rank", "an-arg",
    ]  # fmt: skip
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)


def test_forked_ranks_begin_with_the_agents_imports_and_restart_as_torchruns_ranks(tmp_path: Path) -> None:
    done = torchrun(tmp_path, launch.FORK_RANKS, "--max-restarts=1")
    assert done.returncode == 0, done.stderr
    for restart in (0, 1):
        for rank in (0, 1):
            line = f"rank {rank}/2 local {rank} restart {restart} agent's imports True fresh True argv ['an-arg']"
            assert line in done.stdout


def test_a_forked_rank_that_fails_fails_torchrun_with_its_exit_code_in_the_report(tmp_path: Path) -> None:
    done = torchrun(tmp_path, launch.FORK_RANKS, "--max-restarts=0")
    assert done.returncode == 1
    assert "restart 0 agent's imports True" in done.stdout and "restart 1" not in done.stdout
    assert "exitcode  : 3" in done.stderr and "local_rank: 1" in done.stderr  # torchrun's ChildFailedError banner

