"""Write kubeconfig files (a bearer token and the cluster CA) for the admin and for ServiceAccounts."""

from __future__ import annotations

import base64
import pathlib

import yaml


def write(
    path: pathlib.Path, server: str, ca_cert: pathlib.Path, user: str, token: str, namespace: str = "default"
) -> pathlib.Path:
    """Write a single-context kubeconfig that authenticates with a bearer token.

    Args:
        path (pathlib.Path): File to write (mode 0600; parent folders are created).
        server (str): API server URL, e.g. ``"https://127.0.0.1:28702"``.
        ca_cert (pathlib.Path): PEM file of the CA that signed the serving certificate (embedded as data).
        user (str): Name of the user entry (informational; the token decides who the caller is).
        token (str): Bearer token.
        namespace (str, optional): Default namespace of the context. Defaults to ``"default"``.

    Returns:
        pathlib.Path: ``path``.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "devcluster",
                "cluster": {
                    "server": server,
                    "certificate-authority-data": base64.b64encode(ca_cert.read_bytes()).decode(),
                },
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [{"name": user, "context": {"cluster": "devcluster", "user": user, "namespace": namespace}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
