"""Command line of the dev cluster: ``build [--addon NAME]``, ``up [--real-node]``, ``down``, ``status``, ``gomod``."""

from __future__ import annotations

import argparse
import sys

from devcluster import _build
from devcluster import _cluster
from devcluster import _gomod
from devcluster import _hostpackages
from devcluster import _images
from devcluster import _nodeconfig
from devcluster import _pki
from devcluster import _ports
from devcluster import _realnode
from devcluster import _toolchain


def _log(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _cmd_build(args: argparse.Namespace) -> int:
    result = _build.build(log=_log, parallel=args.parallel)
    if result.cache_hit:
        print(f"cache hit: {result.bin_dir} (no go invocation, {result.seconds:.2f}s)")
    else:
        print(f"built {result.go_invocations} targets into {result.bin_dir} in {result.seconds:.0f}s")
    for name in args.addon:
        print(f"add-on {name}: {_build.build_addon(name, log=_log)}")
    return 0


def _cmd_up(args: argparse.Namespace) -> int:
    slot = _ports.slot_from_env() if args.slot is None else args.slot
    workdir = _cluster.run_dir(slot)
    state = _cluster.read_state(workdir)
    if state is not None and any(state["alive"].values()):
        _log(f"devcluster: a cluster of slot {slot} is already running (state {workdir / _cluster.STATE_FILE})")
        print(f"export KUBECONFIG={state['kubeconfig']}")
        return 1
    _cluster.stop_from_state(workdir, log=_log)  # clear a stale state file of dead processes
    _realnode.stop_from_state(workdir, log=_log)
    cluster = _cluster.launch(workdir=workdir, slot=slot, detach=True, log=_log)
    if args.real_node:
        try:
            _realnode.RealNode(cluster, log=_log).start()
        except BaseException:
            cluster.stop()
            raise
        _log(
            f"devcluster: real node {_nodeconfig.NODE_NAME}: select it with nodeSelector "
            f"{_nodeconfig.NODE_LABEL}=true; image {_nodeconfig.IMAGE}"
        )
    _log(f"devcluster: logs in {cluster.log_dir}; stop with `python -m devcluster down --slot {slot}`")
    _log(f"devcluster: kubectl is {cluster.bin('kubectl')}, helm is {cluster.bin('helm')}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def _cmd_down(args: argparse.Namespace) -> int:
    slot = _ports.slot_from_env() if args.slot is None else args.slot
    _realnode.stop_from_state(_cluster.run_dir(slot), log=_log)
    if not _cluster.stop_from_state(_cluster.run_dir(slot), log=_log):
        _log(f"devcluster: no cluster of slot {slot} is running")
    return 0


def _cmd_status(args: argparse.Namespace) -> int:
    slot = _ports.slot_from_env() if args.slot is None else args.slot
    found = _build.find_binaries()
    print(f"binaries: {found.bin_dir if found else 'not built (run `python -m devcluster build`)'}")
    state = _cluster.read_state(_cluster.run_dir(slot))
    if state is None:
        print(f"cluster (slot {slot}): not running")
        return 1
    for name, pid in state["pids"].items():
        print(f"{name}: pid {pid} {'running' if state['alive'][name] else 'NOT running'}")
    print(f"export KUBECONFIG={state['kubeconfig']}")
    return 0 if all(state["alive"].values()) else 1


def _cmd_gomod(args: argparse.Namespace) -> int:
    _gomod.generate(log=_log, only=args.wrapper)
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run the ``devcluster`` command line.

    Args:
        argv (list[str] | None, optional): Arguments without the program name. Defaults to ``sys.argv[1:]``.

    Returns:
        int: Exit status (0 success, 1 failure or nothing running, 2 usage error).
    """
    parser = argparse.ArgumentParser(
        prog="python -m devcluster", description="Build and run a local Kubernetes control plane with fake kwok nodes."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    build = sub.add_parser("build", help="build the binaries (seconds when cached)")
    build.add_argument("--parallel", type=int, default=2, help="go build commands at once (default 2)")
    build.add_argument("--addon", action="append", default=[], choices=sorted(_build.ADDONS),
                       help="also build this add-on (repeatable); tests build it on first use otherwise")
    build.set_defaults(func=_cmd_build)
    for name, func, text in (
        ("up", _cmd_up, "start a cluster that keeps running; prints `export KUBECONFIG=...`"),
        ("down", _cmd_down, "stop the cluster that `up` started"),
        ("status", _cmd_status, "show the binaries and the running cluster"),
    ):
        cmd = sub.add_parser(name, help=text)
        cmd.add_argument(
            "--slot", type=int, default=None, help="port block 0-9 (default $RLIGHTNING_DEVCLUSTER_SLOT or 0)"
        )
        cmd.set_defaults(func=func)
        if name == "up":
            cmd.add_argument(
                "--real-node",
                action="store_true",
                help="also start a real kubelet node (root; installs containerd, runc, CNI plugins, iptables)",
            )
    gomod = sub.add_parser("gomod", help="regenerate devcluster/go/*/go.mod and go.sum from the pinned versions")
    gomod.add_argument("wrapper", nargs="*", choices=_gomod.WRAPPERS, help="only these wrapper folders (default: all)")
    gomod.set_defaults(func=_cmd_gomod)
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (
        _build.BuildError,
        _cluster.ClusterError,
        _ports.PortInUseError,
        _pki.PKIError,
        _toolchain.ToolchainError,
        _realnode.RealNodeError,
        _hostpackages.PackageError,
        _images.ImageError,
        ValueError,
    ) as exc:
        _log(f"devcluster: error: {exc}")
        return 1
    except KeyboardInterrupt:
        _log("devcluster: interrupted; every process it started was stopped")
        return 130
