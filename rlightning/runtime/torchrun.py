"""`python -m rlightning.runtime.torchrun ARGS`: torchrun whose rendezvous store listens on one address only.

torchrun's static rendezvous (`--master-addr`/`--master-port`, one node or several) hosts a `TCPStore` on node
rank 0, and torch's store listens on every interface whatever `--master-addr` says. A local run
(`rlightning run`) keeps every port on loopback, so its launch plan starts torchrun through this module with
`ENV_BIND_HOST=127.0.0.1`: the store listens on a socket bound to that address (`master_listen_fd`, as the
weight-sync store does) and is otherwise torch's own. Without `ENV_BIND_HOST` this is torchrun unchanged. Pods run
`torch.distributed.run` itself (a pod's peers are other pods).
"""

from __future__ import annotations

import datetime
import os
import socket
import sys
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

from rlightning import contract

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
"""TCPStore's own default timeout, for callers that pass none."""


def store_on(bind_host: str) -> Any:
    """A `TCPStore` factory for torchrun's static rendezvous whose master listens on `bind_host` only.

    Args:
        bind_host (str): The address to listen on, for example 127.0.0.1.

    Returns:
        Any: A callable with `TCPStore`'s signature; clients (`is_master` false) are plain `TCPStore`s.
    """

    def make(
        host: str, port: int, world_size: int | None = None, is_master: bool = False,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT, **kwargs: Any,
    ) -> TCPStore:
        if not is_master:
            return TCPStore(host, port, world_size, is_master, timeout, **kwargs)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener does
        try:
            listener.bind((bind_host, port))
        except OSError:
            listener.close()
            raise
        return TCPStore(bind_host, port, world_size, is_master, timeout, master_listen_fd=listener.detach(), **kwargs)

    return make


def main() -> None:
    """Run torchrun (`torch.distributed.run.main`) with the rendezvous store bound to `ENV_BIND_HOST`."""
    bind_host = os.environ.get(contract.ENV_BIND_HOST)
    if bind_host:
        static_tcp_rendezvous.TCPStore = store_on(bind_host)  # type: ignore[misc]
    from torch.distributed.run import main as torchrun_main

    sys.argv[0] = "torchrun"
    torchrun_main()


if __name__ == "__main__":
    main()
