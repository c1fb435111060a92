"""How bytes move: one broadcast group (rank 0 = sender) over its own PrefixStore, gloo or NCCL.

A group is a bare `ProcessGroupGloo` (or `ProcessGroupNCCL`, see `_nccl`) built on a `PrefixStore` of the
weight-sync store, never the default (DDP) process group, so it works inside torchrun ranks and in plain
processes alike (the facts checked are in docs/weight-sync.md).
"""

from __future__ import annotations

import datetime
import os
import socket
import time

import torch
import torch.distributed as dist

from rlightning.weights import _nccl

Backend = str
"""`gloo` or `nccl`."""

MAX_IN_FLIGHT = 16
"""Transfers a side keeps queued on its groups, so gloo's per-transfer latency hides behind the queue when many
large tensors go directly (packed transfers are further limited by the sender's two staging buffers)."""


GLOO_CONTEXTS = 2
"""Gloo contexts (each its own TCP connection per peer, see `ProcessGroupGloo._Options._devices`) per group;
torch spreads consecutive collectives over them round robin, so two bucket transfers move at once. On loopback
(2 shared cores, raw broadcasts of 400 MB in 64 MiB transfers) 1 context reached about 2.3 GB/s, 2 contexts
4.8 GB/s, 4 contexts 4.4-4.7 GB/s; in a whole publish (benchmarks/weight_sync.py, 100M parameters, 1 receiver,
quiet machine) the median went from 0.166 s (1) to 0.161 s (2) and 0.159 s (3), as packing then shares the CPU.
Sender and receivers must agree (both use this constant)."""


def header_tensor(seq: int, version: int, buckets: int, signature: str, device: torch.device) -> torch.Tensor:
    """The header broadcast before the buckets, so both sides agree before any bucket moves.

    Args:
        seq (int): the publish's sequence number.
        version (int): the weight version.
        buckets (int): number of buckets in the layout.
        signature (str): the layout's hex signature (its first 60 bits are sent).
        device (torch.device): where the group's tensors live.

    Returns:
        torch.Tensor: int64 `[4]` = (seq, version, buckets, signature prefix).
    """
    return torch.tensor([seq, version, buckets, int(signature[:15], 16)], dtype=torch.int64, device=device)


def resolve_backend(requested: str, peers_have_cuda: bool = True) -> Backend:
    """Pick the transport for a group.

    Args:
        requested (str): `WeightSyncConfig.backend`: `auto`, `gloo` or `nccl`.
        peers_have_cuda (bool, optional): whether every receiver of the group has CUDA. Defaults to True.

    Returns:
        str: `nccl` when requested, or when `auto` and this process and all peers have CUDA with NCCL;
        else `gloo`.

    Raises:
        RuntimeError: when `nccl` is requested but unavailable here.
    """
    if requested == "nccl":
        _nccl.require()
        return "nccl"
    if requested == "auto" and peers_have_cuda and _nccl.available():
        return "nccl"
    return "gloo"


def local_address_toward(host: str, port: int) -> str:
    """The local IP address this process uses to reach `host` (no packet is sent: a UDP connect only routes).

    Args:
        host (str): a peer's host name or address.
        port (int): a port on it.

    Returns:
        str: a local IP address, e.g. "127.0.0.1" toward localhost.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect((host, port))
        return s.getsockname()[0]


def _gloo_device(address: str) -> object:
    interface = os.environ.get("GLOO_SOCKET_IFNAME")  # the variable torch's own gloo groups honour
    if interface:
        return dist.ProcessGroupGloo.create_device(interface=interface.split(",")[0])
    return dist.ProcessGroupGloo.create_device(hostname=address)


class BroadcastGroup:
    """A broadcast group of `size` ranks: rank 0 is the sender, ranks 1.. are receivers.

    Construction is the rendezvous: it returns once all ranks joined, or raises after `timeout` seconds.

    Args:
        connection (dist.Store): a connection to the weight-sync store used by this group only (a TCPStore
            client holds its lock through a blocking get, so groups forming concurrently on one connection would
            wait for each other, and a dead member would stall every group), e.g. `_store.SpareConnections.take`.
        prefix (str): the group's key prefix (group and generation).
        rank (int): this process's rank in the group.
        size (int): number of ranks (receivers + 1).
        timeout (float): bound of the rendezvous and of every collective, seconds.
        backend (str): `gloo` or `nccl`.
        address (str): local IP address gloo binds to.

    Raises:
        RuntimeError: when the rendezvous fails or times out.
    """

    def __init__(
        self, connection: dist.Store, prefix: str, rank: int, size: int, timeout: float, backend: Backend, address: str
    ) -> None:
        self.rank, self.size, self.backend, self.timeout = rank, size, backend, timeout
        delta = datetime.timedelta(seconds=timeout)
        connection.set_timeout(delta)
        self._store: dist.Store | None = connection
        self._pg: dist.ProcessGroup | None
        prefixed = dist.PrefixStore(prefix, connection)
        if backend == "nccl":
            self.device = torch.device("cuda", torch.cuda.current_device())
            self._pg = _nccl.new_group(prefixed, rank, size, delta, self.device)
        else:
            self.device = torch.device("cpu")
            options = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # takes _devices; not in the stubs
            options._timeout = delta
            options._devices = [_gloo_device(address) for _ in range(GLOO_CONTEXTS)]
            # a Backend, used through the collectives ProcessGroup declares (the Backend stub omits them)
            self._pg = dist.ProcessGroupGloo(prefixed, rank, size, options)  # type: ignore[assignment]

    def broadcast(self, tensor: torch.Tensor, root: int = 0) -> dist.Work:
        """Start broadcasting `tensor` from rank `root` (sent from it, received in place elsewhere).

        Args:
            tensor (torch.Tensor): contiguous, on `self.device`; gloo gets a byte view so every dtype travels.
            root (int, optional): the sending rank; a relay edge's child (rank 1) sends its confirmation up
                (`_relay.Forwarder.finish`). Defaults to 0.

        Returns:
            dist.Work: wait on it with `wait_work`.
        """
        if self.backend == "gloo":
            tensor = tensor.view(-1).view(torch.uint8)
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        opts.rootTensor = 0
        opts.timeout = datetime.timedelta(seconds=self.timeout)
        if self._pg is None:
            raise RuntimeError("broadcast on a closed group")
        return self._pg.broadcast([tensor], opts)

    def wait_work(self, work: dist.Work, deadline: float | None = None) -> None:
        """Wait for `work` to finish, at most until `deadline`.

        Args:
            work (dist.Work): from `broadcast`.
            deadline (float | None, optional): `time.monotonic()` bound; None waits up to the group's timeout
                from now. A deadline lets a caller wait on works of several groups issued together without
                adding their timeouts up. Defaults to None.

        Raises:
            RuntimeError: when the collective failed (peer gone) or timed out.
        """
        left = self.timeout if deadline is None else deadline - time.monotonic()
        if left > 0:
            work.wait(datetime.timedelta(seconds=left))
        elif not work.is_completed():
            raise RuntimeError("broadcast timed out")
        else:
            work.wait()
        if self.backend == "nccl":
            torch.cuda.current_stream(self.device).synchronize()

    def close(self) -> None:
        """Release the group (aborts pending collectives where the backend supports it)."""
        pg, self._pg, self._store = self._pg, None, None
        if pg is not None:
            try:
                pg.abort()
            except (RuntimeError, AttributeError):
                pass
