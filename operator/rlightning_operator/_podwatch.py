"""The operator's one watch of its pods: each event trimmed at once (`_pods.trim`) and handed to one callback.

kopf's `kopf.on.event` runs one queue and one worker task per object, and each queue holds whole parsed bodies until
its worker handles them: with thousands of pods starting at once, those queues held the largest share of the
operator's Python allocations (docs/operator.md, "At scale"). Here each event is parsed, trimmed to what the status
reads and handled in the stream's own task, so nothing is held per pod; the reconciler keeps what it needs per group.

The stream is kopf's (`kopf._cogs.clients.watching.infinite_watch`, on kopf's session and settings): a paged
listing (`settings.watching.chunk_size`), then a watch from the listing's `resourceVersion` that is resumed from the
last one seen when the server or client timeout ends it or its connection drops, and listed again on 410 Gone,
with `settings.watching.reconnect_backoff` between attempts; the label selector is
`settings.watching.label_selectors["v1", "pods"]`. It runs inside kopf (`_handlers` starts it at the first
PolicyGroup event), so only the leader watches. An error that ends kopf's stream (a refusal, an unexpected error
event) starts it again, listing first, after `RETRY_SECONDS`.

A watch resumed from its `resourceVersion` misses nothing, but a new listing (after 410 Gone or a failed stream)
holds only the pods that exist: one deleted while the watch was down has no DELETED event. So each complete listing
(kopf's `Bookmark.LISTED` ends it) is handed on as the set of pods it held, and the reconciler takes every pod it kept
that is not among them as deleted (`_handlers.pods_relisted`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any

import kopf
from kopf._cogs.clients import watching  # kopf exports no name for its watch stream
from kopf._cogs.structs import references

from rlightning_operator import _pods as pods

logger = logging.getLogger(__name__)

PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
RETRY_SECONDS = 5.0
"""Seconds before a stream that ended with an error is started again (kopf's own watchers would stop the operator)."""

PodHandler = Callable[[dict[str, Any], bool], None]
"""Called on the event loop with (the pod trimmed by `_pods.trim`, whether it was deleted)."""
ListingHandler = Callable[[str | None, set[tuple[str, str]]], None]
"""Called on the event loop once a listing is complete, with the namespace watched (None: every namespace) and the
(namespace, name) of every pod it held (each also handed to the `PodHandler` before)."""


async def watch_pods(
    settings: kopf.OperatorSettings, namespaces: Sequence[str] | None, handle: PodHandler, listed: ListingHandler
) -> None:
    """Watch the pods of `namespaces` (None: every namespace) until cancelled, handing each event to `handle` and each
    complete listing to `listed`.

    Listed pods (at start, after 410 Gone, after a failed stream) come to `handle` as not deleted, like ADDED ones;
    then `listed` gets them all, so that a pod deleted while the watch was down can be told by its absence.

    Args:
        settings (kopf.OperatorSettings): kopf's settings (timeouts, page size, label selectors).
        namespaces (Sequence[str] | None): Namespaces to watch, one stream each; None for one cluster-wide stream.
        handle (PodHandler): Takes each pod; an exception it raises is logged and the stream goes on.
        listed (ListingHandler): Takes each complete listing; an exception it raises is logged and the stream goes
            on.
    """
    scopes: list[str | None] = [*namespaces] if namespaces is not None else [None]
    await asyncio.gather(*(_watch(settings, namespace, handle, listed) for namespace in scopes))


async def _watch(
    settings: kopf.OperatorSettings, namespace: str | None, handle: PodHandler, listed: ListingHandler
) -> None:
    where = f"namespace {namespace}" if namespace else "every namespace"
    scope = references.NamespaceName(namespace) if namespace else None
    while True:
        logger.info("watching pods in %s", where)
        # the pods of the listing under way; one cut short leaves extra names, which only hide a deletion
        listing: set[tuple[str, str]] = set()
        try:
            async for event in watching.infinite_watch(settings=settings, resource=PODS, namespace=scope):
                if event is watching.Bookmark.LISTED:
                    try:
                        listed(namespace, listing)
                    except Exception:
                        logger.exception("handling a listing of the pods in %s failed", where)
                    listing = set()
                    continue
                if isinstance(event, watching.Bookmark) or event.get("type") == "BOOKMARK":
                    continue
                try:
                    pod = pods.trim(event["object"])
                    if event.get("type") is None:  # kopf's mark of a listed object
                        listing.add((pod["metadata"].get("namespace", ""), pod["metadata"].get("name", "")))
                    handle(pod, event.get("type") == "DELETED")
                except Exception:  # one strange pod must not cost a relisting of every pod
                    logger.exception("handling a pod event in %s failed", where)
        except Exception:
            logger.exception("the pod watch in %s failed; watching again in %.0f s", where, RETRY_SECONDS)
        await asyncio.sleep(RETRY_SECONDS)
