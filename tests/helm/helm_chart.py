"""Running helm on the chart and reading what it renders (imported by the chart tests and their fixtures)."""

from __future__ import annotations

import os
import pathlib
import subprocess

import pytest
import yaml

import devcluster

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "rlightning-operator"
RELEASE = "rlightning"
HELM_TIMEOUT_SECONDS = 180.0
"""Bound for one helm command (an install with --wait included)."""


class Helm:
    """Runs the devcluster's helm binary with its state (repositories, cache) in a private folder.

    Args:
        binary (pathlib.Path): The helm executable.
        home (pathlib.Path): Folder for HELM_CACHE_HOME, HELM_CONFIG_HOME and HELM_DATA_HOME.
        kubeconfig (pathlib.Path | None, optional): Cluster to act on; None for offline commands. Defaults to None.
    """

    def __init__(self, binary: pathlib.Path, home: pathlib.Path, kubeconfig: pathlib.Path | None = None) -> None:
        self.binary = binary
        self.env = {
            **os.environ,
            "HELM_CACHE_HOME": str(home / "cache"),
            "HELM_CONFIG_HOME": str(home / "config"),
            "HELM_DATA_HOME": str(home / "data"),
        }
        if kubeconfig is not None:
            self.env["KUBECONFIG"] = str(kubeconfig)

    def __call__(self, *args: str, check: bool = True) -> subprocess.CompletedProcess:
        """Run `helm *args`.

        Args:
            *args (str): helm arguments.
            check (bool, optional): Fail the test when helm exits non-zero. Defaults to True.

        Returns:
            subprocess.CompletedProcess: With text stdout and stderr.
        """
        proc = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            env=self.env,
            timeout=HELM_TIMEOUT_SECONDS,
        )
        if check and proc.returncode != 0:
            pytest.fail(f"helm {' '.join(args)} exited {proc.returncode}:\n{proc.stderr}")
        return proc

    def template(self, *args: str, namespace: str = "rlightning-system") -> str:
        """Render the chart offline for the dev cluster's Kubernetes version; return the YAML stream."""
        return self(
            "template", RELEASE, str(CHART), "--namespace", namespace, "--kube-version", devcluster.KUBERNETES, *args
        ).stdout


def documents(stream: str) -> list[dict]:
    """Parse a multi-document YAML stream, dropping empty documents."""
    return [doc for doc in yaml.safe_load_all(stream) if doc]


def by_kind(docs: list[dict], kind: str) -> list[dict]:
    """The documents of one kind."""
    return [doc for doc in docs if doc["kind"] == kind]
