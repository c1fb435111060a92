"""Trajectories: the fleet-to-trainer data path, from an evaluator's batch to a trainer rank's held dataset.

Belongs here: the batch stamp (`BatchStamp`), the no-pickle codec (`encode_batch`, `decode_batch`: safetensors),
the transport over zmq (`TrajectorySender` on evaluators: a DEALER per rank, each batch routed to the rank that
reports the most room, with credit-based flow control;
`TrajectoryIntake` on each trainer rank: a ROUTER read only when the trainer wants data), the intake's judgement
and lag accounting (`maxPolicyLag`), and a restarted trainer's pull of the weights an evaluator holds over the same
connections (`HeldWeights`, `encode_weights`, `decode_weights`: safetensors). Not here: collecting rollouts,
training, weights (`rlightning.runtime`, `rlightning.policy`, `rlightning.weights`, which this package never
imports). Why zmq: docs/trajectories.md.
"""

from rlightning.trajectories._codec import BatchError, decode_batch, encode_batch
from rlightning.trajectories._intake import IntakeStats, TrajectoryIntake
from rlightning.trajectories._pull import HeldWeights, decode_weights, encode_weights
from rlightning.trajectories._sender import SenderCounts, TrajectorySender
from rlightning.trajectories._stamp import BatchStamp

__all__ = [
    "BatchError",
    "BatchStamp",
    "HeldWeights",
    "IntakeStats",
    "SenderCounts",
    "TrajectoryIntake",
    "TrajectorySender",
    "decode_batch",
    "decode_weights",
    "encode_batch",
    "encode_weights",
]
