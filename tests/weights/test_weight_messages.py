"""The protocol's messages: one encoding, decoded to the same typed values, bad values refused by name."""

from __future__ import annotations

import datetime

import pydantic
import pytest
import torch
import torch.distributed as dist

from rlightning.weights import ReceiverReport, WeightRecord
from rlightning.weights import _messages as m
from rlightning.weights._epoch import Verdict, judge
from rlightning.weights._membership import Member


class _Store:
    """The two calls of a TCPStore the messages use, in memory."""

    def __init__(self) -> None:
        self.values: dict[str, bytes] = {}

    def set(self, key: str, value: str) -> None:
        self.values[key] = value.encode()

    def get(self, key: str) -> bytes:
        return self.values[key]


@pytest.mark.parametrize(
    ("message", "adapter"),
    [
        (m.Join(3, "s1", cuda=True, version=9), m.MEMBER_EVENT),
        (m.Leave(3, "s1"), m.MEMBER_EVENT),
        (m.Publish(7, 12, "ab" * 32, 4, (m.AnnouncedGroup(0, 2, "gloo", (Member(0, "a"), Member(1, "b"))),), 2),
         m.ANNOUNCEMENT),  # fmt: skip
        (m.Publish(9, 3, "cd" * 32, 5, (), 2, epoch=4), m.ANNOUNCEMENT),
        (m.Close(8), m.ANNOUNCEMENT),
        (m.Commit(ok=False), m.COMMIT),
        (m.Ack("ignored", 12), m.ACK),
        (m.Ack("refused", 5, "publish 2 of epoch 0 (weight version 9) refused: epoch 1 was seen"), m.ACK),
        (m.Ack("lost", -1, "relay 0: forwarding failed: Connection closed by peer"), m.ACK),
        (ReceiverReport(1, WeightRecord.of(12, {"w": torch.ones(2)}), {"eval_return": 475.0}, 1.5), m.REPORT),
    ],
)
def test_every_message_reads_back_as_written(message: object, adapter: pydantic.TypeAdapter) -> None:
    store = _Store()
    m.write(store, "key", message)
    assert m.read(store, "key", adapter) == message


def test_write_absent_never_replaces_an_acknowledgement() -> None:
    store = dist.TCPStore("127.0.0.1", 0, None, True, datetime.timedelta(seconds=10), wait_for_workers=False)
    m.write(store, "own", m.Ack("applied", 4))
    m.write_absent(store, "own", m.Ack("lost", -1, "cut off"))
    m.write_absent(store, "none", m.Ack("lost", -1, "cut off"))
    m.write_absent(store, "none", m.Ack("lost", -1, "cut off again"))
    assert m.read(store, "own", m.ACK) == m.Ack("applied", 4)
    assert m.read(store, "none", m.ACK) == m.Ack("lost", -1, "cut off")


def test_a_value_that_is_not_a_message_is_refused_naming_the_field() -> None:
    store = _Store()
    store.set("key", '{"kind": "join", "ordinal": "three", "session": "s"}')
    with pytest.raises(pydantic.ValidationError, match="ordinal"):
        m.read(store, "key", m.MEMBER_EVENT)
    store.set("key", '{"kind": "rejoin", "ordinal": 3, "session": "s"}')
    with pytest.raises(pydantic.ValidationError, match="rejoin"):
        m.read(store, "key", m.MEMBER_EVENT)


def test_an_announcement_without_an_epoch_reads_as_epoch_zero() -> None:
    store = _Store()  # what a sender from before epochs wrote
    store.set("key", '{"kind": "weights", "seq": 1, "version": 3, "signature": "s", "log_upto": 0, "groups": [], '
                     '"fanout": 2}')
    assert m.read(store, "key", m.ANNOUNCEMENT) == m.Publish(1, 3, "s", 0, (), 2, epoch=0)


@pytest.mark.parametrize(
    ("seen_epoch", "held", "published", "verdict"),
    [
        (0, (0, 0), (0, 1), Verdict.APPLY),  # the first publish
        (0, (0, 5), (0, 5), Verdict.IGNORE),  # already held
        (0, (0, 5), (0, 4), Verdict.IGNORE),
        (0, (0, 5), (1, 2), Verdict.APPLY),  # a new attempt's first publish, whatever its version
        (1, (1, 5), (0, 9), Verdict.REFUSE),  # a zombie of attempt 0, even at a higher version
        (1, (0, 5), (0, 9), Verdict.REFUSE),  # epoch 1 was seen (its publish failed here): epoch 0 is fenced
        (1, (0, 5), (1, 6), Verdict.APPLY),
        (2, (1, 5), (1, 7), Verdict.REFUSE),
    ],
)
def test_publishes_are_ordered_by_epoch_then_version(seen_epoch, held, published, verdict) -> None:
    assert judge(seen_epoch, held, published) is verdict
