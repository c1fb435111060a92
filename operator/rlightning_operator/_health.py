"""The liveness endpoint `/healthz`: healthy while the API server answers, as a standby and as the leader.

It answers 200 while some request of the operator was answered within `api_silence_limit_seconds`, else 500,
so that the kubelet restarts an operator cut off from the API server (a watch on a connection dropped without a
reset would otherwise leave it idle with a healthy probe). `keep_hearing` makes sure there is a request to
answer: a `GET /version` whenever nothing else was answered for a heartbeat period. kopf's own watches are
bounded separately (`settings.watching` timeouts, set in `_handlers.configure`); a dead watch is abandoned and
made again within `watch_client_timeout_seconds`.

Served by the standard library's HTTP server in a thread, from process start, because a standby runs no kopf
(kopf's liveness endpoint lives inside the running operator).
"""

from __future__ import annotations

import asyncio
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from rlightning_operator import _kube as kube

logger = logging.getLogger(__name__)
PATH = "/healthz"


def health(silence_seconds: float, limit_seconds: float, role: str) -> tuple[bool, dict[str, Any]]:
    """Whether the operator is alive, and the body of the answer.

    Args:
        silence_seconds (float): Seconds since the API server last answered.
        limit_seconds (float): The most silence that is still healthy.
        role (str): "leader", "standby" or "single" (no leader election), for people reading the answer.

    Returns:
        tuple[bool, dict[str, Any]]: (healthy, JSON body with the silence, the limit and the role).
    """
    healthy = silence_seconds <= limit_seconds
    return healthy, {
        "healthy": healthy,
        "role": role,
        "apiSilenceSeconds": round(silence_seconds, 3),
        "apiSilenceLimitSeconds": limit_seconds,
    }


class HealthServer:
    """`GET /healthz` on 0.0.0.0:`port` (see the module docstring).

    Args:
        port (int): TCP port.
        client (kube.KubeClient): Whose `last_answer` tells when the API server last answered.
        limit_seconds (float): `api_silence_limit_seconds`.
        role (Callable[[], str]): The operator's current role.

    Raises:
        OSError: The port is taken (from the constructor).
    """

    def __init__(self, port: int, client: kube.KubeClient, limit_seconds: float, role: Callable[[], str]) -> None:
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?")[0] != PATH:
                    self.send_error(404)
                    return
                healthy, body = outer.check()
                data = json.dumps(body).encode()
                self.send_response(200 if healthy else 500)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the standard library's name)
                """Probes every few seconds are not worth a log line."""

        self._client, self._limit, self._role = client, limit_seconds, role
        self._server = http.server.ThreadingHTTPServer(("0.0.0.0", port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="healthz", daemon=True)

    def check(self) -> tuple[bool, dict[str, Any]]:
        """The answer `/healthz` gives now (see `health`)."""
        healthy, body = health(time.monotonic() - self._client.last_answer, self._limit, self._role())
        if not healthy:
            logger.error("unhealthy: the API server has not answered for %.0f s", body["apiSilenceSeconds"])
        return healthy, body

    def start(self) -> HealthServer:
        """Serve in a daemon thread."""
        self._thread.start()
        return self

    def close(self) -> None:
        """Stop serving."""
        self._server.shutdown()
        self._server.server_close()


async def keep_hearing(client: kube.KubeClient, period: float) -> None:
    """Ask the API server (`GET /version`, bounded by `period`) whenever it answered nothing for `period` s.

    Runs until cancelled; failures only leave `client.last_answer` where it was.

    Args:
        client (kube.KubeClient): The API.
        period (float): Seconds (`heartbeat_seconds`).
    """
    while True:
        wait = period - (time.monotonic() - client.last_answer)
        if wait > 0:
            await asyncio.sleep(wait)
            continue
        try:
            await asyncio.to_thread(client.ping, period)
        except kube.ApiError as error:
            logger.warning("the API server did not answer: %s", error)
            await asyncio.sleep(period)
