"""The frames an evaluator's DEALER and a trainer rank's ROUTER exchange (shared by `_sender` and `_intake`).

A batch is one zmq message of two frames, `[sequence, payload]`: the sequence as ASCII digits (so a rank can
acknowledge even a payload it cannot decode) and the `_codec` payload. An acknowledgement is `[sequence, outcome,
room]`: room is how many more batches the rank's current `fill` wants after this one (ASCII digits), which the sender
routes by. When a rank's `fill` holds its count, it also tells every other evaluator it has heard from, unasked,
with a notice `[b"full", version]` (the fill's version), so they stop producing batches no rank wants yet.
Rank 0 holding training to confirm the target on a version asks every evaluator it knows with `[b"evaluate", version]`
to play its evaluation episodes of that version now.
A restarted trainer's rank 0 pulls weights with `[b"pull"]`; the evaluator answers `[b"weights", payload]` (`_pull`).
Each DEALER sets `PROBE_ROUTER`, so a rank hears an empty message `[b""]` from every evaluator that connects and can
address it before it sent any batch (libzmq's way of bootstrapping a ROUTER).
zmq delivers a multipart message whole or not at all, so a sender that dies mid-message yields nothing.
"""

from __future__ import annotations

import enum
from typing import NamedTuple


class Outcome(enum.StrEnum):
    """What a trainer rank did with a batch, as acknowledged to its sender."""

    ACCEPTED = "accepted"
    """Held for training (lag within `maxPolicyLag`, valid)."""
    STALE = "stale"
    """Dropped: produced by weights more than `maxPolicyLag` versions old."""
    INVALID = "invalid"
    """Dropped: malformed, or rejected by the trainer's validation."""
    OLDER_ATTEMPT = "older_attempt"
    """Dropped: acted with weights of an older trainer attempt (epoch) than the receiving trainer's."""


def batch_frames(sequence: int, payload: bytes) -> list[bytes]:
    """The frames of one batch message.

    Args:
        sequence (int): The batch's `BatchStamp.sequence`.
        payload (bytes): `encode_batch`'s output.

    Returns:
        list[bytes]: `[sequence, payload]`.
    """
    return [str(sequence).encode("ascii"), payload]


class Ack(NamedTuple):
    """One acknowledgement, as the sender reads it.

    Attributes:
        sequence (int): The acknowledged batch's sequence.
        outcome (Outcome): What the rank did with it.
        room (int): Batches the rank's `fill` still wanted after judging it (0 once it held its count).
    """

    sequence: int
    outcome: Outcome
    room: int


def ack_frames(sequence: bytes, outcome: Outcome, room: int) -> list[bytes]:
    """The frames of one acknowledgement.

    Args:
        sequence (bytes): The batch's sequence frame, echoed as received.
        outcome (Outcome): What the rank did with the batch.
        room (int): Batches the rank's `fill` still wants after this one (>= 0).

    Returns:
        list[bytes]: `[sequence, outcome, room]`.
    """
    return [sequence, outcome.value.encode("ascii"), str(room).encode("ascii")]


def parse_ack(frames: list[bytes]) -> Ack | None:
    """Read an acknowledgement.

    Args:
        frames (list[bytes]): The message received by the DEALER.

    Returns:
        Ack | None: The acknowledged sequence, outcome and room; None for anything malformed.
    """
    if len(frames) != 3 or not frames[2].isdigit():
        return None
    try:
        return Ack(int(frames[0].decode("ascii")), Outcome(frames[1].decode("ascii")), int(frames[2]))
    except ValueError:  # UnicodeDecodeError is a ValueError
        return None


FULL = b"full"
"""First frame of a notice: the rank's fill holds its count."""


EVALUATE = b"evaluate"
"""First frame of a notice: evaluate this version now (rank 0 holds training to confirm the target on it); its third
frame is how many episodes rank 0 asks of each evaluator."""


def notice_frames(kind: bytes, version: int, episodes: int | None = None) -> list[bytes]:
    """The frames of a notice about a weight version.

    Args:
        kind (bytes): `FULL` (the rank's fill, judging against `version`, holds its count) or `EVALUATE`.
        version (int): The weight version (>= 0).
        episodes (int | None, optional): `EVALUATE`: the episodes asked of each evaluator (>= 1). Defaults to None.

    Returns:
        list[bytes]: `[kind, version]`, or `[kind, version, episodes]`, the numbers as ASCII digits.
    """
    numbers = (version,) if episodes is None else (version, episodes)
    return [kind, *(str(n).encode("ascii") for n in numbers)]


def parse_notice(kind: bytes, frames: list[bytes]) -> tuple[int, ...] | None:
    """Read a notice of one kind.

    Args:
        kind (bytes): `FULL` or `EVALUATE`.
        frames (list[bytes]): The message received by the DEALER.

    Returns:
        tuple[int, ...] | None: The notice's numbers (the version first); None when `frames` is not a notice of that
            kind.
    """
    if len(frames) not in (2, 3) or frames[0] != kind or not all(f.isdigit() for f in frames[1:]):
        return None
    return tuple(int(f) for f in frames[1:])


PULL = b"pull"
"""The one frame of a restarted trainer's request for the weights an evaluator holds."""

WEIGHTS = b"weights"
"""First frame of an evaluator's answer to `PULL`: `[b"weights", payload]` (`_pull.encode_weights`)."""

PROBE = b""
"""The one frame libzmq sends from a DEALER with `PROBE_ROUTER` on each new connection."""


def weights_frames(payload: bytes) -> list[bytes]:
    """The frames of an answer to a pull.

    Args:
        payload (bytes): `_pull.encode_weights`'s output.

    Returns:
        list[bytes]: `[b"weights", payload]`.
    """
    return [WEIGHTS, payload]


def parse_weights(frames: list[bytes]) -> bytes | None:
    """Read an answer to a pull.

    Args:
        frames (list[bytes]): The message received by the ROUTER, without the peer's identity.

    Returns:
        bytes | None: The payload; None when `frames` is not an answer.
    """
    if len(frames) != 2 or frames[0] != WEIGHTS:
        return None
    return frames[1]
