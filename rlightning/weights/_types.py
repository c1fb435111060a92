"""Results and errors of the weight-sync protocol."""

from __future__ import annotations

import dataclasses

from rlightning.weights._fingerprint import WeightRecord


class WeightSyncError(RuntimeError):
    """A publish did not reach every receiver; the groups not named in `failed` completed.

    Attributes:
        stats (SyncStats): what the publish achieved, including `failed`.
    """

    def __init__(self, message: str, stats: SyncStats) -> None:
        super().__init__(message)
        self.stats = stats


@dataclasses.dataclass
class SyncStats:
    """Outcome of one `WeightSender.publish`.

    Attributes:
        version (int): the weight version published.
        seq (int): the publish's sequence number in this sender's store (1, 2, ...).
        bytes (int): bytes of weights per receiver (all buckets).
        seconds (float): wall time of the publish, from announcement to the last acknowledgement.
        groups (dict[int, int]): group index -> generation, for every group the publish addressed.
        formed_groups (list[int]): groups (re)formed by this publish (new or changed membership).
        receivers_acked (list[int]): ordinals that acknowledged applying the version, sorted.
        receivers_ignored (list[int]): ordinals that received the version but dropped it, already holding that
            version or a newer one (not a failure), sorted.
        failed (dict[int, list[int]]): group index -> ordinals that did not acknowledge the version as applied
            (no acknowledgement in time, their `apply` failed, or they refused the sender's epoch as older than one
            they have seen), sorted; only groups with such ordinals.
    """

    version: int
    seq: int
    bytes: int
    seconds: float = 0.0
    groups: dict[int, int] = dataclasses.field(default_factory=dict)
    formed_groups: list[int] = dataclasses.field(default_factory=list)
    receivers_acked: list[int] = dataclasses.field(default_factory=list)
    receivers_ignored: list[int] = dataclasses.field(default_factory=list)
    failed: dict[int, list[int]] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class ReceiverReport:
    """The newest report a receiver posted through the store (a protocol message, see `_messages`).

    Attributes:
        ordinal (int): the receiver's ordinal.
        applied (WeightRecord): the weights in its policy: version, fingerprint and digests.
        metrics (dict[str, float]): its latest metrics, e.g. {"eval_return": 475.0}.
        time (float): when it was posted, seconds since the epoch (receiver's clock).
    """

    ordinal: int
    applied: WeightRecord
    metrics: dict[str, float]
    time: float
