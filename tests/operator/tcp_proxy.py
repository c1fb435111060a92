"""A TCP proxy of the tests' own between the operator and the API server, which can go silent on command.

`freeze_open()` stops forwarding on the connections open now, in both directions, without closing them: bytes
are read and dropped, a close is not passed on, as when a NAT or firewall drops a connection without a reset.
New connections still pass. `blackhole()` does the same to every connection, open or new (new ones are accepted
and then hear nothing); `restore()` lets new connections pass again (frozen ones stay frozen).

It listens on 127.0.0.1 port 0 (the OS picks a port and the proxy keeps it: no bind-and-release), so it needs
no entry in tests/_ports.py.
"""

from __future__ import annotations

import pathlib
import socket
import threading
import urllib.parse

import yaml

BUFFER_BYTES = 65536


class _Connection:
    def __init__(self, client: socket.socket, upstream: socket.socket | None, frozen: bool) -> None:
        self.client, self.upstream, self.frozen = client, upstream, frozen


class SilencingProxy:
    """Forwards 127.0.0.1:`port` to `target` (see the module docstring).

    Args:
        target (tuple[str, int]): (host, port) of the API server.
    """

    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._connections: list[_Connection] = []
        self._blackhole = False
        self._closed = False
        threading.Thread(target=self._accept, name="proxy-accept", daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return  # closed
            with self._lock:
                frozen = self._blackhole
            upstream = None if frozen else socket.create_connection(self.target, timeout=10)
            if upstream is not None:
                upstream.settimeout(None)
            connection = _Connection(client, upstream, frozen)
            with self._lock:
                self._connections.append(connection)
            threading.Thread(target=self._pump, args=(connection, True), daemon=True).start()
            if upstream is not None:
                threading.Thread(target=self._pump, args=(connection, False), daemon=True).start()

    def _pump(self, connection: _Connection, to_server: bool) -> None:
        source = connection.client if to_server else connection.upstream
        destination = connection.upstream if to_server else connection.client
        while True:
            try:
                data = source.recv(BUFFER_BYTES)
            except OSError:
                data = b""
            if connection.frozen:
                if not data:
                    return  # a close is not passed on: the other side stays open and silent
                continue  # swallowed
            if not data:
                for sock in (connection.client, connection.upstream):
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
                return
            try:
                destination.sendall(data)
            except OSError:
                return

    def freeze_open(self) -> int:
        """Stop forwarding on every connection open now; returns how many."""
        with self._lock:
            for connection in self._connections:
                connection.frozen = True
            return len(self._connections)

    def blackhole(self) -> None:
        """Stop forwarding on every connection, open now or made later."""
        with self._lock:
            self._blackhole = True
        self.freeze_open()

    def restore(self) -> None:
        """Forward new connections again."""
        with self._lock:
            self._blackhole = False

    def close(self) -> None:
        """Close the listener and every connection."""
        self._closed = True
        self._listener.close()
        with self._lock:
            for connection in self._connections:
                for sock in (connection.client, connection.upstream):
                    if sock is not None:
                        sock.close()

    def kubeconfig(self, original: pathlib.Path, path: pathlib.Path) -> pathlib.Path:
        """A copy of `original` whose server is this proxy (the API server's certificate is for 127.0.0.1, so
        TLS verification still passes)."""
        config = yaml.safe_load(original.read_text())
        for cluster in config["clusters"]:
            server = urllib.parse.urlsplit(cluster["cluster"]["server"])
            cluster["cluster"]["server"] = server._replace(netloc=f"127.0.0.1:{self.port}").geturl()
        path.write_text(yaml.safe_dump(config))
        return path

    @staticmethod
    def target_of(kubeconfig: pathlib.Path) -> tuple[str, int]:
        """(host, port) of the first cluster's server in `kubeconfig`."""
        server = urllib.parse.urlsplit(yaml.safe_load(kubeconfig.read_text())["clusters"][0]["cluster"]["server"])
        return server.hostname or "127.0.0.1", server.port or 443
