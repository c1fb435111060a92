"""V-trace targets: off-policy corrected value targets and policy-gradient advantages over time-first batches.

Source: Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance Weighted Actor-Learner
Architectures" (arXiv:1802.01561), eq. (1), section 4.1's remarks (truncation levels with rho-bar >= c-bar, the
recursive form, lambda in the traces) and section 4.2 (the policy-gradient target `r_s + gamma * v_{s+1}`).
Episode ends follow the batch layout (`rlightning.policy.ppo`): a terminated step is not bootstrapped, a truncated
one is bootstrapped from the value of its final observation, and neither carries a trace into the next episode.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from tensordict import TensorDictBase

KEYS = ("reward", "value", "next_value", "log_prob", "terminated", "truncated")
"""The keys `vtrace` reads from its batch."""


IMPORTANCE_WEIGHT_MEAN = "importance_weight_mean"
"""`train()` statistic of a lag-correcting policy: mean of the importance weights `pi/mu` of an update's batch."""
IMPORTANCE_WEIGHT_CLIPPED_SHARE = "importance_weight_clipped_share"
"""`train()` statistic of a lag-correcting policy: share of an update's importance weights above rho-bar."""


class VTrace(NamedTuple):
    """The V-trace targets of a batch, each time-first like the inputs (`[T]` or `[T, N]`, float32).

    Attributes:
        vs (torch.Tensor): The value targets `v_s` of eq. (1).
        advantages (torch.Tensor): `r_s + gamma * v_{s+1} - V(x_s)` (section 4.2; `v_{s+1}` is the value of the final
            observation at a truncation, and nothing is bootstrapped at a termination). IMPALA's actor-critic weights
            it by `min(rho-bar, rho_s)`; a clipped surrogate over `pi/mu` applies the ratio itself.
        rhos (torch.Tensor): The importance weights `pi(a_s|x_s) / mu(a_s|x_s)`, not clipped.
    """

    vs: torch.Tensor
    advantages: torch.Tensor
    rhos: torch.Tensor


def vtrace(
    data: TensorDictBase,
    target_log_prob: torch.Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lambda_: float = 1.0,
) -> VTrace:
    """V-trace value targets and advantages (IMPALA, arXiv:1802.01561, eq. 1) over a time-first batch.

    With `rho_t = pi(a_t|x_t) / mu(a_t|x_t)`, `delta_t = min(rho-bar, rho_t) * (r_t + gamma * V(x_{t+1}) - V(x_t))`
    and `c_t = lambda * min(c-bar, rho_t)`, the targets are `v_t = V(x_t) + delta_t + gamma * c_t * (v_{t+1} -
    V(x_{t+1}))`, the trace cut at every episode end and after the last step. On-policy (`pi == mu`) with
    `rho-bar, c-bar >= 1` they are the GAE(lambda) returns (arXiv:1506.02438).

    Args:
        data (TensorDictBase): batch size `[T]` or `[T, N]` (time first), with `reward` (`r_t`, float), `value`
            (`V(x_t)` of each step's observation, float), `next_value` (`V(x_{t+1})` of each step's next observation,
            the final one when the episode ended there, float), `log_prob` (`log mu(a_t|x_t)`, the behaviour
            policy's, as recorded when the action was taken, float), `terminated` (bool: a terminal state at `t`, no
            bootstrap) and `truncated` (bool: the episode was cut at `t`, bootstrapped from `next_value`), each of
            the batch size.
        target_log_prob (torch.Tensor): `log pi(a_t|x_t)` of the policy being learned, of the batch size, float.
        gamma (float): Discount, in [0, 1].
        rho_bar (float, optional): Truncation of the importance weights in `delta_t` (> 0, >= `c_bar`).
            Defaults to 1.0, as IMPALA.
        c_bar (float, optional): Truncation of the traces `c_t` (> 0). Defaults to 1.0, as IMPALA.
        lambda_ (float, optional): Trace decay in [0, 1] (section 4.1's remark). Defaults to 1.0.

    Returns:
        VTrace: `vs`, `advantages` and `rhos`, each of the batch size, float32.

    Raises:
        ValueError: Naming the key or argument, when the batch is not `[T]` or `[T, N]` with `T >= 1`, a key is
            missing, not of the batch size or (`terminated`, `truncated`) not bool, `target_log_prob` is not of the
            batch size, or `gamma`, `rho_bar`, `c_bar` or `lambda_` breaks its rule.

    Examples:
        >>> zeros, no = torch.zeros(5), torch.zeros(5, dtype=torch.bool)
        >>> data = TensorDict({"reward": torch.ones(5), "value": zeros, "next_value": zeros, "log_prob": zeros,
        ...                    "terminated": no, "truncated": no}, batch_size=[5])
        >>> vtrace(data, zeros, gamma=0.5).vs  # 1 + 0.5 + 0.25 + ... from each step to the end: float32 [5]
        tensor([1.9375, 1.8750, 1.7500, 1.5000, 1.0000])
    """
    _check(data, target_log_prob)
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma: must be in [0, 1], got {gamma}")
    if c_bar <= 0:
        raise ValueError(f"c_bar: must be > 0, got {c_bar}")
    if rho_bar < c_bar:
        raise ValueError(f"rho_bar: must be >= c_bar ({c_bar}), as IMPALA assumes, got {rho_bar}")
    if not 0.0 <= lambda_ <= 1.0:
        raise ValueError(f"lambda_: must be in [0, 1], got {lambda_}")
    rewards, values, next_values = data["reward"].float(), data["value"].float(), data["next_value"].float()
    rhos = (target_log_prob.float() - data["log_prob"].float()).exp()
    not_terminated = (~data["terminated"]).float()
    not_done = ~(data["terminated"] | data["truncated"])
    deltas = rhos.clamp(max=rho_bar) * (rewards + gamma * not_terminated * next_values - values)
    traces = gamma * lambda_ * rhos.clamp(max=c_bar) * not_done.float()
    vs_minus_values = torch.empty_like(values)
    running = torch.zeros_like(values[0])
    for t in reversed(range(values.shape[0])):
        running = deltas[t] + traces[t] * running
        vs_minus_values[t] = running
    vs = values + vs_minus_values
    # The bootstrap of each step's policy-gradient target: v_{t+1} within an episode, else the next observation's value.
    next_vs = next_values.clone()
    next_vs[:-1] = torch.where(not_done[:-1], vs[1:], next_values[:-1])
    advantages = rewards + gamma * not_terminated * next_vs - values
    return VTrace(vs, advantages, rhos)


def _check(data: TensorDictBase, target_log_prob: torch.Tensor) -> None:
    size = data.batch_size
    if len(size) not in (1, 2) or size[0] < 1:
        raise ValueError(f"data: batch size must be [T] or [T, N] with T >= 1, got {list(size)}")
    for key in KEYS:
        if key not in data.keys():  # noqa: SIM118 - a TensorDict refuses `in` on itself
            raise ValueError(f"data: missing key {key!r} (needs {list(KEYS)})")
        value = data[key]
        if value.shape != size:
            raise ValueError(f"data[{key!r}]: must have the batch size {list(size)}, got {list(value.shape)}")
        if key in ("terminated", "truncated") and value.dtype != torch.bool:
            raise ValueError(f"data[{key!r}]: must be bool, got {value.dtype}")
    if target_log_prob.shape != size:
        raise ValueError(f"target_log_prob: must have the batch size {list(size)}, got {list(target_log_prob.shape)}")
