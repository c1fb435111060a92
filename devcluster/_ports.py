"""Fixed loopback ports of a dev cluster.

Every cluster uses a block of :data:`BLOCK_SIZE` ports starting at ``BASE_PORT + slot * BLOCK_SIZE`` on
127.0.0.1 (slot 0: 28700-28719, slot 1: 28720-28739, ...). The slot comes from ``RLIGHTNING_DEVCLUSTER_SLOT``
(default 0), so two clusters on one machine (a long-lived ``up`` and a test session) can coexist by choice. Ports
are never picked at random: a taken port is an error that names it.
"""

from __future__ import annotations

import dataclasses
import errno
import os
import socket

BASE_PORT = 28700
"""First port of slot 0; the whole range 28700-28899 lies below Linux's default ephemeral range (32768-60999,
``/proc/sys/net/ipv4/ip_local_port_range``), so an outgoing connection never takes one of these ports."""

BLOCK_SIZE = 20
"""Ports reserved per slot (15 used: the control plane's 6 and the add-ons' 9)."""

MAX_SLOT = 9
"""Highest slot (slot 9 ends at 28899)."""

HOST = "127.0.0.1"
"""Every component listens on loopback only."""


class PortInUseError(RuntimeError):
    """Raised when a port of the chosen block is already taken."""


@dataclasses.dataclass(frozen=True)
class Ports:
    """Ports of one cluster (all on :data:`HOST`).

    Attributes:
        etcd_client (int): etcd client URL (http).
        etcd_peer (int): etcd peer URL (http; single member).
        apiserver (int): kube-apiserver secure port (https).
        controller_manager (int): kube-controller-manager secure port (https, /healthz).
        scheduler (int): kube-scheduler secure port (https, /healthz).
        kwok (int): kwok's server (/healthz, metrics; the fake nodes' kubelet endpoint).
        metrics_server (int): metrics-server's secure port (https), when it is started (``MetricsServer``).
        karpenter_metrics (int): Karpenter's metrics endpoint (http), when it is started (``Karpenter``).
        karpenter_health (int): Karpenter's health probes (http ``/healthz``, ``/readyz``).
        keda_metrics_service (int): KEDA operator's gRPC metrics service (mutual TLS), which its adapter calls.
        keda_health (int): KEDA operator's health probes (http ``/healthz``, ``/readyz``).
        keda_adapter (int): KEDA's metrics API server (https, ``external.metrics.k8s.io``), when ``Keda`` runs.
        keda_adapter_metrics (int): KEDA adapter's own Prometheus endpoint (http; it always serves one).
        kueue_webhook (int): Kueue's admission and CRD conversion webhooks (https), when ``Kueue`` runs.
        kueue_health (int): Kueue's health probes (http ``/healthz``, ``/readyz``).
    """

    etcd_client: int
    etcd_peer: int
    apiserver: int
    controller_manager: int
    scheduler: int
    kwok: int
    metrics_server: int
    karpenter_metrics: int
    karpenter_health: int
    keda_metrics_service: int
    keda_health: int
    keda_adapter: int
    keda_adapter_metrics: int
    kueue_webhook: int
    kueue_health: int

    def named(self) -> dict[str, int]:
        """Return ``{field name: port}``."""
        return dataclasses.asdict(self)


def slot_from_env() -> int:
    """Return the slot in ``RLIGHTNING_DEVCLUSTER_SLOT`` (default 0).

    Raises:
        ValueError: When the value is not an integer in ``0..MAX_SLOT``.
    """
    raw = os.environ.get("RLIGHTNING_DEVCLUSTER_SLOT", "0")
    if not raw.isdigit() or int(raw) > MAX_SLOT:
        raise ValueError(f"RLIGHTNING_DEVCLUSTER_SLOT={raw!r}: must be an integer from 0 to {MAX_SLOT}")
    return int(raw)


def for_slot(slot: int) -> Ports:
    """Return the port block of a slot.

    Args:
        slot (int): 0..:data:`MAX_SLOT`.

    Returns:
        Ports: ``BASE_PORT + slot * BLOCK_SIZE`` plus fixed offsets 0..14.
    """
    base = BASE_PORT + slot * BLOCK_SIZE
    return Ports(*(base + offset for offset in range(len(dataclasses.fields(Ports)))))


def check_free(ports: Ports) -> None:
    """Fail when any port of the block is in use.

    A port counts as taken when binding it on :data:`HOST` with ``SO_REUSEADDR`` fails (the same option the Go
    servers set, so a port in TIME_WAIT from a previous cluster counts as free).

    Args:
        ports (Ports): The block to check.

    Raises:
        PortInUseError: Naming the first taken port and its role.
    """
    for name, port in ports.named().items():
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, port))
            except OSError as exc:
                if exc.errno != errno.EADDRINUSE:
                    raise
                raise PortInUseError(
                    f"port {HOST}:{port} ({name}) is already in use: stop the other cluster "
                    "(`python -m devcluster down`) or choose another block with RLIGHTNING_DEVCLUSTER_SLOT=1..9"
                ) from exc
