"""Resuming the DDP trainer ranks from one checkpoint, so every rank continues with identical training state.

DDP broadcasts rank 0's parameters only when it wraps a module (`init_train`); a checkpoint loaded afterwards
would leave the ranks apart if they read different files, and with `train.nodes > 1` every trainer pod has a
run directory of its own. So rank 0 alone picks and loads the newest checkpoint, then broadcasts its training
state: every parameter and buffer with `dist.broadcast` (in place, on the policy's device), the optimizer
state, step counters, weight version and extra training state (SAC's replay buffer) with
`dist.broadcast_object_list`. The other ranks keep their own RNG streams (seed + rank).

A gang with no checkpoint to resume (a run directory that did not survive a restart) continues from the weights the
evaluators hold instead (`restart_from_fleet`): rank 0 loads what one evaluator sent (`trajectories.HeldWeights`,
pulled by `train`) and broadcasts it the same way. Only those weights come back: the optimizer state, RNG and
counters start fresh, and what evaluators do not hold (SAC's critics) keeps its initial values.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from pathlib import Path

import torch
import torch.distributed as dist

from rlightning import trajectories, weights
from rlightning.policy import _training_state
from rlightning.policy.base_policy import BasePolicy
from rlightning.runtime import _collective
from rlightning.runtime.rundir import RunDir

log = logging.getLogger("rlightning.train")

FLEET_PULL_SECONDS = 60.0
"""How long rank 0 waits at most for an evaluator's weights (`TrajectoryIntake.pull_weights`) before it starts from
fresh weights: evaluators answer between batches and episodes, within seconds; the bound covers a fleet still
reconnecting to the new gang's intakes."""


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
    (`_collective.device()` under nccl); the optimizer state travels pickled.

    Args:
        policy (BasePolicy): An initialised train policy (`init_train` ran on every rank).
        src (int, optional): The rank whose state wins. Defaults to 0.
    """
    with torch.no_grad():
        for _, tensor in sorted(weights.named_state(policy).items()):
            dist.broadcast(tensor, src)
    payload = [_training_state.capture(policy)]
    dist.broadcast_object_list(payload, src, device=_collective.device())
    if dist.get_rank() != src:
        _training_state.restore(policy, payload[0])


def resume(policy: BasePolicy, run_dir: RunDir, enabled: bool, epoch: int = 0) -> str | None:
    """Resume every rank from rank 0's newest checkpoint, if any (a collective over the default group).

    Args:
        policy (BasePolicy): The initialised train policy (after `init_train`, DDP already wrapped).
        run_dir (RunDir): This process's run directory; only rank 0's is read.
        enabled (bool): `train.checkpoint.resume`.
        epoch (int, optional): The gang's attempt: the newest checkpoint by (epoch, iteration) of this attempt or an
            older one is read (`RunDir.newest_checkpoint`). Defaults to 0.

    Returns:
        str | None: The checkpoint rank 0 resumed from, or None (then nothing changes: DDP made the initial
            weights equal when it wrapped them).
    """
    rank = dist.get_rank()
    checkpoint: Path | None = run_dir.newest_checkpoint(epoch) if enabled and rank == 0 else None
    if checkpoint is not None:
        # The checkpoint holds rank 0's RNG state; the other ranks keep their own seed + rank streams.
        policy.load_checkpoint(checkpoint, restore_rng=True)
    chosen = [None if checkpoint is None else str(checkpoint)]
    dist.broadcast_object_list(chosen, 0, device=_collective.device())
    if chosen[0] is None:
        return None
    broadcast_training_state(policy, 0)
    log.info("rank %d resumed from %s: iteration %d, %d env steps, weight version %d, state digest %s",
             rank, chosen[0], policy.iteration, policy.env_steps, policy.weight_version, state_digest(policy))
    return chosen[0]


def restart_from_fleet(policy: BasePolicy, pull: Callable[[], trajectories.HeldWeights | None] | None) -> int | None:
    """Start every rank from the weights an evaluator holds, when rank 0 gets them (a collective over the default
    group; call it only when no checkpoint was resumed).

    Rank 0 calls `pull` and loads the answer's tensors that the policy has (`load_state_dict(strict=False)`; floating
    tensors cast to the policy's dtypes, as evaluators hold them), logging those it keeps fresh; then every rank takes
    rank 0's weights and weight version (`broadcast_training_state`).

    Args:
        policy (BasePolicy): The initialised train policy (after `init_train`, DDP already wrapped).
        pull (Callable[[], trajectories.HeldWeights | None] | None): On rank 0, what gets an evaluator's weights
            (None: there is none to get); ignored on the other ranks.

    Returns:
        int | None: The weight version every rank now holds, or None when nothing was loaded (the weights stay
            DDP's initial ones).
    """
    rank = dist.get_rank()
    held = pull() if rank == 0 and pull is not None else None
    loaded = [_load_held(policy, held) if held is not None else None]
    dist.broadcast_object_list(loaded, 0, device=_collective.device())
    if loaded[0] is None:
        return None
    broadcast_training_state(policy, 0)
    log.info("rank %d starts from the fleet's weight version %d (optimizer, RNG and counters fresh), state digest %s",
             rank, policy.weight_version, state_digest(policy))
    return loaded[0]


def _load_held(policy: BasePolicy, held: trajectories.HeldWeights) -> int | None:
    """Rank 0: load `held` into the policy and take its version; None (and a warning) when nothing fits."""
    own = weights.named_state(policy)
    common = sorted(set(own) & set(held.state))
    state = {
        name: tensor.to(own[name].dtype) if tensor.is_floating_point() and tensor.dtype != own[name].dtype else tensor
        for name, tensor in held.state.items()
        if name in own
    }
    try:
        if not common:
            raise KeyError(f"no tensor name in common (evaluator's: {sorted(held.state)[:5]}...)")
        policy.load_state_dict(state, strict=False)
    except (KeyError, ValueError) as error:
        log.warning("the weights of evaluator %d (version %d) do not fit this policy, starting from fresh weights: %s",
                    held.ordinal, held.version, error)
        return None
    fresh = sorted(set(own) - set(held.state))
    if fresh:  # a policy whose evaluators hold a part (SAC: the actor)
        log.warning("evaluators do not hold %d of the policy's %d tensors (in %s); they keep their initial values",
                    len(fresh), len(own), ", ".join(sorted({name.split(".", 1)[0] for name in fresh})))
    unknown = sorted(set(held.state) - set(own))
    if unknown:
        log.warning("evaluator %d sent tensors this policy does not have, ignored: %s", held.ordinal,
                    ", ".join(unknown))
    policy.weight_version = held.version
    log.info("loaded weight version %d from evaluator %d (%d tensors)", held.version, held.ordinal, len(common))
    return held.version
