"""`python -m rlightning.runtime.torchrun ARGS`: torchrun whose rendezvous store listens on one address only.

torchrun's static rendezvous (`--master-addr`/`--master-port`, one node or several) hosts a `TCPStore` on node
rank 0, and torch's store listens on every interface whatever `--master-addr` says. A local run
(`rlightning run`) keeps every port on loopback, so its launch plan starts torchrun through this module with
`ENV_BIND_HOST=127.0.0.1`: the store listens on a socket bound to that address (`master_listen_fd`, as the
weight-sync store does) and is otherwise torch's own. Without `ENV_BIND_HOST` this is torchrun unchanged. Pods run
`torch.distributed.run` itself (a pod's peers are other pods).

`--start-method=fork` with `-m MODULE` (torch's torchrun ignores the start method for a module) starts each rank as a
fork of the agent that runs the module in-process, as `--run-path` does for a script: the ranks begin with the
agent's imports (under `rlightning run` the agent is itself a fork of the launcher, so torch, tensordict and the
policy class are already imported). The agent is torch's own either way: the same rendezvous, rank variables,
restarts, error files and exit codes. A rank so started shares the agent's process group; it falls back to torch's
subprocesses where a fork is not safe (`_fork.available`: more than one thread, or CUDA initialized).
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import static_tcp_rendezvous

from rlightning import contract
from rlightning.runtime import _exit, _fork, _signals

DEFAULT_TIMEOUT = datetime.timedelta(seconds=300)
"""TCPStore's own default timeout, for callers that pass none."""
ConfigFromArgs = Callable[[argparse.Namespace], tuple[Any, Callable[..., Any] | str, list[str]]]
"""`torch.distributed.run.config_from_args`: parsed arguments -> (LaunchConfig, entrypoint, its arguments)."""


def store_on(bind_host: str) -> Any:
    """A `TCPStore` factory for torchrun's static rendezvous whose master listens on `bind_host` only.

    Args:
        bind_host (str): The address to listen on, for example 127.0.0.1.

    Returns:
        Any: A callable with `TCPStore`'s signature; clients (`is_master` false) are plain `TCPStore`s.
    """

    def make(
        host: str, port: int, world_size: int | None = None, is_master: bool = False,
        timeout: datetime.timedelta = DEFAULT_TIMEOUT, **kwargs: Any,
    ) -> TCPStore:
        if not is_master:
            return TCPStore(host, port, world_size, is_master, timeout, **kwargs)
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        listener = socket.socket(family, socket.SOCK_STREAM)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torch's own listener does
        try:
            listener.bind((bind_host, port))
        except OSError:
            listener.close()
            raise
        return TCPStore(bind_host, port, world_size, is_master, timeout, master_listen_fd=listener.detach(), **kwargs)

    return make


def run_module(module: str, *args: str) -> None:
    """A rank's entrypoint with `--start-method=fork`: `python -m module args` in this forked worker.

    torch's `run_script_path` for a module; what the worker inherited from the agent is reset first
    (`_fork.run_module`). A `SystemExit` with code 0 is success, any other fails the rank with that exit code.

    A rank that stopped on a signal ends its process at once after success (`_exit.exit_now`): the signal came from
    the agent's teardown (its `close()` sends it once, then waits up to 30 s for the worker), and torch's worker
    wrapper would first wait for the agent to read the rank's result, which a closing agent never does, so the
    worker sat out those 30 s before its SIGKILL.

    Args:
        module (str): The module run as `__main__`.
        *args (str): Its arguments.
    """
    try:
        _fork.run_module(module, args)
    except SystemExit as done:
        if done.code:
            raise
    if _signals.stop_signal() is not None:
        _exit.exit_now(0)


def forking_modules(config_from_args: ConfigFromArgs) -> ConfigFromArgs:
    """Wrap torchrun's `config_from_args` so that `-m MODULE` with `--start-method=fork` runs `run_module`.

    Args:
        config_from_args (ConfigFromArgs): `torch.distributed.run.config_from_args`.

    Returns:
        ConfigFromArgs: The same, except for a module with the fork start method (and a single-threaded agent):
            the entrypoint `run_module` and its arguments (the module, then the script's), not the interpreter.
    """

    def config(args: argparse.Namespace) -> tuple[Any, Callable[..., Any] | str, list[str]]:
        launch_config, cmd, cmd_args = config_from_args(args)
        if args.module and not args.no_python and args.start_method == "fork" and _fork.available():
            return launch_config, run_module, cmd_args[cmd_args.index("-m") + 1 :]
        return launch_config, cmd, cmd_args

    return config


def main() -> None:
    """Run torchrun (`torch.distributed.run.main`) with the rendezvous store bound to `ENV_BIND_HOST` and ranks of
    `-m MODULE` forked with `--start-method=fork`.
    """
    bind_host = os.environ.get(contract.ENV_BIND_HOST)
    if bind_host:
        static_tcp_rendezvous.TCPStore = store_on(bind_host)  # type: ignore[misc]
    from torch.distributed import run as torchrun

    torchrun.config_from_args = forking_modules(torchrun.config_from_args)  # type: ignore[assignment]
    sys.argv[0] = "torchrun"
    torchrun.main()


if __name__ == "__main__":
    main()
