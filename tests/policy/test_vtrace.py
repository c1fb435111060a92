"""V-trace (IMPALA, arXiv:1802.01561, eq. 1): a hand-computed table with clipping and episode ends, the on-policy
reduction to GAE, time-first batches of several env copies, and the errors on bad input."""

from __future__ import annotations

import math

import pytest
import torch
from tensordict import TensorDict

from rlightning.policy._vtrace import VTrace, vtrace
from rlightning.policy.ppo import compute_gae

# Five steps, gamma 0.5. Step 1 terminates (no bootstrap), step 3 is truncated (bootstrapped from next_value 8),
# step 4 is the last (bootstrapped from next_value 2). Within an episode next_value[t] == value[t + 1].
REWARDS = [1.0, 2.0, 0.0, 1.0, 3.0]
VALUES = [2.0, 4.0, 1.0, 2.0, 4.0]
NEXT_VALUES = [4.0, 6.0, 2.0, 8.0, 2.0]
RHOS = [2.0, 0.5, 1.0, 0.25, 4.0]
TERMINATED = [False, True, False, False, False]
TRUNCATED = [False, False, False, True, False]
GAMMA = 0.5


def _batch(*columns: torch.Tensor) -> TensorDict:
    """reward, value, next_value, log_prob, terminated, truncated: a batch of their shape."""
    keys = ("reward", "value", "next_value", "log_prob", "terminated", "truncated")
    return TensorDict(dict(zip(keys, columns, strict=True)), batch_size=columns[0].shape)


def _table(rho_bar: float, c_bar: float) -> VTrace:
    behaviour = torch.tensor([-0.7, -1.2, -0.3, -2.0, -0.1], dtype=torch.float64)
    target = behaviour + torch.tensor(RHOS, dtype=torch.float64).log()
    data = _batch(*(torch.tensor(column, dtype=torch.float64) for column in (REWARDS, VALUES, NEXT_VALUES)),
                  behaviour, torch.tensor(TERMINATED), torch.tensor(TRUNCATED))  # fmt: skip
    return vtrace(data, target, GAMMA, rho_bar=rho_bar, c_bar=c_bar)


def test_the_default_truncation_matches_the_hand_computed_table() -> None:
    """rho-bar = c-bar = 1: clipped rhos [1, .5, 1, .25, 1] and traces c the same.

    delta_t = clip(rho_t) * (r_t + gamma * (1 - term_t) * next_value_t - value_t) = [1, -1, 0, .75, 0];
    v_t - V_t = delta_t + gamma * c_t * (1 - done_t) * (v_{t+1} - V_{t+1}), from the end: [.5, -1, .375, .75, 0];
    advantage_t = r_t + gamma * (1 - term_t) * (v_{t+1}, or next_value_t after an episode end or the last step) - V_t.
    """
    out = _table(rho_bar=1.0, c_bar=1.0)
    assert out.vs.tolist() == pytest.approx([2.5, 3.0, 1.375, 2.75, 4.0])
    assert out.advantages.tolist() == pytest.approx([0.5, -2.0, 0.375, 3.0, 0.0])
    assert out.rhos.tolist() == pytest.approx(RHOS)  # reported unclipped
    assert out.vs.dtype == out.advantages.dtype == torch.float32


def test_rho_bar_clips_the_td_errors_and_c_bar_the_traces_apart() -> None:
    """rho-bar 4, c-bar 0.5: clipped rhos [2, .5, 1, .25, 4], traces c [.5, .5, .5, .25, .5].

    delta = [2, -1, 0, .75, 0]; v - V from the end: [2 + .5*.5*(-1), -1, .5*.5*.75, .75, 0] = [1.75, -1, .1875, .75, 0].
    """
    out = _table(rho_bar=4.0, c_bar=0.5)
    assert out.vs.tolist() == pytest.approx([3.75, 3.0, 1.1875, 2.75, 4.0])
    assert out.advantages.tolist() == pytest.approx([0.5, -2.0, 0.375, 3.0, 0.0])


def test_env_copies_are_independent_columns_of_a_time_first_batch() -> None:
    torch.manual_seed(0)
    steps, envs = 7, 3
    data = _batch(*(torch.randn(steps, envs) for _ in range(4)), torch.rand(steps, envs) < 0.2,
                  torch.rand(steps, envs) < 0.2)  # fmt: skip
    target = torch.randn(steps, envs)
    batch = vtrace(data, target, gamma=0.9, rho_bar=1.5, c_bar=0.8, lambda_=0.9)
    for column in range(envs):
        one = vtrace(data[:, column], target[:, column], gamma=0.9, rho_bar=1.5, c_bar=0.8, lambda_=0.9)
        assert torch.allclose(batch.vs[:, column], one.vs)
        assert torch.allclose(batch.advantages[:, column], one.advantages)


@pytest.mark.parametrize("lambda_", [1.0, 0.8])
def test_on_policy_targets_are_the_gae_returns(lambda_: float) -> None:
    """pi == mu (lag 0, the data's own log-probabilities): rho = c = 1, so v_s is the GAE(lambda) return, and with
    lambda 1 the advantages are GAE's too."""
    torch.manual_seed(1)
    steps, envs = 16, 4
    data = TensorDict(
        {"reward": torch.randn(steps, envs), "value": torch.randn(steps, envs), "next_value": torch.randn(steps, envs),
         "terminated": torch.rand(steps, envs) < 0.1, "truncated": torch.rand(steps, envs) < 0.1},
        batch_size=[steps, envs],
    )  # fmt: skip
    # Within an episode the next observation is the following step's observation: the same value.
    done = data["terminated"] | data["truncated"]
    data["next_value"][:-1] = torch.where(done[:-1], data["next_value"][:-1], data["value"][1:])
    data["log_prob"] = torch.randn(steps, envs)
    out = vtrace(data, data["log_prob"].clone(), gamma=0.97, lambda_=lambda_)
    advantages, returns = compute_gae(data, 0.97, lambda_)
    assert torch.allclose(out.vs, returns, atol=1e-5)
    assert torch.equal(out.rhos, torch.ones(steps, envs))
    if lambda_ == 1.0:
        assert torch.allclose(out.advantages, advantages, atol=1e-5)


def test_bad_input_is_an_error_naming_the_key_or_argument() -> None:
    def ok() -> TensorDict:
        return _batch(*(torch.zeros(4) for _ in range(4)), *(torch.zeros(4, dtype=torch.bool) for _ in range(2)))

    target = torch.zeros(4)
    with pytest.raises(ValueError, match=r"^data: missing key 'next_value'"):
        vtrace(ok().exclude("next_value"), target, gamma=0.9)
    bad = ok().unsqueeze(-1).expand(4, 2).clone()
    bad["value"] = torch.zeros(4, 2, 3)
    with pytest.raises(ValueError, match=r"^data\['value'\]: must have the batch size \[4, 2\], got \[4, 2, 3\]"):
        vtrace(bad, torch.zeros(4, 2), gamma=0.9)
    bad = ok()
    bad["truncated"] = torch.zeros(4)
    with pytest.raises(ValueError, match=r"^data\['truncated'\]: must be bool"):
        vtrace(bad, target, gamma=0.9)
    with pytest.raises(ValueError, match=r"^data: batch size must be \[T\] or \[T, N\]"):
        vtrace(ok()[:0], target[:0], gamma=0.9)
    with pytest.raises(ValueError, match=r"^target_log_prob: must have the batch size \[4\], got \[3\]"):
        vtrace(ok(), torch.zeros(3), gamma=0.9)
    with pytest.raises(ValueError, match=r"^rho_bar: must be >= c_bar \(1.0\)"):
        vtrace(ok(), target, gamma=0.9, rho_bar=0.5)
    with pytest.raises(ValueError, match=r"^c_bar: must be > 0"):
        vtrace(ok(), target, gamma=0.9, c_bar=0.0)
    with pytest.raises(ValueError, match=r"^gamma: must be in \[0, 1\]"):
        vtrace(ok(), target, gamma=1.5)
    with pytest.raises(ValueError, match=r"^lambda_: must be in \[0, 1\]"):
        vtrace(ok(), target, gamma=0.9, lambda_=math.nan)
