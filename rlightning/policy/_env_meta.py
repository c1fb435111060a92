"""What a policy needs to know about its environment to build its network: the observation and action spaces."""

from __future__ import annotations

import dataclasses
import functools
import importlib
import logging

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


log = logging.getLogger(__name__)


@functools.cache
def _route_mujoco_warnings() -> None:
    # MuJoCo's own warning handler prints and appends to MUJOCO_LOG.TXT in the working directory (HalfCheetah's XML
    # warns on every make with mujoco 4); routed to logging instead, each distinct message once per process.
    mujoco = importlib.import_module("mujoco")

    @functools.cache
    def warn(message: str) -> None:
        log.warning("MuJoCo: %s", message.strip())

    mujoco.set_mju_user_warning(warn)


def make_env(env_config: EnvConfig) -> gymnasium.Env:
    """Make one environment copy as `spec.env` describes it.

    For an env of gymnasium's MuJoCo suite, MuJoCo's warnings go to this module's logger (each distinct message once)
    instead of stdout and a MUJOCO_LOG.TXT file in the working directory.

    Args:
        env_config (EnvConfig): `spec.env` (id, kwargs, max_episode_steps).

    Returns:
        gymnasium.Env: The environment, not reset yet.

    Raises:
        gymnasium.error.Error: When the id is not registered, or its dependencies (for MuJoCo envs, the
            `rlightning[mujoco]` extra) are not installed.
    """
    registered = gymnasium.registry.get(env_config.id)  # None for a `module:Id` not imported yet
    entry_point = None if registered is None else registered.entry_point
    if isinstance(entry_point, str) and entry_point.startswith("gymnasium.envs.mujoco"):
        try:
            _route_mujoco_warnings()
        except ImportError as exc:
            raise gymnasium.error.DependencyNotInstalled(
                f"env.id {env_config.id} needs MuJoCo: pip install 'rlightning[mujoco]' ({exc})"
            ) from exc
    return gymnasium.make(env_config.id, max_episode_steps=env_config.max_episode_steps, **env_config.kwargs)
