"""One INFO line for each watch stream that is lost, reconnects or lists again, with how long it was down: kopf's of
PolicyGroups and the operator's own of pods, Jobs and StatefulSets (`_watches`) alike.

kopf's streams (`kopf._cogs.clients.watching`) retry a failed request inside the request itself (logging each attempt
as an error with the whole URL, never that one succeeded) and resume or list again with no message at all, so their
log cannot tell whether or when a watch came back. Every request of kopf's goes through the operator's aiohttp
session (`_handlers.login`), whose request tracing (`aiohttp.TraceConfig`) sees each watch request (a GET with
``watch=true``) and each listing (a GET of the same path without it) answer or fail: a stream is down from the first
request of it that fails (kopf asks again at once when a stream breaks, so that is when it broke) until a request of
it is answered again.
"""

from __future__ import annotations

import logging
import time
from types import SimpleNamespace
from typing import Any

import aiohttp
import yarl

logger = logging.getLogger(__name__)


def describe(url: yarl.URL) -> str:
    """What a watch or list URL of the API covers, as in "pods in namespace ns" or "nodes in the cluster".

    Args:
        url (yarl.URL): A collection's URL (``/api/v1/namespaces/ns/pods``, ``/apis/group/version/plural``).

    Returns:
        str: The resource's plural and its scope.
    """
    parts = [part for part in url.path.split("/") if part]
    plural = parts[-1] if parts else url.path
    if "namespaces" in parts[:-1]:
        return f"{plural} in namespace {parts[parts.index('namespaces') + 1]}"
    return f"{plural} in the cluster"


class StreamLog:
    """The state of each watch stream (by collection path) as the session's requests show it; `trace_config` hooks it
    into an aiohttp session.

    Args:
        clock (Any, optional): ``time.monotonic``-like; for tests. Defaults to `time.monotonic`.
    """

    def __init__(self, clock: Any = time.monotonic) -> None:
        self._clock = clock
        self._down_since: dict[str, float] = {}  # path -> clock() of its first failed request since it answered
        self._listed: set[str] = set()  # paths listed at least once

    def trace_config(self) -> aiohttp.TraceConfig:
        """Request tracing for the session kopf's watches run on.

        Returns:
            aiohttp.TraceConfig: Calls `answered` and `failed` for GET requests of collections.
        """
        trace = aiohttp.TraceConfig()

        async def on_end(_session: aiohttp.ClientSession, _context: SimpleNamespace,
                         params: aiohttp.TraceRequestEndParams) -> None:
            if params.method == "GET":
                if params.response.status < 400:
                    self.answered(params.url)
                else:
                    self.failed(params.url, f"HTTP {params.response.status}")

        async def on_exception(_session: aiohttp.ClientSession, _context: SimpleNamespace,
                               params: aiohttp.TraceRequestExceptionParams) -> None:
            if params.method == "GET":
                self.failed(params.url, f"{type(params.exception).__name__}: {params.exception}")

        trace.on_request_end.append(on_end)
        trace.on_request_exception.append(on_exception)
        return trace

    def failed(self, url: yarl.URL, reason: str) -> None:
        """A watch or list request failed: the stream is down from now, unless it already was.

        Args:
            url (yarl.URL): The request's URL.
            reason (str): What failed (an HTTP status, an exception), for the log.
        """
        if not _is_stream(url) or url.path in self._down_since:
            return
        self._down_since[url.path] = self._clock()
        logger.info("watch of %s lost: %s", describe(url), reason)

    def answered(self, url: yarl.URL) -> None:
        """A watch or list request was answered: log a watch that reconnects after being down, and every listing
        after the first.

        Args:
            url (yarl.URL): The request's URL.
        """
        if not _is_stream(url):
            return
        since = self._down_since.pop(url.path, None)
        down = "" if since is None else f" after {self._clock() - since:.1f} s down"
        if url.query.get("watch") == "true":
            if since is not None:
                logger.info("watch of %s reconnected%s", describe(url), down)
            return
        if url.query.get("continue"):  # a later page of a listing under way
            return
        if url.path in self._listed:
            logger.info("watch of %s listing again%s", describe(url), down)
        self._listed.add(url.path)


def _is_stream(url: yarl.URL) -> bool:
    """Whether `url` is a watch request or a listing (kopf pages its listings, `settings.watching.chunk_size`: each
    has a ``limit``).
    """
    return url.query.get("watch") == "true" or "limit" in url.query
