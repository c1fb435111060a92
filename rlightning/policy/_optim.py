"""The optimizer `spec.policy.optim` names, over parameters or parameter groups (`BasePolicy.setup_optimizer`)."""

from __future__ import annotations

import torch
from torch.optim.optimizer import ParamsT

from rlightning.config import OptimConfig


def make_optimizer(params: ParamsT, cfg: OptimConfig) -> torch.optim.Optimizer:
    """Adam, AdamW or SGD, as `cfg.name` says, with its learning rate, epsilon (not SGD's) and weight decay.

    Args:
        params (ParamsT): Parameters, or parameter groups
            (`{"params": [...]}` each, as torch.optim takes them).
        cfg (OptimConfig): `spec.policy.optim`.

    Returns:
        torch.optim.Optimizer: The optimizer.
    """
    if cfg.name == "sgd":
        return torch.optim.SGD(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    optimizer = torch.optim.AdamW if cfg.name == "adamw" else torch.optim.Adam
    return optimizer(params, lr=cfg.lr, eps=cfg.eps, weight_decay=cfg.weight_decay)
