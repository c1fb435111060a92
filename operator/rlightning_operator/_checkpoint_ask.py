"""Ask a PolicyGroup's trainers for a checkpoint now: the annotation `contract.ANNOTATION_CHECKPOINT_REQUEST` on the
PolicyGroup, which trainer rank 0 reads from the answers to its status reports (rlightning.runtime._records) and
honours with the same checkpoint as its periodic one, and a Normal Event `CheckpointRequested` that says why.
"""

from __future__ import annotations

import datetime
import logging
from collections.abc import Callable, Mapping
from typing import Any

from rlightning import contract
from rlightning_operator import _kube as kube
from rlightning_operator import _metrics as metrics
from rlightning_operator import _notices as notices

logger = logging.getLogger(__name__)

CHECKPOINT_REQUESTED = "CheckpointRequested"
"""Reason of the Normal Event posted with each request."""


def request_value(ask: notices.CheckpointAsk, now: float) -> str:
    """The annotation's value: when and why, one line (a new value is a new request for rank 0).

    Args:
        ask (notices.CheckpointAsk): The PolicyGroup and its node's notice.
        now (float): Unix seconds.

    Returns:
        str: For example `2026-12-06T16:30:00Z node n1: Karpenter disrupts the node (taint karpenter.sh/disrupted)`.
    """
    stamp = datetime.datetime.fromtimestamp(now, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    return f"{stamp} {ask.notice.detail}"


def request_checkpoint(
    client: kube.KubeClient, post_event: Callable[[Mapping[str, Any], str, str, str], None],
    ask: notices.CheckpointAsk, now: float,
) -> bool:
    """Annotate the PolicyGroup with a checkpoint request and post the Event (an API error is logged, not raised: the
    periodic checkpoint and the one on SIGTERM still come).

    Args:
        client (kube.KubeClient): The API.
        post_event (Callable): Posts an Event about an object (type, reason, message).
        ask (notices.CheckpointAsk): Whom to ask and why.
        now (float): Unix seconds.

    Returns:
        bool: Whether the annotation was written.
    """
    value = request_value(ask, now)
    patch = {"metadata": {"annotations": {contract.ANNOTATION_CHECKPOINT_REQUEST: value}}}
    try:
        group = client.patch(contract.KIND, ask.namespace, ask.group, patch)
    except kube.ApiError as error:
        logger.warning("%s/%s: cannot ask the trainers for a checkpoint (%s): %s", ask.namespace, ask.group,
                       ask.notice.detail, error)
        return False
    metrics.CHECKPOINT_ASKS.inc()
    message = f"asked trainer rank 0 for a checkpoint now: {ask.notice.detail}"
    logger.info("%s/%s: %s", ask.namespace, ask.group, message)
    post_event(group, "Normal", CHECKPOINT_REQUESTED, message[:1000])
    return True
