"""The layout of experience batches: the keys, per-step shapes and dtypes a `[T, N]` TensorDict must have.

Every collector writes the env keys of `env_fields`; a policy adds the keys of its rollout output that it
keeps (`BasePolicy.rollout_fields`), so nothing outside the policy assumes an algorithm's keys.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
from tensordict import TensorDict

from rlightning.policy._env_meta import EnvMeta


@dataclasses.dataclass(frozen=True)
class ExperienceField:
    """One key of an experience batch: its shape per step and env copy, and its dtype.

    Args:
        shape (tuple[int, ...]): Per-step shape; a `[T, N]` batch holds `[T, N, *shape]`. `()` for scalars.
        dtype (torch.dtype): The tensor's dtype.

    Examples:
        >>> ExperienceField((4,), torch.float32)  # a CartPole observation
        ExperienceField(shape=(4,), dtype=torch.float32)
    """

    shape: tuple[int, ...]
    dtype: torch.dtype


def env_fields(env_meta: EnvMeta) -> dict[str, ExperienceField]:
    """The keys every collector writes, whatever the policy.

    - `observation` `[*O]` float32: what the policy saw.
    - `next_observation` `[*O]` float32: the true next state. When the episode ended at this step it is the
      episode's final observation (before the auto-reset), so a truncated episode can be bootstrapped from it;
      a terminated one is never bootstrapped.
    - `reward` `[]` float32; `terminated` `[]` bool (a terminal state); `truncated` `[]` bool (cut, e.g. by a
      time limit).

    Args:
        env_meta (EnvMeta): The env's spaces; `O` is `env_meta.observation_space.shape`.

    Returns:
        dict[str, ExperienceField]: The fields by key.
    """
    observation = ExperienceField(tuple(env_meta.observation_space.shape or ()), torch.float32)
    return {
        "observation": observation,
        "next_observation": observation,
        "reward": ExperienceField((), torch.float32),
        "terminated": ExperienceField((), torch.bool),
        "truncated": ExperienceField((), torch.bool),
    }


def check_batch(
    batch: TensorDict, fields: Mapping[str, ExperienceField], batch_size: tuple[int, int]
) -> str | None:
    """Why a batch does not have the expected layout, if it does not.

    Args:
        batch (TensorDict): The batch to check.
        fields (Mapping[str, ExperienceField]): The keys it must have, exactly (no more, no fewer).
        batch_size (tuple[int, int]): The expected `[T, N]`.

    Returns:
        str | None: A one-line reason naming the first offending rule (batch size, missing keys, unexpected
            keys, then each key's shape and dtype in `fields` order), or None when the batch fits.
    """
    expected_size = torch.Size(batch_size)
    if batch.batch_size != expected_size:
        return f"batch_size {list(batch.batch_size)}, expected {list(expected_size)}"
    keys = set(batch.keys())
    missing = [key for key in fields if key not in keys]
    if missing:
        return f"missing keys {missing}"
    unexpected = sorted(str(key) for key in keys - set(fields))
    if unexpected:
        return f"unexpected keys {unexpected}"
    for key, field in fields.items():
        value = batch.get(key)
        if not isinstance(value, torch.Tensor):
            return f"{key!r} is a {type(value).__name__}, expected a tensor"
        shape = (*expected_size, *field.shape)
        if value.shape != shape:
            return f"{key!r} has shape {list(value.shape)}, expected {list(shape)}"
        if value.dtype != field.dtype:
            return f"{key!r} has dtype {value.dtype}, expected {field.dtype}"
    return None
