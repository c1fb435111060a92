"""The layout of experience batches: the env fields every collector writes, and `check_batch`'s rules."""

from __future__ import annotations

from collections.abc import Callable

import gymnasium
import numpy as np
import pytest
import torch
from tensordict import TensorDict

from rlightning.policy import EnvMeta, ExperienceField, check_batch, env_fields

META = EnvMeta(gymnasium.spaces.Box(-1.0, 1.0, shape=(3, 2), dtype=np.float64), gymnasium.spaces.Discrete(2))
FIELDS = {**env_fields(META), "action": ExperienceField((), torch.int64)}


def _batch(steps: int = 4, envs: int = 2) -> TensorDict:
    return TensorDict(
        {key: torch.zeros(steps, envs, *field.shape, dtype=field.dtype) for key, field in FIELDS.items()},
        batch_size=[steps, envs],
    )


def test_env_fields_are_float32_observations_of_the_space_shape_and_scalar_steps() -> None:
    assert env_fields(META) == {
        "observation": ExperienceField((3, 2), torch.float32),  # float32 whatever the space's dtype
        "next_observation": ExperienceField((3, 2), torch.float32),
        "reward": ExperienceField((), torch.float32),
        "terminated": ExperienceField((), torch.bool),
        "truncated": ExperienceField((), torch.bool),
    }


def test_a_batch_of_the_layout_passes() -> None:
    assert check_batch(_batch(), FIELDS, (4, 2)) is None


def _set(key: str, value: torch.Tensor | TensorDict) -> Callable[[TensorDict], TensorDict]:
    def edit(batch: TensorDict) -> TensorDict:
        batch[key] = value
        return batch

    return edit


@pytest.mark.parametrize(
    ("edit", "reason"),
    [
        (lambda batch: batch[:3], "batch_size [3, 2], expected [4, 2]"),
        (lambda batch: batch.reshape(-1), "batch_size [8], expected [4, 2]"),
        (lambda batch: batch.exclude("next_observation", "action"), "missing keys ['next_observation', 'action']"),
        (_set("value", torch.zeros(4, 2)), "unexpected keys ['value']"),
        (_set("action", TensorDict({"a": torch.zeros(4, 2)}, batch_size=[4, 2])),
         "'action' is a TensorDict, expected a tensor"),
        (_set("observation", torch.zeros(4, 2, 6)), "'observation' has shape [4, 2, 6], expected [4, 2, 3, 2]"),
        (_set("action", torch.zeros(4, 2, 1, dtype=torch.int64)), "'action' has shape [4, 2, 1], expected [4, 2]"),
        (_set("action", torch.zeros(4, 2)), "'action' has dtype torch.float32, expected torch.int64"),
        (_set("terminated", torch.zeros(4, 2, dtype=torch.uint8)),
         "'terminated' has dtype torch.uint8, expected torch.bool"),
    ],
)
def test_each_rule_names_what_is_wrong(edit: Callable[[TensorDict], TensorDict], reason: str) -> None:
    assert check_batch(edit(_batch()), FIELDS, (4, 2)) == reason
