"""What a policy needs to know about its environment to build its network: the observation and action spaces."""

from __future__ import annotations

import dataclasses

import gymnasium

from rlightning.config import EnvConfig


@dataclasses.dataclass(frozen=True)
class EnvMeta:
    """The spaces of one (single, not vectorised) environment copy.

    Args:
        observation_space (gymnasium.Space): Space of one observation.
        action_space (gymnasium.Space): Space of one action.
        env_id (str, optional): The gymnasium id, for messages. Defaults to "".
    """

    observation_space: gymnasium.Space
    action_space: gymnasium.Space
    env_id: str = ""

    @classmethod
    def from_env_config(cls, env_config: EnvConfig) -> EnvMeta:
        """Make one environment copy, read its spaces and close it.

        Args:
            env_config (EnvConfig): `spec.env`.

        Returns:
            EnvMeta: The spaces.
        """
        env = make_env(env_config)
        try:
            return cls(env.observation_space, env.action_space, env_config.id)
        finally:
            env.close()


def make_env(env_config: EnvConfig) -> gymnasium.Env:
    """Make one environment copy as `spec.env` describes it.

    Args:
        env_config (EnvConfig): `spec.env` (id, kwargs, max_episode_steps).

    Returns:
        gymnasium.Env: The environment, not reset yet.
    """
    return gymnasium.make(env_config.id, max_episode_steps=env_config.max_episode_steps, **env_config.kwargs)
