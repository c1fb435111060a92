"""What a real node changes on the host, observed before start and after teardown, and its removal.

A snapshot records everything the node's components are known to touch outside its own folder: network links,
iptables rules (nat, filter, mangle), mounts, top-level cgroups of every hierarchy, network namespaces, the
fixed paths of kubelet/containerd/CNI (``/var/log/pods``, ``/var/log/containers``, ``/var/lib/cni`` ...), the
sysctls involved, and processes of the node's binaries. Teardown compares the snapshot taken before start with
one taken after, and the difference must be empty.
"""

from __future__ import annotations

import dataclasses
import os
import pathlib
import shutil
import signal
import subprocess
import time

CGROUP_ROOT = pathlib.Path("/sys/fs/cgroup")
"""Root of the cgroup hierarchies (v1 controllers, plus ``unified`` on hybrid machines)."""

FIXED_PATHS = (
    "/var/log/pods",
    "/var/log/containers",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/lib/containerd",
    "/run/containerd",
    "/var/run/netns",
    "/etc/cni",
    "/opt/cni",
    "/etc/kubernetes",
)
"""Default locations of kubelet, containerd and CNI state; the node is configured away from all of them."""

SYSCTLS = ("net/ipv4/ip_forward", "net/ipv4/conf/all/route_localnet", "net/bridge/bridge-nf-call-iptables")
"""Host-wide sysctls the stack might set (the node sets only the bridge's own ``route_localnet``, but the CNI bridge
plugin, as the pods' gateway, turns ``ip_forward`` on at the first pod and never off: plugins/main/bridge in
containernetworking/plugins)."""

PROC_SYS = pathlib.Path("/proc/sys")
"""Where :data:`SYSCTLS` are read and written."""

PROCESS_NAMES = ("kubelet", "containerd", "containerd-shim-runc-v2", "coredns", "runc", "pause")
"""Executables whose processes must all be gone after teardown."""

IPTABLES_TABLES = ("nat", "filter", "mangle")
"""Tables compared rule by rule."""


@dataclasses.dataclass(frozen=True)
class HostState:
    """One observation of the host.

    Attributes:
        links (frozenset[str]): Network interface names.
        iptables (frozenset[str]): ``table: rule`` lines of ``iptables-save`` without counters.
        mounts (frozenset[str]): Mount points.
        cgroups (frozenset[str]): ``hierarchy/name`` of every top-level cgroup.
        paths (frozenset[str]): Which of :data:`FIXED_PATHS` exist, with their entries (``path/entry``).
        sysctls (tuple[tuple[str, str], ...]): Values of :data:`SYSCTLS` (``"-"`` when absent).
        processes (frozenset[str]): ``pid name`` of running :data:`PROCESS_NAMES` processes.
    """

    links: frozenset[str]
    iptables: frozenset[str]
    mounts: frozenset[str]
    cgroups: frozenset[str]
    paths: frozenset[str]
    sysctls: tuple[tuple[str, str], ...]
    processes: frozenset[str]


def _iptables_rules() -> frozenset[str]:
    if shutil.which("iptables-save") is None:  # not installed yet (the real node installs it): no rules of ours
        return frozenset()
    rules = set()
    for table in IPTABLES_TABLES:
        proc = subprocess.run(["iptables-save", "-t", table], capture_output=True, text=True, check=False)
        for line in proc.stdout.splitlines():
            if line.startswith("-A ") or line.startswith(":"):
                rules.add(f"{table}: {line.split(' [', 1)[0] if line.startswith(':') else line}")
    return frozenset(rules)


def mount_points() -> list[str]:
    """Return the mount points of this mount namespace, in mount order (``/proc/self/mountinfo``)."""
    points = []
    for line in pathlib.Path("/proc/self/mountinfo").read_text().splitlines():
        point = line.split(" ")[4]
        points.append(point.encode().decode("unicode_escape"))
    return points


def _cgroups() -> frozenset[str]:
    found: set[str] = set()
    for hierarchy in CGROUP_ROOT.iterdir():
        if hierarchy.is_dir() and not hierarchy.is_symlink():
            found.update(f"{hierarchy.name}/{child.name}" for child in hierarchy.iterdir() if child.is_dir())
    return frozenset(found)


NETNS_DIR = "/var/run/netns"
"""Of the entries here only containerd's pod namespaces (``cni-<id>``) can be the node's; others belong to
``ip netns`` users beside it (the capped-link weight-sync tests on another worker), and the folder itself is made by
either, so neither counts as the node's state nor is removed with it. The same holds for their mount points (each
named namespace is a bind mount, and ``ip netns`` mounts the folder onto itself)."""

NETNS_MOUNT_DIRS = ("/run/netns", "/var/run/netns")
"""Where a named network namespace's mount point can appear (``/var/run`` is a link to ``/run`` on Debian)."""


def _is_others_netns_mount(point: str) -> bool:
    for folder in NETNS_MOUNT_DIRS:
        if point == folder:
            return True
        if point.startswith(folder + "/"):
            return not point[len(folder) + 1 :].startswith("cni-")
    return False


def _paths() -> frozenset[str]:
    found: set[str] = set()
    for raw in FIXED_PATHS:
        path = pathlib.Path(raw)
        if raw == NETNS_DIR:
            if path.is_dir():
                found.update(f"{raw}/{entry.name}" for entry in path.iterdir() if entry.name.startswith("cni-"))
            continue
        if path.exists() or path.is_symlink():
            found.add(raw)
            if path.is_dir():
                found.update(f"{raw}/{entry.name}" for entry in path.iterdir())
    return frozenset(found)


def _sysctls(root: pathlib.Path = PROC_SYS) -> tuple[tuple[str, str], ...]:
    values = []
    for name in SYSCTLS:
        try:
            values.append((name, (root / name).read_text().strip()))
        except OSError:
            values.append((name, "-"))
    return tuple(values)


def restore_sysctls(before: tuple[tuple[str, str], ...], root: pathlib.Path = PROC_SYS) -> list[str]:
    """Write back every sysctl whose value differs from ``before`` (:attr:`HostState.sysctls`).

    Args:
        before (tuple[tuple[str, str], ...]): ``(name, value)`` pairs observed before start; ``"-"`` (absent then)
            is left alone.
        root (pathlib.Path, optional): The sysctl tree. Defaults to :data:`PROC_SYS`.

    Returns:
        list[str]: The names written back.

    Raises:
        OSError: when a sysctl cannot be written (not root).
    """
    now = dict(_sysctls(root))
    restored = []
    for name, value in before:
        if value != "-" and now.get(name) not in (value, "-"):
            (root / name).write_text(value)
            restored.append(name)
    return restored


def processes(names: tuple[str, ...] = PROCESS_NAMES) -> dict[int, str]:
    """Return ``{pid: executable name}`` of running processes whose executable's base name is in ``names``."""
    found = {}
    for entry in pathlib.Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            exe = os.path.basename(os.readlink(entry / "exe"))
        except OSError:
            continue
        if exe in names:
            found[int(entry.name)] = exe
    return found


def snapshot() -> HostState:
    """Observe the host now (a few subprocesses; well under a second).

    Returns:
        HostState: The observation.
    """
    return HostState(
        links=frozenset(entry.name for entry in pathlib.Path("/sys/class/net").iterdir()),
        iptables=_iptables_rules(),
        mounts=frozenset(point for point in mount_points() if not _is_others_netns_mount(point)),
        cgroups=_cgroups(),
        paths=_paths(),
        sysctls=_sysctls(),
        processes=frozenset(f"{pid} {name}" for pid, name in processes().items()),
    )


def difference(before: HostState, after: HostState) -> list[str]:
    """Return one line per thing that differs between two observations (empty when the host is as before).

    Args:
        before (HostState): Taken before the node started.
        after (HostState): Taken after it stopped.

    Returns:
        list[str]: Lines such as ``"mounts: added /run/x"`` or ``"sysctls: changed (...)"``.
    """
    lines = []
    for field in dataclasses.fields(HostState):
        old, new = getattr(before, field.name), getattr(after, field.name)
        if field.name == "sysctls":
            lines += [f"sysctls: {a[0]} was {a[1]}, now {b[1]}" for a, b in zip(old, new, strict=True) if a != b]
            continue
        lines += [f"{field.name}: added {item}" for item in sorted(new - old)]
        lines += [f"{field.name}: removed {item}" for item in sorted(old - new)]
    return lines


def mounts_under(root: pathlib.Path) -> list[str]:
    """Return the mount points at or below ``root`` (each once)."""
    prefix = str(root).rstrip("/") + "/"
    return sorted({p for p in mount_points() if p.startswith(prefix) or p == str(root)})


def unmount_under(root: pathlib.Path) -> list[str]:
    """Lazily unmount every mount point at or below ``root``, deepest first.

    Args:
        root (pathlib.Path): Folder (the node's root).

    Returns:
        list[str]: The mount points unmounted.
    """
    done = []
    for point in sorted(mounts_under(root), key=lambda p: (p.count("/"), len(p)), reverse=True):
        if subprocess.run(["umount", "--lazy", point], capture_output=True, check=False).returncode == 0:
            done.append(point)
    return done


def cgroups_named(names: set[str]) -> list[str]:
    """Return ``hierarchy/name`` of the top-level cgroups of these names that exist, in every hierarchy."""
    return sorted(f"{top.parent.name}/{top.name}" for name in names for top in CGROUP_ROOT.glob(f"*/{name}"))


def _cgroup_tree(top: pathlib.Path) -> list[pathlib.Path]:
    return sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]


def remove_cgroups(names: set[str], wait_seconds: float = 10.0) -> list[str]:
    """Kill the processes left in the given top-level cgroups and remove them, in every hierarchy.

    Args:
        names (set[str]): Top-level cgroup names, e.g. ``{"kubepods", "k8s.io"}`` (only ones the node created).
        wait_seconds (float, optional): Bound for killed processes to leave the cgroups. Defaults to 10.

    Returns:
        list[str]: ``hierarchy/name`` of the cgroups removed.
    """
    removed = []
    for hierarchy in CGROUP_ROOT.iterdir():
        for name in names:
            top = hierarchy / name
            if not top.is_dir() or hierarchy.is_symlink():
                continue
            deadline = time.monotonic() + wait_seconds
            while True:
                pids = {
                    int(pid)
                    for group in _cgroup_tree(top)
                    for pid in _read(group / "cgroup.procs").split()
                }
                if not pids or time.monotonic() > deadline:
                    break
                for pid in pids:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                time.sleep(0.1)
            for group in _cgroup_tree(top):
                try:
                    group.rmdir()
                except OSError:
                    pass
            if not top.exists():
                removed.append(f"{hierarchy.name}/{name}")
    return removed


def _read(path: pathlib.Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def remove_new_paths(before: frozenset[str]) -> list[str]:
    """Remove :data:`FIXED_PATHS` entries (or whole paths) that appeared since an observation.

    Args:
        before (frozenset[str]): :attr:`HostState.paths` of the observation taken before the node started.

    Returns:
        list[str]: What was removed.
    """
    removed = []
    now = _paths()
    for item in sorted(now - before, key=len, reverse=True):
        path = pathlib.Path(item)
        if path.is_symlink() or path.is_file():
            path.unlink(missing_ok=True)
        elif path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        removed.append(item)
    return removed
