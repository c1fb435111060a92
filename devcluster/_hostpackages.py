"""Debian packages the real node needs, installed with apt-get when missing (as root).

containerd runs the pods' containers through runc; Debian's containernetworking-plugins give the bridge,
host-local and portmap CNI plugins; iptables adds the one NAT rule that lets pods reach the API server.
``socat``, ``conntrack`` and ``ethtool`` are not installed: ``kubectl exec``/``logs``/``port-forward`` are served
by containerd's CRI streaming server (its port-forward dials inside the pod's network namespace in Go; socat
was the dockershim's way), and conntrack/ethtool are kube-proxy's tools (no kube-proxy runs here).
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Callable

PACKAGES = ("containerd", "runc", "containernetworking-plugins", "iptables")
"""Debian package names (bookworm: containerd 1.6, runc 1.1, CNI plugins 1.1)."""

APT_TIMEOUT_SECONDS = 600.0
"""Bound for ``apt-get update`` plus ``apt-get install``."""


class PackageError(RuntimeError):
    """Raised when a package is missing and cannot be installed (not root, no apt-get, apt-get failed)."""


def missing(packages: tuple[str, ...] = PACKAGES) -> list[str]:
    """Return the packages dpkg does not list as installed.

    Args:
        packages (tuple[str, ...], optional): Debian package names. Defaults to :data:`PACKAGES`.

    Returns:
        list[str]: Names whose ``dpkg-query`` status is not ``install ok installed``, in the given order.
    """
    absent = []
    for name in packages:
        proc = subprocess.run(
            ["dpkg-query", "-W", "-f=${Status}", name], capture_output=True, text=True, check=False
        )
        if proc.stdout.strip() != "install ok installed":
            absent.append(name)
    return absent


def ensure(packages: tuple[str, ...] = PACKAGES, log: Callable[[str], None] = print) -> list[str]:
    """Install the missing packages with ``apt-get`` (no recommends, non-interactive); skip when all are present.

    Args:
        packages (tuple[str, ...], optional): Debian package names. Defaults to :data:`PACKAGES`.
        log (Callable[[str], None], optional): Progress sink. Defaults to ``print``.

    Returns:
        list[str]: The packages that were installed (empty when none was missing).

    Raises:
        PackageError: When some are missing and this process is not root, or apt-get fails (with its output).
    """
    absent = missing(packages)
    if not absent:
        return []
    if os.geteuid() != 0:
        raise PackageError(f"missing Debian packages {' '.join(absent)}: run as root or `apt-get install` them")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    log(f"devcluster: apt-get install {' '.join(absent)}")
    for argv in (
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", *absent],
    ):
        try:
            proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=APT_TIMEOUT_SECONDS)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise PackageError(f"{' '.join(argv[:2])} failed: {exc}") from exc
        if proc.returncode != 0:
            tail = (proc.stdout + proc.stderr)[-2000:]
            raise PackageError(f"{' '.join(argv[:2])} failed (exit {proc.returncode}):\n{tail}")
    return absent
