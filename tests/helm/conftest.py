"""Fixtures of the chart tests: helm on the devcluster's helm binary, offline or acting on the dev cluster.

Every test here needs binaries that devcluster builds (helm; kubectl and the control plane for most), so all
are marked `cluster`.
"""

from __future__ import annotations

import pathlib

import pytest

import devcluster
from helm_chart import Helm


@pytest.fixture(scope="session")
def helm_binary() -> pathlib.Path:
    """The helm binary built by devcluster (built on first use, like the cluster's binaries)."""
    return devcluster.build().bin_dir / "helm"


@pytest.fixture(scope="session")
def offline_helm(helm_binary, tmp_path_factory) -> Helm:
    """helm for commands that need no cluster (lint, template)."""
    return Helm(helm_binary, tmp_path_factory.mktemp("helm-home"))


@pytest.fixture(scope="session")
def helm(cluster, tmp_path_factory) -> Helm:
    """helm acting as the dev cluster's admin."""
    return Helm(cluster.bin("helm"), tmp_path_factory.mktemp("helm-home"), cluster.kubeconfig)
