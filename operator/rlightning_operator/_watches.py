"""The operator's own watches of its pods, Jobs and StatefulSets: each event handed at once to one callback, in the
stream's own task.

kopf's handlers (`kopf.on.event`) run one queue and one worker task per object, and each queue holds whole parsed
bodies until its worker handles them. With thousands of pods starting at once, those queues held the largest share of
the operator's Python allocations; once pods had a watch of their own, the queues of the Jobs' and StatefulSets' status
events were the largest (14 MiB of 60 at the peak of 300 groups x 10, as tracemalloc counts them; docs/operator.md,
"At scale"). Here each event is parsed and handed on in the stream's task, so nothing is held per object: the callback
keeps what the reconciler needs (a trimmed pod, a child without its pod template).

The stream is kopf's (`kopf._cogs.clients.watching.infinite_watch`, on kopf's session and settings): a paged
listing (`settings.watching.chunk_size`), then a watch from the listing's `resourceVersion` that is resumed from the
last one seen when the server or client timeout ends it or its connection drops, and listed again on 410 Gone,
with `settings.watching.reconnect_backoff` between attempts; the label selector is
`settings.watching.label_selectors` of the resource. It runs inside kopf (`_handlers` starts the watches at the first
PolicyGroup event), so only the leader watches. An error that ends kopf's stream (a refusal, an unexpected error
event) starts it again, listing first, after `RETRY_SECONDS`.

A watch resumed from its `resourceVersion` misses nothing, but a new listing (after 410 Gone or a failed stream)
holds only the objects that exist: one deleted while the watch was down has no DELETED event. So each complete
listing (kopf's `Bookmark.LISTED` ends it) is handed on as the set of objects it held, and the reconciler takes every
object it kept that is not among them as deleted (`_handlers.pods_relisted`, `_handlers.children_relisted`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Sequence
from typing import Any, cast

import kopf
from kopf._cogs.clients import watching  # kopf exports no name for its watch stream
from kopf._cogs.structs import references

logger = logging.getLogger(__name__)

PODS = references.Resource(group="", version="v1", plural="pods", kind="Pod", namespaced=True)
JOBS = references.Resource(group="batch", version="v1", plural="jobs", kind="Job", namespaced=True)
STATEFULSETS = references.Resource(group="apps", version="v1", plural="statefulsets", kind="StatefulSet",
                                   namespaced=True)
RETRY_SECONDS = 5.0
"""Seconds before a stream that ended with an error is started again (kopf's own watchers would stop the operator)."""

ObjectHandler = Callable[[dict[str, Any], bool], None]
"""Called on the event loop with (the object as the API server sent it, whether it was deleted)."""
ListingHandler = Callable[[str | None, set[tuple[str, str]]], None]
"""Called on the event loop once a listing is complete, with the namespace watched (None: every namespace) and the
(namespace, name) of every object it held (each also handed to the `ObjectHandler` before)."""


async def watch(
    settings: kopf.OperatorSettings,
    resource: references.Resource,
    namespaces: Sequence[str] | None,
    handle: ObjectHandler,
    listed: ListingHandler,
) -> None:
    """Watch the objects of `resource` in `namespaces` (None: every namespace) until cancelled, handing each event to
    `handle` and each complete listing to `listed`.

    Listed objects (at start, after 410 Gone, after a failed stream) come to `handle` as not deleted, like ADDED
    ones; then `listed` gets them all, so that an object deleted while the watch was down can be told by its absence.

    Args:
        settings (kopf.OperatorSettings): kopf's settings (timeouts, page size, label selectors).
        resource (references.Resource): What to watch (`PODS`, `JOBS`, `STATEFULSETS`).
        namespaces (Sequence[str] | None): Namespaces to watch, one stream each; None for one cluster-wide stream.
        handle (ObjectHandler): Takes each object; an exception it raises is logged and the stream goes on.
        listed (ListingHandler): Takes each complete listing; an exception it raises is logged and the stream goes
            on.
    """
    scopes: list[str | None] = [*namespaces] if namespaces is not None else [None]
    await asyncio.gather(*(_watch(settings, resource, namespace, handle, listed) for namespace in scopes))


async def _watch(
    settings: kopf.OperatorSettings,
    resource: references.Resource,
    namespace: str | None,
    handle: ObjectHandler,
    listed: ListingHandler,
) -> None:
    where = f"{resource.plural} in " + (f"namespace {namespace}" if namespace else "every namespace")
    scope = references.NamespaceName(namespace) if namespace else None
    while True:
        logger.info("watching %s", where)
        # the objects of the listing under way; one cut short leaves extra names, which only hide a deletion
        listing: set[tuple[str, str]] = set()
        try:
            async for event in watching.infinite_watch(settings=settings, resource=resource, namespace=scope):
                if event is watching.Bookmark.LISTED:
                    try:
                        listed(namespace, listing)
                    except Exception:
                        logger.exception("handling a listing of %s failed", where)
                    listing = set()
                    continue
                if isinstance(event, watching.Bookmark) or event.get("type") == "BOOKMARK":
                    continue
                try:
                    obj = cast(dict[str, Any], event["object"])  # kopf's RawBody: the parsed JSON object
                    if event.get("type") is None:  # kopf's mark of a listed object
                        metadata = obj.get("metadata") or {}
                        listing.add((metadata.get("namespace", ""), metadata.get("name", "")))
                    handle(obj, event.get("type") == "DELETED")
                except Exception:  # one strange object must not cost a relisting of every object
                    logger.exception("handling an event of %s failed", where)
        except Exception:
            logger.exception("the watch of %s failed; watching again in %.0f s", where, RETRY_SECONDS)
        await asyncio.sleep(RETRY_SECONDS)
