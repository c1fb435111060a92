"""CartPole-v1 behind a fixed per-step latency: the slow simulators RL fleets exist for (benchmark only).

Importing this module registers `SlowCartPole-v1`; a manifest names it `benchmarks.slow_env:SlowCartPole-v1`
(gymnasium imports the module first) with `env.kwargs: {step_latency_ms: 5}`.
"""

from __future__ import annotations

import time
from typing import Any

import gymnasium
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

ENV_ID = "SlowCartPole-v1"


class SlowCartPole(CartPoleEnv):
    """CartPole whose `step` takes at least `step_latency_ms` milliseconds (a sleep: it costs no CPU).

    Args:
        step_latency_ms (float, optional): Added latency per step, in ms. Defaults to 5.
        **kwargs: CartPoleEnv's keyword arguments.
    """

    def __init__(self, step_latency_ms: float = 5.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.step_latency = step_latency_ms / 1000.0

    def step(self, action: Any) -> tuple[Any, float, bool, bool, dict[str, Any]]:
        time.sleep(self.step_latency)
        return super().step(action)


if ENV_ID not in gymnasium.envs.registry:
    gymnasium.register(ENV_ID, entry_point=SlowCartPole, max_episode_steps=500, reward_threshold=475.0)
