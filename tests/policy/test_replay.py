"""The bounded circular replay buffer behind SAC: overwrite order, sampling, layout checks."""

from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from rlightning.policy._replay import CircularReplayBuffer


def _steps(first: int, count: int) -> TensorDict:
    ids = torch.arange(first, first + count)
    return TensorDict({"id": ids, "obs": ids.float()[:, None].expand(count, 3).clone()}, batch_size=[count])


def test_holds_the_newest_capacity_transitions() -> None:
    buffer = CircularReplayBuffer(5)
    buffer.extend(_steps(0, 3))
    assert len(buffer) == 3
    buffer.extend(_steps(3, 4))  # wraps: 0 and 1 are overwritten
    assert len(buffer) == 5
    drawn = buffer.sample(2000, generator=torch.Generator().manual_seed(0))
    assert set(drawn["id"].tolist()) == {2, 3, 4, 5, 6}
    assert torch.equal(drawn["obs"][:, 0], drawn["id"].float())  # rows stay whole
    buffer.extend(_steps(100, 12))  # larger than the capacity: only its last 5
    assert set(buffer.sample(2000)["id"].tolist()) == {107, 108, 109, 110, 111}


def test_sampling_is_uniform_and_reproducible() -> None:
    buffer = CircularReplayBuffer(4)
    buffer.extend(_steps(0, 4))
    a = buffer.sample(8000, generator=torch.Generator().manual_seed(1))
    b = buffer.sample(8000, generator=torch.Generator().manual_seed(1))
    assert torch.equal(a["id"], b["id"]) and a.batch_size == torch.Size([8000])
    counts = torch.bincount(a["id"], minlength=4)
    assert counts.min() > 1800 and counts.max() < 2200


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="capacity must be at least 1"):
        CircularReplayBuffer(0)
    buffer = CircularReplayBuffer(4)
    with pytest.raises(RuntimeError, match="empty replay buffer"):
        buffer.sample(1)
    with pytest.raises(ValueError, match=r"takes \[B\] transitions"):
        buffer.extend(_steps(0, 4).reshape(2, 2))
    buffer.extend(_steps(0, 2))
    with pytest.raises(ValueError, match="holds keys"):
        buffer.extend(_steps(0, 2).exclude("obs"))
    wrong = _steps(0, 2)
    wrong["obs"] = torch.zeros(2, 4)
    with pytest.raises(ValueError, match="do not fit"):
        buffer.extend(wrong)


def test_state_dict_holds_the_transitions_oldest_first_and_loads_back() -> None:
    buffer = CircularReplayBuffer(5)
    assert buffer.state_dict() == {"transitions": {}}
    buffer.extend(_steps(0, 3))
    assert buffer.state_dict()["transitions"]["id"].tolist() == [0, 1, 2]
    buffer.extend(_steps(3, 4))  # wrapped: slots hold 5, 6, 2, 3, 4
    state = buffer.state_dict()
    assert state["transitions"]["id"].tolist() == [2, 3, 4, 5, 6]
    assert torch.equal(state["transitions"]["obs"][:, 0], state["transitions"]["id"].float())
    resumed = CircularReplayBuffer(5)
    resumed.load_state_dict(state)
    assert len(resumed) == 5 and resumed.state_dict()["transitions"]["id"].tolist() == [2, 3, 4, 5, 6]
    resumed.extend(_steps(7, 1))  # and it goes on overwriting the oldest
    assert resumed.state_dict()["transitions"]["id"].tolist() == [3, 4, 5, 6, 7]
    smaller = CircularReplayBuffer(2)
    smaller.load_state_dict(state)  # a smaller bufferSize after a resume keeps the newest
    assert smaller.state_dict()["transitions"]["id"].tolist() == [5, 6]
    smaller.load_state_dict({"transitions": {}})
    assert len(smaller) == 0
    with pytest.raises(ValueError, match="as many transitions"):
        smaller.load_state_dict({"transitions": {"id": torch.arange(3), "obs": torch.zeros(2, 3)}})
