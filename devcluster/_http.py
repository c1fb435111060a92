"""Minimal HTTPS/HTTP JSON requests for the launcher's readiness checks and node creation (stdlib only)."""

from __future__ import annotations

import json
import pathlib
import ssl
import urllib.error
import urllib.request

REQUEST_TIMEOUT_SECONDS = 5.0
"""Timeout of one request."""


class ApiServer:
    """Talk to the API server as the admin.

    Args:
        server (str): Base URL, e.g. ``"https://127.0.0.1:28702"``.
        ca_cert (pathlib.Path): CA that signed the serving certificate (verified).
        token (str): Admin bearer token.
    """

    def __init__(self, server: str, ca_cert: pathlib.Path, token: str) -> None:
        self._server = server.rstrip("/")
        self._context = ssl.create_default_context(cafile=str(ca_cert))
        self._token = token

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, str]:
        """Send one request.

        Args:
            method (str): HTTP method.
            path (str): Absolute API path, e.g. ``"/readyz"``.
            body (dict | None, optional): JSON body. Defaults to None.

        Returns:
            tuple[int, str]: Status code (0 when the server could not be reached) and response text.
        """
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self._server + path, data=data, method=method)
        req.add_header("Authorization", f"Bearer {self._token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=REQUEST_TIMEOUT_SECONDS, context=self._context) as resp:
                return resp.status, resp.read().decode()
        except urllib.error.HTTPError as exc:
            return exc.code, exc.read().decode(errors="replace")
        except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
            return 0, ""

    def get_json(self, path: str) -> dict | None:
        """GET a path and decode the JSON body; None unless the status is 200."""
        status, text = self.request("GET", path)
        return json.loads(text) if status == 200 else None


def healthy(url: str, verify: bool = True) -> bool:
    """Return True when ``url`` answers 200 (``/health`` of etcd, ``/healthz`` of a component).

    Args:
        url (str): Full URL.
        verify (bool, optional): Verify TLS; False for components serving self-signed certificates on
            loopback. Defaults to True.
    """
    context = None
    if url.startswith("https") and not verify:
        context = ssl.create_default_context()
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=REQUEST_TIMEOUT_SECONDS, context=context) as resp:
            return resp.status == 200
    except (urllib.error.URLError, ConnectionError, TimeoutError, ssl.SSLError):
        return False
