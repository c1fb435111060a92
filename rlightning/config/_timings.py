"""Every bound of the weight-sync protocol, derived in one place from `weightSync.timeoutSeconds`.

The sender, the receivers, the store helpers, the evaluator runtime and the launch plan read these fields rather
than scaling the timeout themselves, so the ratios between the bounds (which the protocol's liveness rests on, see
docs/weight-sync.md "Failures") stay consistent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SyncTimings:
    """The weight-sync bounds, in seconds, for one `weightSync.timeoutSeconds` (the step).

    Build it with `from_timeout` (or `WeightSyncConfig.timings`); the fields are what the protocol waits for.

    Examples:
        >>> SyncTimings.from_timeout(60.0).edge_from_parent
        120.0
    """

    step: float
    """`timeoutSeconds`: one store call, forming an edge to a child or a tree's root, one transfer, the sender's
    wait for acknowledgements, and a relay's wait for its children after its own acknowledgement."""
    edge_from_parent: float
    """2 x step: forming a receiver's edge from its parent, which is also that edge's collective timeout. The sender
    may spend one step on a stalled sibling tree before it serves this one, and a healthy tree must outlast that."""
    commit_wait: float
    """2 x step: a receiver's wait for the sender's commit after its last transfer, for the same reason (a stalled
    sibling tree's transfers hold the sender up to one step before it commits)."""
    commit_bound: float
    """3 x step: the whole commit check (the wait above plus reading the commit, one store call)."""
    pause: float
    """step / 2: a receiver in place waits this long for rollouts to pause, so the rest of the receive still fits
    in the sender's step for the next transfer."""
    apply: float
    """step / 2: the longest an evaluator waits for its policy to apply a staged version before acknowledging it
    failed, so the acknowledgement still reaches the sender within its step."""
    heartbeat_period: float
    """step / 4: between two beats of the sender's heartbeat; four beats fit in one step."""
    heartbeat_check: float
    """step / 4: a receiver reads the heartbeat at most this often, and waits for an announcement in steps this
    long (checking the heartbeat between them: a vanished sender sends no RST)."""
    heartbeat_stale: float
    """2 x step: a heartbeat standing still this long means the sender is gone (eight missed beats; a sender busy
    in a publish still beats from its own thread)."""
    trainer_waits: int
    """3 x ceil(step), whole seconds: a healthy trainer iteration's waits bounded by about one step each (a publish,
    a target confirmation, a checkpoint); the launch plan adds its margin for the liveness probe."""
    drain: int
    """ceil(step), whole seconds: after SIGTERM an evaluator leaves its group and a trainer finishes the publish in
    flight, each within one step; the launch plan adds its margin for the termination grace."""

    @classmethod
    def from_timeout(cls, seconds: float) -> SyncTimings:
        """Derive every bound from `weightSync.timeoutSeconds`.

        Args:
            seconds (float): `weightSync.timeoutSeconds` (> 0).

        Returns:
            SyncTimings: the bounds.

        Raises:
            ValueError: when `seconds` is not positive.
        """
        if not seconds > 0:
            raise ValueError(f"timeoutSeconds: must be > 0, got {seconds}")
        step = float(seconds)
        return cls(
            step=step,
            edge_from_parent=2 * step,
            commit_wait=2 * step,
            commit_bound=3 * step,
            pause=step / 2,
            apply=step / 2,
            heartbeat_period=step / 4,
            heartbeat_check=step / 4,
            heartbeat_stale=2 * step,
            trainer_waits=3 * math.ceil(step),
            drain=math.ceil(step),
        )
