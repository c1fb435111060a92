"""`ActorMixin`: a policy's rollouts and their accounting (the seed's actor mixin, mixed into `BasePolicy`).

A rollout runs `rollout_step` then `postprocess` under `torch.inference_mode`, admitted by the policy's
`_gate.RolloutGate` in arrival order and never while a weight update is applied (a rollout that raises still
releases the gate). The accounting a router or a caller reads: requests in flight or waiting
(`get_num_requests`), whether the policy is idle (`check_idle`), and the phase durations (`print_timing_summary`).
"""

from __future__ import annotations

import abc
import asyncio
import time
from collections.abc import Mapping
from typing import Any

import torch

from rlightning.policy import _gate, _timing


class ActorMixin(abc.ABC):
    """Rollouts admitted by the gate, and request and timing accounting.

    The class it is mixed into sets, in its `__init__`: `_gate` (the rollout gate), `_initialized` (whether the
    network is built) and `timings` (the phase durations).
    """

    _gate: _gate.RolloutGate
    _initialized: bool
    timings: _timing.PhaseTimings

    @abc.abstractmethod
    def rollout_step(self, env_ret: Mapping[str, Any]) -> Any:
        """Act on a batch of observations; runs under `torch.inference_mode`, admitted by the gate.

        Args:
            env_ret (Mapping[str, Any]): What the environment returned, for example `{"observation": [N, *O]}`.

        Returns:
            Any: The raw policy response handed to `postprocess`.
        """

    @abc.abstractmethod
    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: Any) -> Any:
        """Turn the raw response into what the caller gets; runs under `torch.inference_mode`.

        Args:
            env_ret (Mapping[str, Any]): The input of `rollout_step`.
            policy_resp (Any): The output of `rollout_step`.

        Returns:
            Any: The rollout result.
        """

    # -- rollouts and accounting ---------------------------------------------------------------------------------------

    def _forward_and_release(self, env_ret: Mapping[str, Any]) -> Any:
        # Runs with the gate entered; always releases it, also when the forward raises.
        start = time.perf_counter()
        try:
            with torch.inference_mode():
                return self.postprocess(env_ret, self.rollout_step(env_ret))
        finally:
            self._gate.exit_rollout()
            self.timings.record("rollout", time.perf_counter() - start)

    def _require_init(self) -> None:
        if not self._initialized:
            raise RuntimeError(f"{type(self).__name__} is not initialised: call init_eval or init_train first")

    def rollout(self, env_ret: Mapping[str, Any], timeout: float | None = None) -> Any:
        """Run `rollout_step` then `postprocess`, never while a weight update is applied.

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.
            timeout (float | None, optional): Seconds to wait for admission. Defaults to None (forever).

        Returns:
            Any: The output of `postprocess`.

        Raises:
            RuntimeError: When the policy is not initialised.
            TimeoutError: When not admitted within `timeout`.
        """
        self._require_init()
        if not self._gate.enter_rollout(timeout):
            raise TimeoutError(f"rollout not admitted within {timeout} s (a weight update holds the policy)")
        return self._forward_and_release(env_ret)

    async def rollout_async(self, env_ret: Mapping[str, Any]) -> Any:
        """Like `rollout`, from an asyncio task: admission waits without blocking the loop and the forward
        runs in the loop's default executor, so concurrent requests overlap (async mode).

        Args:
            env_ret (Mapping[str, Any]): Input of `rollout_step`.

        Returns:
            Any: The output of `postprocess`.

        Raises:
            RuntimeError: When the policy is not initialised.
        """
        self._require_init()
        await self._gate.enter_rollout_async()
        try:
            future = asyncio.get_running_loop().run_in_executor(None, self._forward_and_release, env_ret)
        except BaseException:
            self._gate.exit_rollout()
            raise
        # Cancelling the caller does not cut the forward short: the worker releases the gate when done.
        return await future

    def check_idle(self, timeout: float | None = None) -> bool:
        """Wait until no rollout and no weight update is in flight.

        Args:
            timeout (float | None, optional): Seconds to wait. Defaults to None (forever).

        Returns:
            bool: True when idle, False on timeout.
        """
        return self._gate.wait_idle(timeout)

    def get_num_requests(self) -> int:
        """Rollout requests in flight or waiting for admission now: this policy's load, by which a router picks
        the least-loaded replica (`rlightning.policy.RolloutRouter`). At most 1 is in flight in sync mode.

        Returns:
            int: The count.
        """
        return self._gate.requests

    # -- timing ------------------------------------------------------------------------------------------------------

    def print_timing_summary(self, reset: bool = False) -> dict[str, dict[str, float]]:
        """Print count, total, mean and maximum seconds per timed phase, since start or the last reset.

        Args:
            reset (bool, optional): Start the aggregates afresh afterwards. Defaults to False.

        Returns:
            dict[str, dict[str, float]]: `{phase: {"count", "total_s", "mean_s", "max_s"}}`, phases by name.
        """
        summary = {
            phase: {"count": stats.count, "total_s": stats.total_s, "mean_s": stats.mean_s, "max_s": stats.max_s}
            for phase, stats in self.timings.snapshot(reset).items()
        }
        for phase, row in summary.items():
            print(
                f"{phase:>16}: n={row['count']} total={row['total_s']:.3f}s mean={row['mean_s'] * 1e3:.3f}ms "
                f"max={row['max_s'] * 1e3:.3f}ms"
            )
        return summary
