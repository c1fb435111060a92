"""Local container images of the real node, written as OCI layout tars with the standard library only.

Two images, both imported with ``ctr -n k8s.io images import`` so nothing is pulled from a registry:

- the sandbox (pause) image: one static C program that sleeps until SIGTERM/SIGINT and reaps children;
- the runtime image: a rootfs of empty folders, the merged-/usr symlinks, a minimal /etc and the virtualenv's
  console scripts (a few KiB, relocated to fixed paths); the containers see /usr, the Python install, the
  repository and its virtualenv through read-only binds of the base runtime spec (``_nodeconfig.base_runtime_spec``),
  so the multi-GB virtualenv is never copied. Like operator/Dockerfile's
  image it runs ``rlightning-operator`` unless a pod gives a command, and knows the operator's user (UID 10001),
  so the Helm chart's Deployment runs on it unchanged.

Format: OCI image layout 1.0 (github.com/opencontainers/image-spec, image-layout.md, manifest.md, config.md).
containerd names an imported image from the index annotation ``io.containerd.image.name``.
"""

from __future__ import annotations

import hashlib
import io
import json
import pathlib
import subprocess
import tarfile

PAUSE_SOURCE = r"""
/* The pod sandbox's process: holds the namespaces, exits on SIGINT/SIGTERM, reaps orphans
   (as registry.k8s.io/pause). */
#include <signal.h>
#include <stdlib.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) { (void)sig; _exit(0); }
static void reap(int sig) { (void)sig; while (waitpid(-1, NULL, WNOHANG) > 0) {} }

int main(void) {
    struct sigaction stop_action = {.sa_handler = stop};
    struct sigaction reap_action = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
    sigaction(SIGINT, &stop_action, NULL);
    sigaction(SIGTERM, &stop_action, NULL);
    sigaction(SIGCHLD, &reap_action, NULL);
    for (;;) pause();
}
"""

ROOTFS_DIRS = ("proc", "sys", "dev", "etc", "run", "var", "var/tmp", "root", "home", "mnt", "opt", "srv")
"""Empty folders of the runtime image (mount points and the usual top level); ``tmp`` is added with mode 1777."""

USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}
"""Merged-/usr symlinks (Debian 12 layout), so ``/bin/sh`` and the dynamic loader resolve through the /usr bind."""

ETC_FILES = {
    "etc/passwd": (
        "root:x:0:0:root:/root:/bin/sh\n"
        "rlightning:x:10001:10001::/tmp:/usr/sbin/nologin\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    ),
    "etc/group": "root:x:0:\nrlightning:x:10001:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files dns\n",
}
"""Minimal /etc of the runtime image (``getpass``, ``getaddrinfo``); kubelet mounts hosts, hostname, resolv.conf.
UID/GID 10001 is operator/Dockerfile's ``rlightning`` user, as which the chart runs the operator."""

ENTRYPOINT = ["rlightning-operator"]
"""Entrypoint of the runtime image, as operator/Dockerfile's; the operator's pods override it with ``command``."""

PLATFORM = {"architecture": "amd64", "os": "linux"}
"""Platform of both images (the machine's)."""


class ImageError(RuntimeError):
    """Raised when the pause program does not compile."""


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), mode, 0
    tar.addfile(info, io.BytesIO(data))


def _add_dir(tar: tarfile.TarFile, name: str, mode: int = 0o755) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.mode, info.mtime = tarfile.DIRTYPE, mode, 0
    tar.addfile(info)


def _add_link(tar: tarfile.TarFile, name: str, target: str) -> None:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.mtime = tarfile.SYMTYPE, target, 0
    tar.addfile(info)


def runtime_layer(scripts: dict[str, bytes] | None = None, scripts_dir: str = "opt/rlightning/bin") -> bytes:
    """Return the runtime image's single layer: :data:`ROOTFS_DIRS`, ``tmp``, :data:`USR_LINKS`, :data:`ETC_FILES`
    and the given scripts.

    Args:
        scripts (dict[str, bytes] | None, optional): Executables by file name, written to ``scripts_dir`` (mode
            0755). Defaults to None (none).
        scripts_dir (str, optional): Their folder, relative to the root. Defaults to ``"opt/rlightning/bin"``
            (``_nodeconfig.CONTAINER_SCRIPTS``).

    Returns:
        bytes: An uncompressed tar.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name in ROOTFS_DIRS:
            _add_dir(tar, name)
        _add_dir(tar, "tmp", 0o1777)
        for name, target in USR_LINKS.items():
            _add_link(tar, name, target)
        for name, text in ETC_FILES.items():
            _add_bytes(tar, name, text.encode())
        if scripts:
            parts = scripts_dir.strip("/").split("/")
            for depth in range(1, len(parts) + 1):
                if "/".join(parts[:depth]) not in ROOTFS_DIRS:
                    _add_dir(tar, "/".join(parts[:depth]))
            for name, data in sorted(scripts.items()):
                _add_bytes(tar, f"{'/'.join(parts)}/{name}", data, 0o755)
    return buffer.getvalue()


def pause_layer(pause_binary: pathlib.Path) -> bytes:
    """Return the pause image's single layer: ``/pause`` (mode 0755).

    Args:
        pause_binary (pathlib.Path): The static program built by :func:`build_pause`.

    Returns:
        bytes: An uncompressed tar.
    """
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        _add_bytes(tar, "pause", pause_binary.read_bytes(), 0o755)
    return buffer.getvalue()


def build_pause(folder: pathlib.Path) -> pathlib.Path:
    """Compile :data:`PAUSE_SOURCE` statically with ``gcc``.

    Args:
        folder (pathlib.Path): Where ``pause.c`` and ``pause`` are written (created).

    Returns:
        pathlib.Path: The binary.

    Raises:
        ImageError: When gcc is missing or fails (Debian: ``apt-get install gcc libc6-dev``).
    """
    folder.mkdir(parents=True, exist_ok=True)
    source, binary = folder / "pause.c", folder / "pause"
    source.write_text(PAUSE_SOURCE)
    try:
        proc = subprocess.run(
            ["gcc", "-static", "-O2", "-o", str(binary), str(source)], capture_output=True, text=True, check=False
        )
    except FileNotFoundError as exc:
        raise ImageError("gcc not found: the pause image is compiled locally (apt-get install gcc libc6-dev)") from exc
    if proc.returncode != 0:
        raise ImageError(f"gcc failed to build the pause program (exit {proc.returncode}): {proc.stderr.strip()}")
    return binary


def _blob(blobs: dict[str, bytes], data: bytes, media_type: str) -> dict:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"mediaType": media_type, "digest": digest, "size": len(data)}


def oci_archive(name: str, layer: bytes, config: dict) -> bytes:
    """Return an OCI image layout, as a tar, holding one single-layer image named ``name``.

    Args:
        name (str): Full image reference, e.g. ``"rlightning.local/runtime:dev"``.
        layer (bytes): The uncompressed layer tar.
        config (dict): The image's ``config`` section (Env, Entrypoint, Cmd, WorkingDir).

    Returns:
        bytes: A tar with ``oci-layout``, ``index.json`` and ``blobs/sha256/*``.
    """
    blobs: dict[str, bytes] = {}
    layer_descriptor = _blob(blobs, layer, "application/vnd.oci.image.layer.v1.tar")
    image_config = {
        **PLATFORM,
        "config": config,
        "rootfs": {"type": "layers", "diff_ids": [layer_descriptor["digest"]]},
    }
    config_descriptor = _blob(
        blobs, json.dumps(image_config, sort_keys=True).encode(), "application/vnd.oci.image.config.v1+json"
    )
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": config_descriptor,
        "layers": [layer_descriptor],
    }
    manifest_descriptor = _blob(
        blobs, json.dumps(manifest, sort_keys=True).encode(), "application/vnd.oci.image.manifest.v1+json"
    )
    manifest_descriptor["platform"] = dict(PLATFORM)
    manifest_descriptor["annotations"] = {
        "io.containerd.image.name": name,
        "org.opencontainers.image.ref.name": name.rsplit(":", 1)[-1],
    }
    index = {"schemaVersion": 2, "manifests": [manifest_descriptor]}
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        _add_bytes(tar, "oci-layout", json.dumps({"imageLayoutVersion": "1.0.0"}).encode())
        _add_bytes(tar, "index.json", json.dumps(index).encode())
        _add_dir(tar, "blobs")
        _add_dir(tar, "blobs/sha256")
        for digest, data in blobs.items():
            _add_bytes(tar, f"blobs/sha256/{digest.split(':', 1)[1]}", data)
    return buffer.getvalue()


def pause_archive(name: str, pause_binary: pathlib.Path) -> bytes:
    """Return the OCI layout tar of the sandbox image (entrypoint ``/pause``)."""
    return oci_archive(name, pause_layer(pause_binary), {"Entrypoint": ["/pause"], "WorkingDir": "/"})


def runtime_archive(name: str, env: list[str], scripts: dict[str, bytes] | None = None) -> bytes:
    """Return the OCI layout tar of the runtime image.

    Args:
        name (str): Full image reference.
        env (list[str]): ``NAME=value`` entries (``_nodeconfig.image_env``).
        scripts (dict[str, bytes] | None, optional): The virtualenv's relocated console scripts by name
            (``_nodeconfig.container_script``). Defaults to None.

    Returns:
        bytes: The archive; its containers run :data:`ENTRYPOINT` unless the pod gives a command.
    """
    layer = runtime_layer(scripts)
    return oci_archive(name, layer, {"Env": env, "Entrypoint": list(ENTRYPOINT), "WorkingDir": "/"})
