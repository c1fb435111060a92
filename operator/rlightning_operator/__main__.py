"""`rlightning-operator`: run the PolicyGroup operator (kopf) with settings from flags and the environment.

Examples:
    rlightning-operator --namespace team-a --namespace team-b
    RLIGHTNING_OPERATOR_ALL_NAMESPACES=true KUBECONFIG=~/.kube/config rlightning-operator
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import socket
import sys
import uuid

import kopf
import prometheus_client
import pydantic

from rlightning.config import format_validation_error
from rlightning_operator import _handlers as handlers
from rlightning_operator import _health as health
from rlightning_operator import _kube as kube
from rlightning_operator import _leader as leader
from rlightning_operator import _reconcile as reconcile
from rlightning_operator import _settings


logger = logging.getLogger("rlightning_operator")


class JsonFormatter(logging.Formatter):
    """One JSON object per line: time, level, logger, message (and the exception, if any)."""

    def format(self, record: logging.LogRecord) -> str:
        """Format `record` as JSON."""
        entry = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry)


class QuietEventHandlers(logging.Filter):
    """Drops kopf's per-event success line of the PolicyGroup event handler (one per PolicyGroup change)."""

    QUIET = ("Handler 'group_changed' succeeded.",)

    def filter(self, record: logging.LogRecord) -> bool:
        """False for "Handler 'group_changed' succeeded." records of kopf."""
        return not (record.name == "kopf.objects" and record.getMessage() in self.QUIET)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="rlightning-operator", description=__doc__.splitlines()[0])
    scope = parser.add_mutually_exclusive_group()
    scope.add_argument("--namespace", "-n", action="append", dest="namespaces", metavar="NS",
                       help="serve this namespace (repeatable); env RLIGHTNING_OPERATOR_NAMESPACES (comma-separated)")
    scope.add_argument("--all-namespaces", "-A", action="store_true", default=None,
                       help="serve every namespace; env RLIGHTNING_OPERATOR_ALL_NAMESPACES=true")
    parser.add_argument("--kubeconfig", help="kubeconfig file (default: in-cluster service account, then $KUBECONFIG)")
    parser.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"])
    parser.add_argument("--log-format", choices=["text", "json"])
    parser.add_argument("--health-port", type=int, help="liveness endpoint /healthz port (0 disables)")
    parser.add_argument("--leader-elect", action="store_true", default=None, dest="leader_election", help=(
        "act only while holding the leader-election Lease; env RLIGHTNING_OPERATOR_LEADER_ELECTION=true"))
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0 disables)")
    parser.add_argument("--network-policy", action=argparse.BooleanOptionalAction, default=None, help=(
        "give each PolicyGroup's trainers a NetworkPolicy (default on); env RLIGHTNING_OPERATOR_NETWORK_POLICY"))
    return parser


def _configure_logging(settings: _settings.OperatorSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(QuietEventHandlers())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging, liveness and metrics, and run kopf until SIGINT/SIGTERM.

    With leader election the process first waits as a standby until it holds the Lease.

    Args:
        argv (list[str] | None, optional): Arguments without the program name. Defaults to sys.argv[1:].

    Returns:
        int: 0 after a clean stop, 2 for invalid settings or a taken health port; the process exits with 1 when
            it loses the Lease.
    """
    args = _parser().parse_args(argv)
    if args.kubeconfig:
        os.environ["KUBECONFIG"] = args.kubeconfig  # read by both kopf's login and the kubernetes client
    overrides = {
        "namespaces": args.namespaces,
        "all_namespaces": args.all_namespaces,
        "log_level": args.log_level,
        "log_format": args.log_format,
        "health_port": args.health_port,
        "metrics_port": args.metrics_port,
        "leader_election": args.leader_election,
        "network_policy": args.network_policy,
    }
    if args.namespaces:
        overrides["all_namespaces"] = False
    if args.all_namespaces:
        overrides["namespaces"] = []
    try:
        settings = _settings.OperatorSettings.from_env(**overrides)
    except pydantic.ValidationError as error:
        for line in format_validation_error(error, prefix="settings"):
            print(f"rlightning-operator: {line}", file=sys.stderr)
        return 2
    _configure_logging(settings)
    # kopf's handler threads and the refresher's threads share the client: one connection for each.
    client = kube.KubeClient(kube.load_api_client(pool_size=2 * settings.workers), settings.api_timeout_seconds)
    reconciler = reconcile.Reconciler(client, handlers.post_event, settings.network_policy_options)
    context = handlers.Context(settings=settings, reconciler=reconciler, client=client)
    elector = None
    if settings.leader_election:
        identity = f"{os.environ.get('POD_ID') or socket.gethostname()}_{uuid.uuid4().hex[:8]}"
        elector = leader.LeaseElector(
            client, settings.lease_namespace, settings.lease_name, identity, settings.lease_duration_seconds,
            settings.renew_deadline_seconds, settings.retry_period_seconds,
        )

    def role() -> str:
        if elector is None:
            return "single"
        return "leader" if elector.leading else "standby"

    if settings.health_port:
        try:
            health.HealthServer(settings.health_port, client, settings.api_silence_limit_seconds, role).start()
        except OSError as error:
            print(f"rlightning-operator: settings.health_port: {error}", file=sys.stderr)
            return 2
    if settings.metrics_port:
        prometheus_client.start_http_server(settings.metrics_port)
    return asyncio.run(_serve(settings, client, context, elector))


async def _serve(
    settings: _settings.OperatorSettings,
    client: kube.KubeClient,
    context: handlers.Context,
    elector: leader.LeaseElector | None,
) -> int:
    """Keep hearing from the API server; as a standby wait for the Lease; then run kopf until a signal (0) or
    until the Lease is lost (1: the process exits at once, as controller-runtime's managers do, so that it never
    acts beside the new leader).
    """
    heartbeat = asyncio.create_task(health.keep_hearing(client, settings.heartbeat_seconds))
    if elector is not None:
        await elector.acquire()
    kopf_task = asyncio.create_task(kopf.operator(
        registry=handlers.REGISTRY,
        clusterwide=settings.all_namespaces,
        namespaces=settings.served_namespaces,
        standalone=True,
        memo=context,
    ))
    tasks: set[asyncio.Task[None]] = {kopf_task}
    holding = asyncio.create_task(elector.hold()) if elector is not None else None
    if holding is not None:
        tasks.add(holding)
    done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    if kopf_task not in done:  # the Lease is lost: a standby may act from lease_duration_seconds on
        logger.error("lost the Lease %s/%s: exiting", settings.lease_namespace, settings.lease_name)
        logging.shutdown()
        os._exit(1)
    heartbeat.cancel()
    if holding is not None:
        holding.cancel()
    if elector is not None:
        await asyncio.to_thread(elector.release)
    kopf_task.result()  # re-raise what stopped kopf, if it failed
    return 0

if __name__ == "__main__":
    sys.exit(main())
