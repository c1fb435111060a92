"""Running observation statistics as module buffers, so they are synced, fingerprinted and checkpointed as weights.

The update merges a batch's moments into the running ones with the parallel algorithm of Chan, Golub and LeVeque
1979 ("Updating Formulae and a Pairwise Algorithm for Computing Sample Variances"), as gymnasium's
`NormalizeObservation` and Stable-Baselines3's `RunningMeanStd` do; normalised values are clipped to
`[-clip, clip]` (their default 10). Under DDP the batch moments are summed over the ranks first, so every rank
holds the same statistics.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import nn


class RunningObservationNorm(nn.Module):
    """Normalises observations `[B, D]` by a running mean and variance over everything passed to `update`.

    Args:
        size (int): D, the flattened observation size.
        clip (float, optional): Bound of the normalised values. Defaults to 10.0.
        epsilon (float, optional): Added to the variance under the square root. Defaults to 1e-8.

    Attributes:
        mean (torch.Tensor): `[D]` float64 buffer.
        var (torch.Tensor): `[D]` float64 buffer, population variance.
        count (torch.Tensor): `[]` float64 buffer, observations seen (starts at 1e-4 so the first update dominates,
            as in Stable-Baselines3).

    Examples:
        >>> norm = RunningObservationNorm(2)
        >>> norm.update(torch.tensor([[1.0, 10.0], [3.0, 30.0]]))
        >>> norm(torch.tensor([[2.0, 20.0]])).abs().max() < 1e-3
        tensor(True)
    """

    mean: torch.Tensor
    var: torch.Tensor
    count: torch.Tensor

    def __init__(self, size: int, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.epsilon = clip, epsilon
        self.register_buffer("mean", torch.zeros(size, dtype=torch.float64))
        self.register_buffer("var", torch.ones(size, dtype=torch.float64))
        self.register_buffer("count", torch.tensor(1e-4, dtype=torch.float64))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """`(obs - mean) / sqrt(var + epsilon)`, clipped; `[B, D]` float32 in and out."""
        std = torch.sqrt(self.var + self.epsilon)
        return ((obs.double() - self.mean) / std).clamp(-self.clip, self.clip).to(obs.dtype)

    @torch.no_grad()
    def update(self, obs: torch.Tensor) -> None:
        """Merge the moments of `obs` `[B, D]` (of every data-parallel rank, when the default group has more than
        one) into the running statistics. Under DDP every rank must call this at the same time.
        """
        obs = obs.reshape(-1, self.mean.shape[0]).double()
        moments = torch.cat([obs.new_tensor([obs.shape[0]]), obs.sum(0), (obs * obs).sum(0)])
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            dist.all_reduce(moments)
        size = self.mean.shape[0]
        count, total, squares = moments[0], moments[1 : 1 + size], moments[1 + size :]
        if count == 0:
            return
        batch_mean = total / count
        batch_var = (squares / count - batch_mean**2).clamp_min(0)
        merged = self.count + count
        delta = batch_mean - self.mean
        self.mean += delta * count / merged
        self.var.copy_((self.var * self.count + batch_var * count + delta**2 * self.count * count / merged) / merged)
        self.count.copy_(merged)


class RunningRewardNorm(nn.Module):
    """Scales rewards `[T, N]` by the running standard deviation of the discounted return, as gymnasium's
    `NormalizeReward` wrapper does (the reward scaling of CleanRL's ppo_continuous_action.py and of Engstrom et al.
    2020, "Implementation Matters in Deep Policy Gradients", arXiv:2005.12729): `r / sqrt(Var[G] + epsilon)`, clipped to
    `[-clip, clip]`, where `G_t = gamma * G_{t-1} * (1 - done_{t-1}) + r_t` per env copy. The mean is not subtracted.

    It runs on the trainer, over each batch as it arrives: `G` starts at 0 at a batch's first step (a batch carries no
    state of the evaluator that collected it), where the wrapper carries it on across its env's steps.

    Args:
        gamma (float): The discount of `G` (the algorithm's own).
        clip (float, optional): Bound of the scaled rewards. Defaults to 10.0.
        epsilon (float, optional): Added to the variance under the square root. Defaults to 1e-8.

    Attributes:
        returns (RunningObservationNorm): The running mean and variance of `G` (`[1]` float64 buffers).
    """

    def __init__(self, gamma: float, clip: float = 10.0, epsilon: float = 1e-8) -> None:
        super().__init__()
        self.gamma, self.clip, self.epsilon = gamma, clip, epsilon
        self.returns = RunningObservationNorm(1, clip=float("inf"), epsilon=epsilon)

    @torch.no_grad()
    def update_and_scale(self, reward: torch.Tensor, done: torch.Tensor) -> torch.Tensor:
        """Merge the discounted returns of a batch into the statistics, then scale its rewards by them.

        Under DDP every rank must call this at the same time (the moments are summed over the ranks).

        Args:
            reward (torch.Tensor): `[T, N]` float32 raw rewards.
            done (torch.Tensor): `[T, N]` bool, the episode ended at this step (terminated or truncated).

        Returns:
            torch.Tensor: `[T, N]` float32 scaled and clipped rewards.
        """
        discounted = torch.empty_like(reward, dtype=torch.float64)
        running = torch.zeros_like(reward[0], dtype=torch.float64)
        keep = (~done).double()
        for t in range(reward.shape[0]):
            running = running * self.gamma + reward[t].double()
            discounted[t] = running
            running = running * keep[t]
        self.returns.update(discounted.reshape(-1, 1))
        std = torch.sqrt(self.returns.var + self.epsilon)
        return (reward.double() / std).clamp(-self.clip, self.clip).to(reward.dtype)
