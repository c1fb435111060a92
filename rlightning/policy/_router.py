"""Routing rollout requests to the least-loaded of several policy replicas (the seed's async rollout mode).

The load of a replica is the seed's `get_num_requests` (rollouts in flight or queued at it); `check_idle` waits
for every replica. Replicas admit their own requests (each its own `_gate`), so routing never lets a weight update
overlap a forward pass.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

from rlightning.policy.base_policy import BasePolicy


class RolloutRouter:
    """Sends each rollout request to the replica with the fewest requests (`get_num_requests`).

    Ties go round-robin from the replica after the last one picked, so requests that arrive at the same instant
    (before either is queued at its replica) still spread over equally loaded replicas.

    Args:
        replicas (Sequence[BasePolicy]): Initialised policies of one class holding the same weights.

    Raises:
        ValueError: When `replicas` is empty.

    Examples:
        >>> router = RolloutRouter([policy_a, policy_b])
        >>> router.rollout({"observation": torch.zeros(4, 3)})["action"].shape
        torch.Size([4])
    """

    def __init__(self, replicas: Sequence[BasePolicy]) -> None:
        if not replicas:
            raise ValueError("a RolloutRouter needs at least one policy replica")
        self.replicas = tuple(replicas)
        self._lock = threading.Lock()
        self._next = 0  # where the round-robin tie-break starts

    def pick(self) -> BasePolicy:
        """The replica the next request goes to: the least loaded now.

        Returns:
            BasePolicy: One of `replicas`.
        """
        with self._lock:
            count = len(self.replicas)
            order = [(self._next + i) % count for i in range(count)]
            chosen = min(order, key=lambda i: self.replicas[i].get_num_requests())  # first of the least loaded
            self._next = (chosen + 1) % count
            return self.replicas[chosen]

    def rollout(self, env_ret: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Run one rollout on the least-loaded replica (`BasePolicy.rollout`).

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.
            timeout (float | None, optional): Seconds to wait for admission. Defaults to None (forever).

        Returns:
            Any: The replica's `postprocess` output.

        Raises:
            TimeoutError: When not admitted within `timeout`.
        """
        return self.pick().rollout(env_ret, timeout)

    async def rollout_async(self, env_ret: Mapping[str, Any]) -> Any:
        """Like `rollout`, from an asyncio task (`BasePolicy.rollout_async`).

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.

        Returns:
            Any: The replica's `postprocess` output.
        """
        return await self.pick().rollout_async(env_ret)

    def get_num_requests(self) -> int:
        """Requests in flight or queued at all replicas together.

        Returns:
            int: The sum of the replicas' `get_num_requests`.
        """
        return sum(replica.get_num_requests() for replica in self.replicas)

    def check_idle(self, timeout: float | None = None) -> bool:
        """Wait until no replica has a rollout or weight update in flight.

        Args:
            timeout (float | None, optional): Seconds to wait for all of them. Defaults to None (forever).

        Returns:
            bool: True when all are idle, False on timeout.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for replica in self.replicas:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not replica.check_idle(remaining):
                return False
        return True
