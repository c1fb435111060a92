"""The small all-reduces the trainer ranks use to agree (stop, weight version, episode returns, fleet figures)."""

from __future__ import annotations

import torch
import torch.distributed as dist


def all_reduce(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a few numbers over the default group (float64; on the rank's GPU under nccl).

    Args:
        values (list[float]): This rank's numbers.
        op (dist.ReduceOp.RedOpType, optional): The reduction. Defaults to SUM.

    Returns:
        list[float]: The reduced numbers, the same on every rank.
    """
    tensor = torch.tensor(values, dtype=torch.float64)
    if dist.get_backend() == "nccl":
        tensor = tensor.cuda()
    dist.all_reduce(tensor, op=op)
    return tensor.cpu().tolist()
