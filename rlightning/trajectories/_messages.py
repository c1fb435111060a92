"""The frames an evaluator's DEALER and a trainer rank's ROUTER exchange (shared by `_sender` and `_intake`).

A batch is one zmq message of two frames, `[sequence, payload]`: the sequence as ASCII digits (so a rank can
acknowledge even a payload it cannot decode) and the `_codec` payload. An acknowledgement is `[sequence, outcome]`.
zmq delivers a multipart message whole or not at all, so a sender that dies mid-message yields nothing.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    """What a trainer rank did with a batch, as acknowledged to its sender."""

    ACCEPTED = "accepted"
    """Held for training (lag within `maxPolicyLag`, valid)."""
    STALE = "stale"
    """Dropped: produced by weights more than `maxPolicyLag` versions old."""
    INVALID = "invalid"
    """Dropped: malformed, or rejected by the trainer's validation."""


def batch_frames(sequence: int, payload: bytes) -> list[bytes]:
    """The frames of one batch message.

    Args:
        sequence (int): The batch's `BatchStamp.sequence`.
        payload (bytes): `encode_batch`'s output.

    Returns:
        list[bytes]: `[sequence, payload]`.
    """
    return [str(sequence).encode("ascii"), payload]


def ack_frames(sequence: bytes, outcome: Outcome) -> list[bytes]:
    """The frames of one acknowledgement.

    Args:
        sequence (bytes): The batch's sequence frame, echoed as received.
        outcome (Outcome): What the rank did with the batch.

    Returns:
        list[bytes]: `[sequence, outcome]`.
    """
    return [sequence, outcome.value.encode("ascii")]


def parse_ack(frames: list[bytes]) -> tuple[int, Outcome] | None:
    """Read an acknowledgement.

    Args:
        frames (list[bytes]): The message received by the DEALER.

    Returns:
        tuple[int, Outcome] | None: The acknowledged sequence and outcome; None for anything malformed.
    """
    if len(frames) != 2:
        return None
    try:
        return int(frames[0].decode("ascii")), Outcome(frames[1].decode("ascii"))
    except ValueError:  # UnicodeDecodeError is a ValueError
        return None
