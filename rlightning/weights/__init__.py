"""Weight sync: what a policy's weights are, how copies are compared, and how they travel to evaluators.

Belongs here: extraction and loading of weights by clean name (`named_state`), fingerprints and digests,
flat buckets, the staging buffer mixed into policies (`WeightBufferMixin`), broadcast groups (gloo; NCCL
behind a capability check), relay trees along which evaluators forward the buckets to each other, and the
versioned sender/receiver protocol over the weight-sync store. Not here:
training, evaluation loops, process launching (see `rlightning.policy` and `rlightning.runtime`).

Layers, as in TorchRL's weight_update: transport (`_transport`, `_nccl`: how bytes move), strategy
(`_state`, `_buckets`: what is extracted and applied), scheme (`_sender`, `_receiver` with its session
`_receiver_session` and one publish's `_receiver_round`, `_membership`, `_topology`, `_relay`: versions, relay trees
and acknowledgements over `_store`, in the typed messages of `_messages`). The sender owns the weight version: it
assigns each publish the next one.

`__all__` holds what users call; the layers' internals (bucket layouts, group plans, messages) are imported
from their private modules by the modules (and tests and benchmarks) that need them.
"""

from rlightning.weights._buffer import WeightBufferMixin
from rlightning.weights._fingerprint import (
    WeightRecord,
    l2_fingerprint,
    mismatched_digests,
    mismatched_fingerprints,
    tensor_digests,
)
from rlightning.weights._receiver import WeightReceiver
from rlightning.weights._sender import WeightSender
from rlightning.weights._state import clean_state_dict_keys, load_named_state, named_state
from rlightning.weights._types import ReceiverReport, SyncStats, WeightSyncError

__all__ = [
    "ReceiverReport",
    "SyncStats",
    "WeightBufferMixin",
    "WeightReceiver",
    "WeightRecord",
    "WeightSender",
    "WeightSyncError",
    "clean_state_dict_keys",
    "l2_fingerprint",
    "load_named_state",
    "mismatched_digests",
    "mismatched_fingerprints",
    "named_state",
    "tensor_digests",
]
