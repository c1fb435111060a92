"""The codec: a TensorDict and its stamp survive the round trip exactly; anything malformed is a BatchError."""

from __future__ import annotations

import json

import pytest
import safetensors.torch
import torch
from tensordict import TensorDict

from rlightning.trajectories import BatchError, BatchStamp, decode_batch, encode_batch

STAMP = BatchStamp(version=7, ordinal=3, sequence=12, env_steps=64,
                   episode_returns=(21.5, 500.0), episode_lengths=(22, 500), epoch=2)


def nested_batch() -> TensorDict:
    return TensorDict(
        {
            "observation": torch.randn(8, 4, 5),
            "action": torch.randint(0, 2, (8, 4), dtype=torch.int64),
            "next": {
                "done": torch.rand(8, 4) > 0.5,
                "reward": torch.randn(8, 4),
                "deeper": {"value": torch.randn(8, 4, 1, dtype=torch.float64)},
            },
        },
        batch_size=[8, 4],
    )


def test_round_trip_keeps_nested_keys_dtypes_batch_size_and_stamp():
    batch = nested_batch()
    decoded, stamp = decode_batch(encode_batch(batch, STAMP))
    assert stamp == STAMP
    assert decoded.batch_size == torch.Size([8, 4])
    assert set(decoded.keys(include_nested=True, leaves_only=True)) == set(
        batch.keys(include_nested=True, leaves_only=True))
    for key, leaf in batch.items(include_nested=True, leaves_only=True):
        assert decoded[key].dtype == leaf.dtype, key
        assert torch.equal(decoded[key], leaf), key
    assert decoded["next", "done"].dtype == torch.bool
    assert decoded["action"].dtype == torch.int64
    assert decoded["observation"].dtype == torch.float32


def test_empty_episode_lists_and_zero_rows_round_trip():
    stamp = BatchStamp(version=0, ordinal=0, sequence=1, env_steps=0)
    decoded, got = decode_batch(encode_batch(TensorDict({"x": torch.zeros(0, 3)}, batch_size=[0]), stamp))
    assert got == stamp and decoded["x"].shape == (0, 3)


def test_a_stamp_without_an_epoch_reads_as_epoch_zero():
    # what an evaluator from before epochs sends
    old = {"version": 7, "ordinal": 3, "sequence": 1, "env_steps": 4, "episode_returns": [], "episode_lengths": []}
    payload = safetensors.torch.save({"x": torch.zeros(4)}, metadata={"batch_size": "[4]", "stamp": json.dumps(old)})
    assert decode_batch(payload)[1] == BatchStamp(version=7, ordinal=3, sequence=1, env_steps=4, epoch=0)
    with pytest.raises(ValueError, match="stamp.epoch: must be an integer >= 0"):
        BatchStamp(version=7, ordinal=3, sequence=1, env_steps=4, epoch=-1)


def test_encode_rejects_keys_that_cannot_be_split_back():
    with pytest.raises(ValueError, match="not contain '.'"):
        encode_batch(TensorDict({"a.b": torch.zeros(2)}, batch_size=[2]), STAMP)
    with pytest.raises(ValueError, match="must be non-empty"):
        encode_batch(TensorDict({"": torch.zeros(2)}, batch_size=[2]), STAMP)


def safetensors_payload(metadata: dict[str, str] | None, tensors: dict | None = None) -> bytes:
    return safetensors.torch.save(tensors if tensors is not None else {"x": torch.zeros(4, 2)}, metadata=metadata)


GOOD_STAMP = json.dumps({"version": 1, "ordinal": 0, "sequence": 1, "env_steps": 4,
                         "episode_returns": [], "episode_lengths": []})


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b"", "not a safetensors batch"),
        (b"\x00" * 7, "not a safetensors batch"),
        (b"not safetensors at all, just some bytes", "not a safetensors batch"),
        (encode_batch(nested_batch(), STAMP)[:-100], "not a safetensors batch"),
        (safetensors_payload(None), "metadata: missing"),
        (safetensors_payload({"stamp": GOOD_STAMP}), "metadata.batch_size: missing"),
        (safetensors_payload({"batch_size": "[4", "stamp": GOOD_STAMP}), "metadata.batch_size: missing or not JSON"),
        (safetensors_payload({"batch_size": "[-1]", "stamp": GOOD_STAMP}), "metadata.batch_size: must be a list"),
        (safetensors_payload({"batch_size": "[4]"}), "metadata.stamp: missing"),
        (safetensors_payload({"batch_size": "[4]", "stamp": "{"}), "metadata.stamp: missing or not JSON"),
        (safetensors_payload({"batch_size": "[4]", "stamp": '{"version": 1}'}), "exactly the keys"),
        (safetensors_payload({"batch_size": "[4]", "stamp": GOOD_STAMP.replace('"sequence": 1', '"sequence": 0')}),
         r"metadata.stamp.sequence: must be an integer >= 1"),
        (safetensors_payload({"batch_size": "[4]", "stamp": GOOD_STAMP.replace('"version": 1', '"version": true')}),
         r"metadata.stamp.version"),
        (safetensors_payload({"batch_size": "[4]",
                              "stamp": GOOD_STAMP.replace('"episode_lengths": []', '"episode_lengths": [3]')}),
         r"metadata.stamp.episode_lengths: must have one entry per episode return"),
        (safetensors_payload({"batch_size": "[5]", "stamp": GOOD_STAMP}),
         r"leaf 'x': shape \[4, 2\] does not start with the batch size \[5\]"),
        (safetensors_payload({"batch_size": "[4]", "stamp": GOOD_STAMP}, {"a.b": torch.zeros(4), "a": torch.zeros(4)}),
         r"leaf 'a.b': 'a' is a leaf too"),
        (safetensors_payload({"batch_size": "[4]", "stamp": GOOD_STAMP}, {"a..b": torch.zeros(4)}),
         r"leaf 'a..b': a nested key part is empty"),
    ],
    ids=["empty", "short", "garbage", "truncated", "no-metadata", "no-batch-size", "batch-size-not-json",
         "negative-batch-size", "no-stamp", "stamp-not-json", "stamp-missing-fields", "sequence-0", "bool-version",
         "episode-lists-differ", "leaf-not-batch-size", "leaf-and-prefix", "empty-key-part"],
)
def test_malformed_payloads_raise_batch_error_saying_why(payload, message):
    with pytest.raises(BatchError, match=message):
        decode_batch(payload)


def test_batch_error_is_a_value_error():
    assert issubclass(BatchError, ValueError)
