"""Where collectives over the default group put their tensors (one rule: nccl needs the rank's GPU), and the small
all-reduces the trainer ranks use to agree (stop, weight version, episode returns, fleet figures).
"""

from __future__ import annotations

import torch
import torch.distributed as dist


def device() -> torch.device:
    """Where the tensors of a collective over the default group must live: nccl takes only CUDA tensors, on the
    rank's current device (`train` makes it the policy's); gloo takes CPU ones.

    Returns:
        torch.device: `cuda:<current device>` under nccl, else `cpu`.
    """
    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def all_reduce(values: list[float], op: dist.ReduceOp.RedOpType = dist.ReduceOp.SUM) -> list[float]:
    """All-reduce a few numbers over the default group (float64; on the rank's GPU under nccl).

    Args:
        values (list[float]): This rank's numbers.
        op (dist.ReduceOp.RedOpType, optional): The reduction. Defaults to SUM.

    Returns:
        list[float]: The reduced numbers, the same on every rank.
    """
    tensor = torch.tensor(values, dtype=torch.float64, device=device())
    dist.all_reduce(tensor, op=op)
    return tensor.cpu().tolist()
