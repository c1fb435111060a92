"""`HeldWeights`: the weights an evaluator holds, as it answers a restarted trainer's pull, and their codec.

A trainer gang restarted without a checkpoint asks an evaluator for its weights over the trajectory connection
(`TrajectoryIntake.pull_weights`, answered by `TrajectorySender`). The answer is one safetensors payload: the
tensors by clean name (`rlightning.weights.named_state` form) and, in the metadata, the version and the ordinal as
decimal strings. Decoding parses only safetensors and JSON (no pickle), as for batches (`_codec`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import safetensors
import safetensors.torch
import torch

from rlightning.trajectories import _codec

VERSION_KEY = "version"
"""Metadata entry: the weight version held (decimal digits; 0 when the evaluator holds none yet)."""

ORDINAL_KEY = "ordinal"
"""Metadata entry: the answering evaluator's ordinal (decimal digits)."""

@dataclasses.dataclass(frozen=True)
class HeldWeights:
    """What one evaluator holds.

    Attributes:
        version (int): Its weight version (0: it holds none yet, and `state` is empty).
        ordinal (int): The evaluator's ordinal.
        state (dict[str, torch.Tensor]): Clean name -> tensor on the CPU, in the evaluator's dtypes (what a
            trainer's `get_eval_weights()` names).
    """

    version: int
    ordinal: int
    state: dict[str, torch.Tensor]


def encode_weights(version: int, ordinal: int, state: Mapping[str, torch.Tensor]) -> bytes:
    """Encode the weights an evaluator holds as one safetensors payload.

    Args:
        version (int): The weight version held (>= 0).
        ordinal (int): The evaluator's ordinal (>= 0).
        state (Mapping[str, torch.Tensor]): Clean name -> tensor, any device and dtype safetensors stores (copied
            to the CPU, so tensors sharing storage are fine).

    Returns:
        bytes: The payload; `decode_weights` inverts it.

    Examples:
        >>> held = decode_weights(encode_weights(7, 2, {"agent.fc.weight": torch.ones(4, 3)}))
        >>> held.version, held.ordinal, held.state["agent.fc.weight"].shape
        (7, 2, torch.Size([4, 3]))
    """
    tensors = {name: tensor.detach().to("cpu", copy=True).contiguous() for name, tensor in state.items()}
    return safetensors.torch.save(tensors, metadata={VERSION_KEY: str(version), ORDINAL_KEY: str(ordinal)})


def decode_weights(payload: bytes) -> HeldWeights:
    """Decode a payload from `encode_weights`.

    Args:
        payload (bytes): The bytes received.

    Returns:
        HeldWeights: The version, ordinal and tensors (CPU).

    Raises:
        ValueError: When the payload is not safetensors or its metadata lacks the version or the ordinal as
            decimal digits (the message names which).
    """
    try:
        state = safetensors.torch.load(payload)
        metadata = _codec.header_metadata(payload)
    except (safetensors.SafetensorError, ValueError, TypeError) as err:
        raise ValueError(f"weights payload: not safetensors ({err})") from err
    numbers = {}
    for key in (VERSION_KEY, ORDINAL_KEY):
        value = metadata.get(key) if isinstance(metadata, dict) else None
        if not isinstance(value, str) or not (value.isascii() and value.isdigit()):
            raise ValueError(f"weights payload: metadata.{key} must be decimal digits, got {value!r}")
        numbers[key] = int(value)
    return HeldWeights(numbers[VERSION_KEY], numbers[ORDINAL_KEY], dict(state))
