"""Resuming the DDP trainer ranks from one checkpoint, so every rank continues with identical training state.

DDP broadcasts rank 0's parameters only when it wraps a module (`init_train`); a checkpoint loaded afterwards
would leave the ranks apart if they read different files, and with `train.nodes > 1` every trainer pod has a
run directory of its own. So rank 0 alone picks and loads the newest checkpoint, then broadcasts its training
state: every parameter and buffer with `dist.broadcast` (in place, on the policy's device), the optimizer
state, step counters, weight version and extra training state (SAC's replay buffer) with
`dist.broadcast_object_list`. The other ranks keep their own RNG streams (seed + rank).
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import torch
import torch.distributed as dist

from rlightning import weights
from rlightning.policy import _training_state
from rlightning.policy.base_policy import BasePolicy
from rlightning.runtime.rundir import RunDir

log = logging.getLogger("rlightning.train")


def state_digest(policy: BasePolicy) -> str:
    """One sha256 over every parameter and buffer of `policy` (`weights.tensor_digests`, sorted by name).

    Args:
        policy (BasePolicy): The policy.

    Returns:
        str: 16 hex digits; equal on two ranks exactly when their weights are bit for bit equal.
    """
    digests = weights.tensor_digests(weights.named_state(policy))
    joined = "\n".join(f"{name}={digest}" for name, digest in sorted(digests.items()))
    return hashlib.sha256(joined.encode()).hexdigest()[:16]


def broadcast_training_state(policy: BasePolicy, src: int = 0) -> None:
    """Make every rank's training state rank `src`'s: weights, buffers, optimizer, counters, weight version.

    A collective: every rank of the default process group calls it. Tensors travel on the policy's device
    (nccl needs CUDA tensors; gloo takes CPU ones); the optimizer state travels pickled, on the CPU.

    Args:
        policy (BasePolicy): An initialised train policy (`init_train` ran on every rank).
        src (int, optional): The rank whose state wins. Defaults to 0.
    """
    with torch.no_grad():
        for _, tensor in sorted(weights.named_state(policy).items()):
            dist.broadcast(tensor, src)
    payload = [_training_state.capture(policy)]
    dist.broadcast_object_list(payload, src, device=policy.device if dist.get_backend() == "nccl" else None)
    if dist.get_rank() != src:
        _training_state.restore(policy, payload[0])


def resume(policy: BasePolicy, run_dir: RunDir, enabled: bool) -> str | None:
    """Resume every rank from rank 0's newest checkpoint, if any (a collective over the default group).

    Args:
        policy (BasePolicy): The initialised train policy (after `init_train`, DDP already wrapped).
        run_dir (RunDir): This process's run directory; only rank 0's is read.
        enabled (bool): `train.checkpoint.resume`.

    Returns:
        str | None: The checkpoint rank 0 resumed from, or None (then nothing changes: DDP made the initial
            weights equal when it wrapped them).
    """
    rank = dist.get_rank()
    checkpoint: Path | None = run_dir.newest_checkpoint() if enabled and rank == 0 else None
    if checkpoint is not None:
        # The checkpoint holds rank 0's RNG state; the other ranks keep their own seed + rank streams.
        policy.load_checkpoint(checkpoint, restore_rng=True)
    chosen = [None if checkpoint is None else str(checkpoint)]
    dist.broadcast_object_list(chosen, 0, device=policy.device if dist.get_backend() == "nccl" else None)
    if chosen[0] is None:
        return None
    broadcast_training_state(policy, 0)
    log.info("rank %d resumed from %s: iteration %d, %d env steps, weight version %d, state digest %s",
             rank, chosen[0], policy.iteration, policy.env_steps, policy.weight_version, state_digest(policy))
    return chosen[0]
