"""Capped links on one machine: a network namespace per node, veth pairs to one bridge, tbf on both ends.

What a cluster's pod network looks like to weight sync, where each pod sits behind one capped link: node ``i``
(0 the sender, 1.. the receivers) gets the namespace ``<prefix>-n<i>`` with one interface ``eth0`` at
:meth:`CappedNetwork.address` ``(i)``; its veth peer ``v<i>`` is a port of the bridge ``br0`` in the switch
namespace ``<prefix>-sw``. A tbf qdisc on ``eth0`` caps what the node sends, one on ``v<i>`` what it receives, both
at the same rate (what the CNI ``bandwidth`` plugin does with a pod's ``kubernetes.io/egress-bandwidth`` and
``ingress-bandwidth``, also with tbf). The kernel here has tbf and htb but no netem, so links add no delay.

Nothing is made in the host's namespace: the bridge, the veths and every address live in the run's own namespaces,
so the subnet (:data:`SUBNET`) can neither clash with the host's routes (the real node's bridge ``rlnode0`` is
10.89.0.0/24 and its cluster's pod CIDR 10.244.0.0/16, devcluster/_nodeconfig.py and _components.py) nor with
another run's, and deleting the namespaces deletes every link and qdisc with them. The one host setting touched is
the list of TCP congestion controls a namespace may select, where the one asked for is missing from it
(:func:`allow_congestion_control`). Namespace names are global:
the prefix carries the devcluster slot and the pid (:func:`default_prefix`), so parallel runs never collide.
:meth:`CappedNetwork.close` deletes them (idempotent); a run killed with SIGKILL leaves them, listed by
:func:`leftovers` and deleted with ``ip netns del NAME``.

Used by ``benchmarks/weight_sync.py --link-rate`` and tests/weights/test_weight_capped.py. Needs root, ``ip`` and
``tc`` (:func:`missing_requirements`).
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence

from devcluster import _ports as devcluster_ports

SUBNET = "10.210.0"
"""First three octets of the nodes' /24: node ``i`` is ``SUBNET.(i + 1)``. Only inside the run's namespaces."""

MAX_NODES = 250
"""Most nodes of one network (the /24, less the network and broadcast addresses and some room)."""

TBF_LATENCY_MS = 20
"""Longest a packet may wait in a tbf queue before it is dropped (sets the queue's length)."""

_RATE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(bit|kbit|mbit|gbit)?\s*$", re.IGNORECASE)
_SCALE = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9}


def parse_rate(text: str) -> int:
    """A link rate in tc's notation (``200mbit``, ``1gbit``, ``500kbit``, or bits per second) in bit/s.

    Args:
        text (str): The rate.

    Returns:
        int: Bits per second (> 0).

    Raises:
        ValueError: On anything else, or a rate under 100 kbit/s.

    Examples:
        >>> parse_rate("200mbit"), parse_rate("1.5gbit")
        (200000000, 1500000000)
    """
    found = _RATE.match(text)
    if found is None:
        raise ValueError(f"link rate {text!r}: expected a number with bit, kbit, mbit or gbit (tc's units)")
    bps = int(float(found.group(1)) * _SCALE[(found.group(2) or "bit").lower()])
    if bps < 100_000:
        raise ValueError(f"link rate {text!r}: at least 100kbit")
    return bps


def missing_requirements() -> str | None:
    """Why capped networks cannot be made here (not root, no ``ip`` or ``tc``), or None when they can."""
    if os.geteuid() != 0:
        return "capped links need root (network namespaces, veth pairs and tc qdiscs)"
    missing = [tool for tool in ("ip", "tc") if shutil.which(tool) is None]
    if missing:
        return f"capped links need {' and '.join(missing)} (iproute2) on PATH"
    return None


ALLOWED_CONGESTION_CONTROL = "/proc/sys/net/ipv4/tcp_allowed_congestion_control"


def allow_congestion_control(name: str) -> None:
    """Let network namespaces select TCP congestion control `name`: add it to the host's
    `net.ipv4.tcp_allowed_congestion_control` when it is not there (needs root).

    A namespace other than the host's may only make an allowed algorithm its default (Linux
    `tcp_set_default_congestion_control`: EPERM otherwise, which `echo` reports as an I/O error); a host whose
    default is bbr allows "reno bbr", so cubic, though available, is refused there. Adding it only lets programs
    choose it; nothing changes algorithm.

    Args:
        name (str): One of `/proc/sys/net/ipv4/tcp_available_congestion_control`.
    """
    sysctl = pathlib.Path(ALLOWED_CONGESTION_CONTROL)
    allowed = sysctl.read_text(encoding="ascii").split()
    if name not in allowed:
        sysctl.write_text(" ".join([*allowed, name]), encoding="ascii")


def default_prefix() -> str:
    """Namespace name prefix of this process: ``rlw<slot>p<pid>`` (devcluster slot, pid), unique per run."""
    return f"rlw{devcluster_ports.slot_from_env()}p{os.getpid()}"


def namespaces() -> list[str]:
    """Names of every named network namespace on the machine (``ip netns list``)."""
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def leftovers(prefix: str) -> list[str]:
    """Namespaces whose name starts with ``prefix + "-"``: what a run of that prefix left (none once closed)."""
    return [name for name in namespaces() if name.startswith(prefix + "-")]


def tbf_burst_bytes(rate_bps: int) -> int:
    """tbf's bucket: 1 ms of the rate, at least 16 KiB (a few full-size packets; tbf splits larger GSO packets).

    Small, so that a transfer of 1 MiB is not sent faster than the rate at its start (notes: bursts of hundreds
    of KiB make short transfers look fast); the kernel's tbf times with high-resolution timers, so 1 ms suffices.
    """
    return max(rate_bps // 8 // 1000, 16 << 10)


class CappedNetwork:
    """``nodes`` network namespaces, each behind one link capped at ``rate_bps`` both ways, joined by a bridge.

    Args:
        nodes (int): How many nodes (namespaces with one address each), 1..:data:`MAX_NODES`.
        rate_bps (int): Each link's rate in bits per second, each way.
        prefix (str | None, optional): Namespace name prefix; None: :func:`default_prefix`. Defaults to None.
        congestion_control (str | None, optional): TCP congestion control of every node's namespace
            (``net.ipv4.tcp_congestion_control``, one of ``/proc/sys/net/ipv4/tcp_available_congestion_control``);
            None: what a new namespace inherits from the host. Defaults to None.

    Examples:
        >>> with CappedNetwork(3, parse_rate("200mbit")) as net:
        ...     subprocess.run(net.exec_argv(1, ["ping", "-c1", net.address(2)]), check=True)
    """

    def __init__(self, nodes: int, rate_bps: int, prefix: str | None = None,
                 congestion_control: str | None = None) -> None:
        if not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes must be 1..{MAX_NODES}, got {nodes}")
        self.nodes, self.rate_bps, self.congestion_control = nodes, rate_bps, congestion_control
        self.prefix = prefix or default_prefix()
        self.switch = f"{self.prefix}-sw"
        self._made: list[str] = []  # namespaces created, in order; deleted by close()

    def node(self, index: int) -> str:
        """Namespace name of node ``index``."""
        return f"{self.prefix}-n{index}"

    @staticmethod
    def address(index: int) -> str:
        """IPv4 address of node ``index`` (on its ``eth0``)."""
        return f"{SUBNET}.{index + 1}"

    def exec_argv(self, index: int, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` inside node ``index``'s namespace (``ip netns exec``)."""
        return ["ip", "netns", "exec", self.node(index), *argv]

    def _run(self, *argv: str) -> None:
        done = subprocess.run(list(argv), capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr.strip()}")

    def _add_namespace(self, name: str) -> None:
        self._run("ip", "netns", "add", name)
        self._made.append(name)

    def start(self) -> CappedNetwork:
        """Make the namespaces, links and qdiscs; on any failure delete what was made and raise.

        Returns:
            CappedNetwork: self.

        Raises:
            RuntimeError: When a command fails (its stderr in the message).
        """
        rate = f"{self.rate_bps}bit"
        burst = str(tbf_burst_bytes(self.rate_bps))
        tbf = ["root", "tbf", "rate", rate, "burst", burst, "latency", f"{TBF_LATENCY_MS}ms"]
        try:
            if self.congestion_control:
                allow_congestion_control(self.congestion_control)
            self._add_namespace(self.switch)
            self._run("ip", "-n", self.switch, "link", "add", "br0", "type", "bridge")
            self._run("ip", "-n", self.switch, "link", "set", "br0", "up")
            for i in range(self.nodes):
                node, port = self.node(i), f"v{i}"
                self._add_namespace(node)
                self._run("ip", "link", "add", "name", "eth0", "netns", node, "type", "veth",
                          "peer", "name", port, "netns", self.switch)
                self._run("ip", "-n", self.switch, "link", "set", port, "master", "br0", "up")
                self._run("ip", "-n", node, "addr", "add", f"{self.address(i)}/24", "dev", "eth0")
                self._run("ip", "-n", node, "link", "set", "eth0", "up")
                self._run("ip", "-n", node, "link", "set", "lo", "up")
                if self.congestion_control:  # /proc/sys/net is the reading process's namespace's; no procps needed
                    self._run(*self.exec_argv(i, ["sh", "-c", 'echo "$0" > /proc/sys/net/ipv4/tcp_congestion_control',
                                                  self.congestion_control]))
                self._run("tc", "-n", node, "qdisc", "add", "dev", "eth0", *tbf)  # what the node sends
                self._run("tc", "-n", self.switch, "qdisc", "add", "dev", port, *tbf)  # what it receives
        except BaseException:
            self.close()
            raise
        return self

    def pids(self) -> list[int]:
        """Processes running inside the namespaces made (``ip netns pids``): only what this run started there."""
        found = []
        for name in self._made:
            out = subprocess.run(["ip", "netns", "pids", name], capture_output=True, text=True).stdout
            found += [int(pid) for pid in out.split()]
        return found

    def close(self) -> list[str]:
        """Kill what still runs inside, then delete every namespace made (with its veths, bridge and qdiscs).

        Idempotent. A namespace lives on, unnamed and with its links, while a process holds it, so a process the
        caller lost track of (one started just as a signal arrived) is killed here; stop yours gracefully first.

        Returns:
            list[str]: Errors of deletions that failed (empty when all went).
        """
        errors = []
        deadline = time.monotonic() + 10
        while (left := self.pids()) and time.monotonic() < deadline:
            for pid in left:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)  # a killed process leaves the namespace once the kernel reaped it
        errors += [f"pid {pid} still runs in a namespace of {self.prefix}" for pid in self.pids()]
        while self._made:
            name = self._made.pop()
            done = subprocess.run(["ip", "netns", "del", name], capture_output=True, text=True)
            if done.returncode != 0 and name in namespaces():
                errors.append(f"ip netns del {name}: {done.stderr.strip()}")
        return errors

    def __enter__(self) -> CappedNetwork:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
