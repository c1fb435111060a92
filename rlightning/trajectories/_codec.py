"""One trajectory batch as bytes: a TensorDict and its `BatchStamp` in one safetensors payload (no pickle).

The leaves are stored as safetensors tensors named by their nested key joined with `KEY_SEPARATOR`; the batch size
and the stamp go into the safetensors metadata as JSON strings. Decoding parses only safetensors and JSON, so a
trainer never runs code that came over the network. Format: https://github.com/huggingface/safetensors#format.
"""

from __future__ import annotations

import dataclasses
import json

import safetensors
import safetensors.torch
import torch
from tensordict import TensorDict, TensorDictBase

from rlightning.trajectories._stamp import BatchStamp

KEY_SEPARATOR = "."
"""Joins nested keys into one tensor name (tensordict's own `flatten_keys` default)."""

BATCH_SIZE_KEY = "batch_size"
"""Metadata entry: the batch size as a JSON list of ints."""

STAMP_KEY = "stamp"
"""Metadata entry: the `BatchStamp` as a JSON object. `epoch` may be absent (0): evaluators from before it."""

_HEADER_LENGTH_BYTES = 8
"""A safetensors payload starts with its JSON header's length, a little-endian u64 (the format's first field)."""


class BatchError(ValueError):
    """A trajectory payload that is not a well-formed batch (bad bytes, metadata or shapes); the message says why."""


def encode_batch(batch: TensorDictBase, stamp: BatchStamp) -> bytes:
    """Encode a batch and its stamp as one safetensors payload.

    Args:
        batch (TensorDictBase): Experience of shape `[*B]` (for a collector `[T, N]`), nested keys allowed; every
            leaf a tensor of shape `[*B, *F]`, any dtype safetensors stores (bool, int64, float32, ...), any device
            (copied to CPU).
        stamp (BatchStamp): Its provenance.

    Returns:
        bytes: The payload; `decode_batch` inverts it.

    Raises:
        ValueError: When a key is empty or contains `KEY_SEPARATOR` (it could not be split back), or a leaf is not
            a tensor.

    Examples:
        >>> td = TensorDict({"obs": torch.zeros(4, 2, 3)}, batch_size=[4, 2])
        >>> decoded, stamp = decode_batch(encode_batch(td, BatchStamp(3, 0, 1, 8)))
        >>> decoded["obs"].shape, decoded["obs"].dtype, stamp.version
        (torch.Size([4, 2, 3]), torch.float32, 3)
    """
    tensors: dict[str, torch.Tensor] = {}
    for key, leaf in batch.items(include_nested=True, leaves_only=True):
        path = (key,) if isinstance(key, str) else key
        if any(KEY_SEPARATOR in part or not part for part in path):
            raise ValueError(f"batch key {path!r}: must be non-empty and not contain {KEY_SEPARATOR!r} (nested keys "
                             "are joined by it)")
        if not isinstance(leaf, torch.Tensor):
            raise ValueError(f"batch key {path!r}: must be a tensor, got {type(leaf).__name__}")
        tensors[KEY_SEPARATOR.join(path)] = leaf.detach().to("cpu").contiguous()
    metadata = {
        BATCH_SIZE_KEY: json.dumps(list(batch.batch_size)),
        STAMP_KEY: json.dumps(dataclasses.asdict(stamp)),
    }
    return safetensors.torch.save(tensors, metadata=metadata)


def decode_batch(payload: bytes) -> tuple[TensorDict, BatchStamp]:
    """Decode a payload from `encode_batch`.

    Args:
        payload (bytes): The bytes received.

    Returns:
        tuple[TensorDict, BatchStamp]: The batch on CPU with its nested keys and batch size, and its stamp.

    Raises:
        BatchError: When the payload is not safetensors, its metadata lacks or garbles the batch size or the stamp,
            a leaf's leading dimensions differ from the batch size, or its names do not form nested keys (an empty
            part, or a leaf that is also another's prefix).
    """
    try:
        flat = safetensors.torch.load(payload)
    except (safetensors.SafetensorError, ValueError, TypeError) as err:
        raise BatchError(f"payload: not a safetensors batch ({err})") from err
    metadata = _metadata(payload)
    batch_size = _batch_size(metadata)
    stamp = _stamp(metadata)
    for name, leaf in flat.items():
        if tuple(leaf.shape[: len(batch_size)]) != batch_size:
            raise BatchError(
                f"leaf {name!r}: shape {list(leaf.shape)} does not start with the batch size {list(batch_size)}"
            )
    return TensorDict({_key(name, flat): leaf for name, leaf in flat.items()}, batch_size=batch_size), stamp


def _key(name: str, flat: dict[str, torch.Tensor]) -> tuple[str, ...]:
    path = tuple(name.split(KEY_SEPARATOR))
    if not all(path):
        raise BatchError(f"leaf {name!r}: a nested key part is empty")
    for depth in range(1, len(path)):
        prefix = KEY_SEPARATOR.join(path[:depth])
        if prefix in flat:
            raise BatchError(f"leaf {name!r}: {prefix!r} is a leaf too, so it cannot also hold nested keys")
    return path


def header_metadata(payload: bytes) -> object:
    """The `__metadata__` entry of a safetensors payload's JSON header, as parsed (None when absent).

    Call it after `safetensors.torch.load(payload)` succeeded, which validates the header: safetensors' Python API
    exposes the metadata only for files.

    Args:
        payload (bytes): A safetensors payload.

    Returns:
        object: The entry (a dict of str -> str when well formed), or None.
    """
    length = int.from_bytes(payload[:_HEADER_LENGTH_BYTES], "little")
    return json.loads(payload[_HEADER_LENGTH_BYTES : _HEADER_LENGTH_BYTES + length]).get("__metadata__")


def _metadata(payload: bytes) -> dict[str, str]:
    metadata = header_metadata(payload)
    if not isinstance(metadata, dict):
        raise BatchError(f"metadata: missing (needs {BATCH_SIZE_KEY!r} and {STAMP_KEY!r})")
    return metadata


def _batch_size(metadata: dict[str, str]) -> tuple[int, ...]:
    try:
        value = json.loads(metadata[BATCH_SIZE_KEY])
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise BatchError(f"metadata.{BATCH_SIZE_KEY}: missing or not JSON ({err!r})") from err
    if not isinstance(value, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                               for n in value):
        raise BatchError(f"metadata.{BATCH_SIZE_KEY}: must be a list of integers >= 0, got {value!r}")
    return tuple(value)


def _stamp(metadata: dict[str, str]) -> BatchStamp:
    try:
        value = json.loads(metadata[STAMP_KEY])
    except (KeyError, TypeError, json.JSONDecodeError) as err:
        raise BatchError(f"metadata.{STAMP_KEY}: missing or not JSON ({err!r})") from err
    fields = {field.name for field in dataclasses.fields(BatchStamp)}
    if not isinstance(value, dict) or not fields - {"epoch"} <= set(value) <= fields:
        raise BatchError(f"metadata.{STAMP_KEY}: must be an object with exactly the keys {sorted(fields)} ('epoch' "
                         f"optional), got {value!r}")
    try:
        return BatchStamp(
            version=value["version"],
            ordinal=value["ordinal"],
            sequence=value["sequence"],
            env_steps=value["env_steps"],
            episode_returns=tuple(value["episode_returns"]),
            episode_lengths=tuple(value["episode_lengths"]),
            epoch=value.get("epoch", 0),
        )
    except ValueError as err:  # BatchStamp names the field: "stamp.<field>: <rule>"
        raise BatchError(f"metadata.{err}") from err
    except TypeError as err:
        raise BatchError(f"metadata.{STAMP_KEY}: episode lists must be JSON lists ({err})") from err
