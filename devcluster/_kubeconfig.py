"""Write kubeconfig files (the cluster CA and a bearer token or a client certificate): admin, ServiceAccounts, node."""

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


def write_client_certificate(
    path: pathlib.Path, server: str, ca_cert: pathlib.Path, user: str, cert: pathlib.Path, key: pathlib.Path
) -> pathlib.Path:
    """Write a single-context kubeconfig that authenticates with a client certificate (a node's identity).

    Args:
        path (pathlib.Path): File to write (mode 0600; parent folders are created).
        server (str): API server URL.
        ca_cert (pathlib.Path): PEM file of the CA that signed the serving certificate.
        user (str): Name of the user entry (the certificate's CN decides who the caller is).
        cert (pathlib.Path): Client certificate (PEM), referenced by path.
        key (pathlib.Path): Its private key (PEM), referenced by path.

    Returns:
        pathlib.Path: ``path``.
    """
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "devcluster", "cluster": {"server": server, "certificate-authority": str(ca_cert)}}],
        "users": [{"name": user, "user": {"client-certificate": str(cert), "client-key": str(key)}}],
        "contexts": [{"name": user, "context": {"cluster": "devcluster", "user": user}}],
        "current-context": user,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path
