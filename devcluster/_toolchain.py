"""Locate the Go toolchain and describe the environment every ``go`` invocation runs with."""

from __future__ import annotations

import os
import shutil

KUBERNETES_COMMANDS = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubectl", "kubelet")
"""Commands built from k8s.io/kubernetes/cmd/ (the kubelet only runs on the optional real node)."""


class ToolchainError(RuntimeError):
    """Raised when no usable Go toolchain is found."""


def go_binary() -> str:
    """Return the path of the ``go`` command.

    Returns:
        str: ``$GO`` when set, else ``go`` on PATH, else ``/usr/local/go/bin/go``.

    Raises:
        ToolchainError: When none of them exists.
    """
    for candidate in (os.environ.get("GO"), shutil.which("go"), "/usr/local/go/bin/go"):
        if candidate and os.path.exists(candidate) and os.access(candidate, os.X_OK):
            return candidate
    raise ToolchainError(
        "no Go toolchain: set GO=/path/to/go or put `go` (1.26.4 or newer: Karpenter's minimum) on PATH"
    )


def go_env() -> dict[str, str]:
    """Return the environment for ``go`` commands: static binaries, no toolchain download, no VCS stamping.

    ``CGO_ENABLED=0`` matches how upstream ships the Kubernetes binaries; ``GOTOOLCHAIN=local`` makes a go.mod
    that needs a newer Go fail with a clear message instead of downloading one. ``GOSUMDB`` and ``GOPROXY``
    are left to the caller's environment (set ``GOSUMDB=off`` where the checksum database is unreachable;
    the committed go.sum files still pin every hash).

    Returns:
        dict[str, str]: A copy of ``os.environ`` with those settings.
    """
    env = dict(os.environ)
    env["CGO_ENABLED"] = "0"
    env.setdefault("GOTOOLCHAIN", "local")
    env["GOFLAGS"] = (env.get("GOFLAGS", "") + " -buildvcs=false").strip()
    return env
