"""Keys, certificates and the static token file of a dev cluster, made with the ``openssl`` command.

Python's ``cryptography`` package is not a dependency of this project, and OpenSSL 1.1.1+ is on every Debian
machine, so the CLI is used. Everything is written into one folder that lives as long as the cluster.
"""

from __future__ import annotations

import dataclasses
import pathlib
import secrets
import shutil
import subprocess

SERVICE_CLUSTER_IP_RANGE = "10.96.0.0/16"
"""``--service-cluster-ip-range``; the first address is the ``kubernetes`` Service (in the serving cert)."""

KUBERNETES_SERVICE_IP = "10.96.0.1"
"""ClusterIP of ``default/kubernetes``, the first address of :data:`SERVICE_CLUSTER_IP_RANGE`."""

ADMIN_USER = "devcluster-admin"
"""User name of the static admin token; its group ``system:masters`` bypasses RBAC."""

KUBELET_CLIENT_USER = "kube-apiserver-kubelet-client"
"""CN of the API server's client certificate towards kubelets (group ``system:masters``: logs, exec)."""

FRONT_PROXY_USER = "front-proxy-client"
"""CN of the API server's client certificate towards aggregated API servers (``--proxy-client-cert-file``), the one
name ``--requestheader-allowed-names`` accepts: only it may assert a user through the X-Remote-* headers."""

FRONT_PROXY_GROUP = "rlightning:front-proxy"
"""Its O: a group with no RBAC binding, so the certificate grants nothing when shown to the API server itself."""

NODE_GROUP = "system:nodes"
"""Group of node identities (the Node authorizer and NodeRestriction act on it)."""

CERT_DAYS = 30
"""Validity of the generated certificates (days)."""


class PKIError(RuntimeError):
    """Raised when ``openssl`` is missing or fails."""


@dataclasses.dataclass(frozen=True)
class PKI:
    """Paths and secrets of one cluster's credentials.

    Attributes:
        ca_cert (pathlib.Path): Self-signed CA (PEM) that signed the API server's serving certificate.
        ca_key (pathlib.Path): Its private key (the controller-manager signs CSRs with it).
        serving_cert (pathlib.Path): API server serving certificate for 127.0.0.1/localhost/kubernetes.default.
        serving_key (pathlib.Path): Its private key.
        sa_key (pathlib.Path): ECDSA P-256 key signing ServiceAccount tokens (ES256; apiserver and
            controller-manager).
        sa_pub (pathlib.Path): Its public key (``--service-account-key-file``).
        token_file (pathlib.Path): ``--token-auth-file`` CSV with the admin token.
        admin_token (str): Bearer token of :data:`ADMIN_USER`.
        kubelet_client_cert (pathlib.Path): The API server's client certificate for kubelets
            (:data:`KUBELET_CLIENT_USER`, ``--kubelet-client-certificate``).
        kubelet_client_key (pathlib.Path): Its private key.
        proxy_client_cert (pathlib.Path): The API server's client certificate towards aggregated API servers
            (:data:`FRONT_PROXY_USER`), signed by the same CA, which is also ``--requestheader-client-ca-file``.
        proxy_client_key (pathlib.Path): Its private key.
    """

    ca_cert: pathlib.Path
    ca_key: pathlib.Path
    serving_cert: pathlib.Path
    serving_key: pathlib.Path
    sa_key: pathlib.Path
    sa_pub: pathlib.Path
    token_file: pathlib.Path
    admin_token: str
    kubelet_client_cert: pathlib.Path
    kubelet_client_key: pathlib.Path
    proxy_client_cert: pathlib.Path
    proxy_client_key: pathlib.Path


def _openssl(*args: str, cwd: pathlib.Path) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise PKIError("`openssl` not found on PATH: install it (Debian: apt-get install openssl)")
    proc = subprocess.run([openssl, *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise PKIError(f"openssl {' '.join(args[:2])} failed (exit {proc.returncode}): {proc.stderr.strip()}")


def _make_ca(folder: pathlib.Path, common_name: str) -> None:
    """Write a self-signed P-256 CA (``ca.key``, ``ca.crt``, valid :data:`CERT_DAYS` days) into ``folder``."""
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "ca.key", cwd=folder)
    _openssl(
        "req", "-x509", "-new", "-key", "ca.key", "-subj", f"/CN={common_name}", "-days", str(CERT_DAYS),
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-out", "ca.crt", cwd=folder,
    )


def generate(folder: pathlib.Path) -> PKI:
    """Create a CA, the API server's serving certificate, the ServiceAccount key pair and the admin token.

    Args:
        folder (pathlib.Path): Empty or new folder; files are written with mode 0600 (keys) or 0644.

    Returns:
        PKI: The created paths and the admin token.

    Raises:
        PKIError: When ``openssl`` is missing or fails.
    """
    folder.mkdir(parents=True, exist_ok=True)
    days = str(CERT_DAYS)
    _make_ca(folder, "rlightning-devcluster-ca")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "apiserver.key", cwd=folder)
    _openssl("req", "-new", "-key", "apiserver.key", "-subj", "/CN=kube-apiserver", "-out", "apiserver.csr", cwd=folder)
    sans = ",".join(
        [
            "IP:127.0.0.1",
            "DNS:localhost",
            f"IP:{KUBERNETES_SERVICE_IP}",
            "DNS:kubernetes",
            "DNS:kubernetes.default",
            "DNS:kubernetes.default.svc",
            "DNS:kubernetes.default.svc.cluster.local",
        ]
    )
    (folder / "apiserver.ext").write_text(
        f"subjectAltName={sans}\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "apiserver.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", days, "-extfile", "apiserver.ext", "-out", "apiserver.crt", cwd=folder,
    )
    client_certificate(folder, "kubelet-client", KUBELET_CLIENT_USER, "system:masters")
    client_certificate(folder, "front-proxy-client", FRONT_PROXY_USER, FRONT_PROXY_GROUP)
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "sa.key", cwd=folder)
    _openssl("pkey", "-in", "sa.key", "-pubout", "-out", "sa.pub", cwd=folder)
    token = secrets.token_hex(24)
    token_file = folder / "tokens.csv"
    # Format (kube-apiserver --token-auth-file): token,user,uid,"group1,group2"
    token_file.write_text(f'{token},{ADMIN_USER},{ADMIN_USER},"system:masters"\n')
    for key in ("ca.key", "apiserver.key", "sa.key", "tokens.csv", "kubelet-client.key"):
        (folder / key).chmod(0o600)
    return PKI(
        ca_cert=folder / "ca.crt",
        ca_key=folder / "ca.key",
        serving_cert=folder / "apiserver.crt",
        serving_key=folder / "apiserver.key",
        sa_key=folder / "sa.key",
        sa_pub=folder / "sa.pub",
        token_file=token_file,
        admin_token=token,
        kubelet_client_cert=folder / "kubelet-client.crt",
        kubelet_client_key=folder / "kubelet-client.key",
        proxy_client_cert=folder / "front-proxy-client.crt",
        proxy_client_key=folder / "front-proxy-client.key",
    )


def client_certificate(folder: pathlib.Path, name: str, user: str, group: str) -> tuple[pathlib.Path, pathlib.Path]:
    """Issue a client certificate (CN ``user``, O ``group``) signed by the CA in ``folder``.

    Args:
        folder (pathlib.Path): The folder of :func:`generate` (holding ``ca.crt`` and ``ca.key``).
        name (str): File stem: ``<name>.crt`` and ``<name>.key`` (mode 0600) are written there.
        user (str): User name the API server (or a kubelet) sees.
        group (str): Group, e.g. ``system:masters`` or :data:`NODE_GROUP`.

    Returns:
        tuple[pathlib.Path, pathlib.Path]: Certificate and key paths.

    Raises:
        PKIError: When ``openssl`` is missing or fails.
    """
    key, csr, cert, ext = (f"{name}.{suffix}" for suffix in ("key", "csr", "crt", "ext"))
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", key, cwd=folder)
    _openssl("req", "-new", "-key", key, "-subj", f"/O={group}/CN={user}", "-out", csr, cwd=folder)
    (folder / ext).write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", csr, "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", str(CERT_DAYS), "-extfile", ext, "-out", cert, cwd=folder,
    )
    (folder / key).chmod(0o600)
    return folder / cert, folder / key


def mutual_tls(folder: pathlib.Path, name: str) -> pathlib.Path:
    """Create a CA of its own and one certificate it signed, usable as both server and client (mutual TLS).

    For two host processes that authenticate each other with one shared certificate on loopback (KEDA's operator
    and adapter read ``ca.crt``, ``tls.crt`` and ``tls.key`` from one folder). The CA is not the cluster's: a
    client certificate signed by the cluster CA would also log in to the API server.

    Args:
        folder (pathlib.Path): Folder to create (or reuse); ``ca.crt``, ``ca.key``, ``tls.crt`` and ``tls.key``
            (keys mode 0600) are written there, valid :data:`CERT_DAYS` days.
        name (str): Common name of the CA (``<name>-ca``) and of the certificate; its SANs are ``127.0.0.1``
            and ``localhost``.

    Returns:
        pathlib.Path: ``folder``.

    Raises:
        PKIError: When ``openssl`` is missing or fails.
    """
    folder.mkdir(parents=True, exist_ok=True)
    days = str(CERT_DAYS)
    _make_ca(folder, f"{name}-ca")
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", "tls.key", cwd=folder)
    _openssl("req", "-new", "-key", "tls.key", "-subj", f"/CN={name}", "-out", "tls.csr", cwd=folder)
    (folder / "tls.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
        "keyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    _openssl(
        "x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", days, "-extfile", "tls.ext", "-out", "tls.crt", cwd=folder,
    )
    for key in ("ca.key", "tls.key"):
        (folder / key).chmod(0o600)
    return folder
