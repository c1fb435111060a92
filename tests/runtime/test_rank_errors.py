"""The failing rank's own exception: written once (the first failure), in place (a termination log is a mount),
with type, message and where it was raised; the exception still propagates."""

from __future__ import annotations

import pytest

from rlightning import contract
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
