"""Shared pieces of the policy tests: an instrumented toy policy and a tiny deterministic env."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

import gymnasium
import numpy as np
import torch
from tensordict import TensorDict
from torch import nn

from rlightning import weights
from rlightning.config import EnvConfig, OptimConfig, PolicyConfig
from rlightning.policy import BasePolicy, EnvMeta

COUNTER_ENV_ID = "RlightningTestCounter-v0"
BOX_META = EnvMeta(
    gymnasium.spaces.Box(-1.0, 1.0, shape=(3,), dtype=np.float32), gymnasium.spaces.Discrete(2), "toy"
)


class CounterEnv(gymnasium.Env):
    """Observation = steps taken in the episode (float32 [1]); reward 1 per step; never terminates by itself."""

    observation_space = gymnasium.spaces.Box(0.0, 1e6, shape=(1,), dtype=np.float32)
    action_space = gymnasium.spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self.count = 0
        return np.array([0.0], dtype=np.float32), {}

    def step(self, action):
        self.count += 1
        return np.array([float(self.count)], dtype=np.float32), 1.0, False, False, {}


if COUNTER_ENV_ID not in gymnasium.envs.registry:
    gymnasium.register(COUNTER_ENV_ID, entry_point=CounterEnv, max_episode_steps=3)


class EventLog:
    """A thread-safe, ordered log of (event, thread id) for checking interleavings after the fact."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.events: list[tuple[str, int]] = []

    def record(self, event: str) -> None:
        with self._lock:
            self.events.append((event, threading.get_ident()))

    def count(self, event: str) -> int:
        with self._lock:
            return sum(name == event for name, _ in self.events)

    def check_exclusion(self) -> tuple[int, int]:
        """Replay the log; raise AssertionError when an update overlaps a rollout.

        Returns:
            tuple[int, int]: (rollouts seen, updates seen).
        """
        active = updating = rollouts = updates = 0
        for event, _ in self.events:
            if event == "rollout_enter":
                assert not updating, "a rollout started during a weight update"
                active += 1
                rollouts += 1
            elif event == "rollout_exit":
                active -= 1
            elif event == "update_enter":
                assert active == 0, f"a weight update started while {active} rollout(s) ran"
                updating += 1
                updates += 1
            elif event == "update_exit":
                updating -= 1
        return rollouts, updates


class ToyPolicy(BasePolicy):
    """Linear -> BatchNorm -> Linear, times a bare scale Parameter on the policy itself.

    `rollout_step` honours `env_ret["fail"]` (raise), `env_ret["sleep"]` (seconds inside the forward) and
    `env_ret["hold"]` (an Event the forward waits on, at most 10 s) and logs entry/exit; applying weights logs
    entry/exit and can be held by `hold_update` (an Event to wait on).
    """

    def __init__(self, config: PolicyConfig | None = None, role_type: Any = "eval") -> None:
        super().__init__(config or PolicyConfig(device="cpu", optim=OptimConfig(name="sgd", lr=0.1)), role_type)
        self.log = EventLog()
        self.update_entered = threading.Event()
        self.hold_update: threading.Event | None = None
        self.update_sleep = 0.0
        self._data: TensorDict | None = None

    def construct_network(self, env_meta: EnvMeta) -> None:
        width = int(np.prod(env_meta.observation_space.shape))
        self.net = nn.Sequential(nn.Linear(width, 8), nn.BatchNorm1d(8), nn.Linear(8, 2))
        self.scale = nn.Parameter(torch.ones(1))

    def setup_optimizer(self, optim_cfg: OptimConfig) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=optim_cfg.lr)

    def rollout_step(self, env_ret: Mapping[str, Any]) -> torch.Tensor:
        self.log.record("rollout_enter")
        try:
            if env_ret.get("fail"):
                raise RuntimeError("boom")
            if env_ret.get("hold") is not None:
                assert env_ret["hold"].wait(10.0), "test never released the held rollout"
            time.sleep(env_ret.get("sleep", 0.0))
            return self.net(torch.as_tensor(env_ret["observation"], dtype=torch.float32)) * self.scale
        finally:
            self.log.record("rollout_exit")

    def postprocess(self, env_ret: Mapping[str, Any], policy_resp: torch.Tensor) -> torch.Tensor:
        return policy_resp

    def update_weights_from_buffer(self) -> int | None:
        self.log.record("update_enter")
        self.update_entered.set()
        try:
            version = super().update_weights_from_buffer()  # takes the staged state first
            if self.hold_update is not None:
                assert self.hold_update.wait(10.0), "test never released the held update"
            time.sleep(self.update_sleep)
            return version
        finally:
            self.log.record("update_exit")

    def stage_weights(self, version: int, state: Mapping[str, torch.Tensor]) -> bool:
        if self.weight_buffer_strategy != "none":  # staging only; applying is logged below
            return super().stage_weights(version, state)
        self.log.record("update_enter")  # strategy none applies while staging
        try:
            time.sleep(self.update_sleep)
            return super().stage_weights(version, state)
        finally:
            self.log.record("update_exit")

    @property
    def scale_value(self) -> float:
        return float(self.scale.detach())

    def update_dataset(self, dataset: TensorDict) -> None:
        self._data = dataset

    def train(self) -> dict[str, float]:
        assert self._data is not None and self.optimizer is not None
        loss = (self.net(self._data["observation"]) * self.scale).pow(2).mean()
        self.optimizer.zero_grad()
        loss.backward()
        self.optimizer.step()
        self.iteration += 1
        self.env_steps += self._data.numel() * self.dp_world_size
        return {"loss": float(loss.detach())}

    def load_state_dict(self, state_dict: Mapping[str, Any], strict: bool = True) -> None:
        weights.load_named_state(self, self.clean_state_dict(state_dict))


def toy_batch(seed: int, size: int = 16) -> TensorDict:
    """A `[size]` batch of observations `[3]` float32."""
    gen = torch.Generator().manual_seed(seed)
    return TensorDict({"observation": torch.randn(size, 3, generator=gen)}, batch_size=[size])


def obs(n: int = 4) -> dict[str, Any]:
    """A rollout input of n observations."""
    return {"observation": torch.zeros(n, 3)}


def counter_env_config(num_envs: int = 2) -> EnvConfig:
    """`spec.env` of the counter env (episodes truncated after 3 steps)."""
    return EnvConfig(id=COUNTER_ENV_ID, num_envs=num_envs)
