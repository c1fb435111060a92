"""A failing process's own exception: written once (the first failing rank), in place (a termination log is a mount),
with type, message and where it was raised; the exception still propagates. An evaluator writes its own too."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rlightning import contract, launch
from rlightning.config import parse_manifest
from rlightning.runtime import _errors


def _broken() -> int:
    raise ValueError("action space Discrete(2) is not supported")


def test_the_first_failure_is_written_in_place_and_kept(tmp_path, monkeypatch) -> None:
    path = tmp_path / "termination-log"
    path.touch()  # the kubelet creates it; it must be written, never replaced
    inode = path.stat().st_ino
    monkeypatch.setenv(contract.ENV_ERROR_FILE, str(path))
    monkeypatch.setenv("RANK", "1")
    monkeypatch.delenv("TORCHELASTIC_ERROR_FILE", raising=False)
    with pytest.raises(ValueError, match="Discrete"):
        _errors.record(_broken)()
    first, where = path.read_text().splitlines()
    assert first == "ValueError: action space Discrete(2) is not supported"
    assert where.startswith('  at File "') and "in _broken (rank 1)" in where and "test_rank_errors.py" in where
    assert path.stat().st_ino == inode
    assert not _errors.write_first(path, "RuntimeError: a peer went away")  # a later rank's failure is not first
    assert path.read_text().startswith("ValueError")


def test_a_long_message_is_cut_to_what_the_kubelet_keeps() -> None:
    try:
        raise RuntimeError("é" * 5000)
    except RuntimeError as error:
        text = _errors.describe(error)
    assert len(text.encode()) <= _errors.MAX_MESSAGE_BYTES and text.startswith("RuntimeError: éé")


def test_an_evaluator_that_raises_writes_its_exception_where_its_pod_says(tmp_path, write_manifest, run_helpers):
    """A real evaluator process (`python -m rlightning.runtime.eval`) with a pod's launch plan, whose policy fails to
    start serving: exit 1, and its termination message names the exception, where it was raised and the evaluator
    (the ordinal from the pod's name)."""
    (tmp_path / "broken_eval.py").write_text(
        "from rlightning.policy.ppo import PPOPolicy\n\n\n"
        "class BrokenEvalPolicy(PPOPolicy):\n"
        "    def init_eval(self, *args, **kwargs):\n"
        "        raise RuntimeError('no env copy left for evaluation')\n"
    )
    tiny_manifest = run_helpers[0]
    doc = tiny_manifest(policy={"policyClass": "broken_eval:BrokenEvalPolicy", "policyKwargs": {}})
    spec_path = write_manifest(doc)
    site = launch.LaunchSite(python=sys.executable, master_addr="127.0.0.1", trainer_hosts=("127.0.0.1",),
                             spec_path=str(spec_path), run_dir=str(tmp_path / "run"), node_rank=None, metrics=False,
                             expected_evaluators=None, in_pod=True)
    plan = launch.plan(parse_manifest(doc), contract.PolicyRole.EVAL, site)
    assert plan.env[contract.ENV_ERROR_FILE] == contract.TERMINATION_LOG_IN_POD  # what the pod's evaluator writes
    message = tmp_path / "termination-log"
    message.touch()  # the kubelet creates it
    env = {name: value for name, value in os.environ.items() if name not in launch.RUNTIME_ENV}
    pythonpath = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    env.update(plan.env, PYTHONPATH=pythonpath, **{contract.ENV_ERROR_FILE: str(message),
                                                   contract.ENV_POD_NAME: "tiny-eval-3", contract.ENV_NAMESPACE: "ns"})
    done = subprocess.run(list(plan.argv), env=env, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 1, done.stderr
    first, where = message.read_text().splitlines()
    assert first == "RuntimeError: no env copy left for evaluation", done.stderr
    assert 'broken_eval.py", line 6, in init_eval (evaluator 3)' in where, where
