"""The protocol's messages as typed values, and their one encoding on the weight-sync store.

Every value the sender or a receiver writes to the store is one of these frozen dataclasses (or a
`ReceiverReport`), encoded as JSON by `write` and decoded and validated by `read` with pydantic's
`TypeAdapter`; keys are named in `_store`. Messages about weights carry the weight `version` they concern.
Layouts travel as `BucketLayout.to_json` under their signature (`_buckets`).
"""

from __future__ import annotations

import dataclasses
from typing import Annotated, Literal, TypeVar

import pydantic
import torch.distributed as dist

from rlightning.weights._membership import Member
from rlightning.weights._types import ReceiverReport

T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Join:
    """A receiver registers (again) under a fresh session (membership log, `_store.member_event`).

    Attributes:
        ordinal (int): the receiver's ordinal.
        session (str): id of this registration.
        cuda (bool): whether it can take part in an NCCL group.
        version (int): the newest weight version it holds, so a restarted sender publishes above it.
    """

    ordinal: int
    session: str
    cuda: bool = False
    version: int = 0
    kind: Literal["join"] = "join"


@dataclasses.dataclass(frozen=True)
class Leave:
    """A receiver leaves the fleet (membership log); ignored unless `session` is its current one.

    Attributes:
        ordinal (int): the receiver's ordinal.
        session (str): the registration that ends.
    """

    ordinal: int
    session: str
    kind: Literal["leave"] = "leave"


@dataclasses.dataclass(frozen=True)
class AnnouncedGroup:
    """One group (a relay tree, `_topology`) of a publish, as the receivers need it.

    Attributes:
        index (int): group index.
        generation (int): formation number (its store prefix, `_store.group_prefix`).
        backend (str): `gloo` or `nccl`, of every edge of the tree.
        members (tuple[Member, ...]): receivers by ordinal, the order of their places in the tree.
    """

    index: int
    generation: int
    backend: str
    members: tuple[Member, ...]


@dataclasses.dataclass(frozen=True)
class Publish:
    """Announcement of one publish (`_store.announce`).

    Attributes:
        seq (int): the publish's sequence number.
        version (int): the weight version published.
        signature (str): the bucket layout's signature.
        log_upto (int): membership events folded before planning; a receiver registered by then that is in no
            group was evicted.
        groups (tuple[AnnouncedGroup, ...]): every group the publish addresses.
        fanout (int): children per member in each group's relay tree (`_topology.relay_tree`).
        epoch (int): the sender's epoch, its trainer gang's attempt; receivers order publishes by
            `(epoch, version)` and refuse one of an epoch below the highest they have seen (`_epoch`). Absent
            (0) in the announcements of senders that predate it.
        trees (int): relay trees per group the transfers are split over (`_topology.relay_trees`, `carried`).
    """

    seq: int
    version: int
    signature: str
    log_upto: int
    groups: tuple[AnnouncedGroup, ...]
    fanout: int
    epoch: int = 0
    trees: int = 1
    kind: Literal["weights"] = "weights"


@dataclasses.dataclass(frozen=True)
class Close:
    """Announcement that the sender closes (`_store.announce`); receivers acknowledge it.

    Attributes:
        seq (int): its sequence number.
    """

    seq: int
    kind: Literal["close"] = "close"


@dataclasses.dataclass(frozen=True)
class Commit:
    """The sender's verdict on one group's broadcast of a publish (`_store.commit`).

    Attributes:
        ok (bool): True when every broadcast of the group succeeded; receivers use the version only then.
    """

    ok: bool


@dataclasses.dataclass(frozen=True)
class Ack:
    """A receiver's answer to an announcement (`_store.ack`).

    Attributes:
        outcome (str): `applied` (the version is the receiver's now: applied, when it receives with `apply`),
            `failed` (its `apply` raised), `ignored` (it already held that version or a newer one of the same epoch),
            `refused` (the publish's epoch is below one it has seen: a zombie's, never applied), `closed`
            (it read the sender's close), or `lost`: written for it, where it wrote nothing yet (`write_absent`),
            by a tree neighbour whose edge to it broke in this publish, so it cannot have acknowledged the version
            (it, or the relay it hangs from, died or dropped the publish); the sender need not wait for it.
        version (int): the receiver's version after handling the announcement (-1 in a `lost` one).
        error (str): why `apply` failed, why the receiver was lost, or why it refused (naming both epochs);
            empty otherwise.
    """

    outcome: Literal["applied", "failed", "ignored", "refused", "closed", "lost"]
    version: int
    error: str = ""


MEMBER_EVENT: pydantic.TypeAdapter[Join | Leave] = pydantic.TypeAdapter(
    Annotated[Join | Leave, pydantic.Field(discriminator="kind")]
)
ANNOUNCEMENT: pydantic.TypeAdapter[Publish | Close] = pydantic.TypeAdapter(
    Annotated[Publish | Close, pydantic.Field(discriminator="kind")]
)
COMMIT = pydantic.TypeAdapter(Commit)
ACK = pydantic.TypeAdapter(Ack)
REPORT = pydantic.TypeAdapter(ReceiverReport)
_ADAPTERS: dict[type, pydantic.TypeAdapter] = {
    Join: MEMBER_EVENT,
    Leave: MEMBER_EVENT,
    Publish: ANNOUNCEMENT,
    Close: ANNOUNCEMENT,
    Commit: COMMIT,
    Ack: ACK,
    ReceiverReport: REPORT,
}


def encode(message: object) -> str:
    """The JSON encoding of `message` (one of this module's messages or a `ReceiverReport`).

    Raises:
        KeyError: for any other type.
    """
    return _ADAPTERS[type(message)].dump_json(message).decode()


def write(store: dist.Store, key: str, message: object) -> None:
    """Set `key` to `message`, encoded (`encode`)."""
    store.set(key, encode(message))


def write_absent(store: dist.Store, key: str, message: object) -> None:
    """Set `key` to `message` (`encode`) only where `key` does not exist yet (one `compare_set`)."""
    store.compare_set(key, "", encode(message))


def read(store: dist.Store, key: str, adapter: pydantic.TypeAdapter[T]) -> T:
    """The message at `key`, decoded with `adapter` (`MEMBER_EVENT`, `ANNOUNCEMENT`, `COMMIT`, `ACK`, `REPORT`).

    Blocks up to the store's timeout when the key is absent.

    Raises:
        pydantic.ValidationError: (a ValueError) when the value is not such a message.
    """
    return adapter.validate_json(store.get(key))
