"""`rlightning-operator`: run the PolicyGroup operator (kopf) with settings from flags and the environment.

Examples:
    rlightning-operator --namespace team-a --namespace team-b
    RLIGHTNING_OPERATOR_ALL_NAMESPACES=true KUBECONFIG=~/.kube/config rlightning-operator
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys

import kopf
import prometheus_client
import pydantic

from rlightning.config import format_validation_error
from rlightning_operator import _handlers as handlers
from rlightning_operator import _kube as kube
from rlightning_operator import _reconcile as reconcile
from rlightning_operator import _settings


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


class QuietChildEvents(logging.Filter):
    """Drops kopf's per-event success line of the child watch (one per Job/StatefulSet status change)."""

    def filter(self, record: logging.LogRecord) -> bool:
        """False for "Handler 'child_changed' succeeded." records."""
        return not (record.name == "kopf.objects" and record.getMessage() == "Handler 'child_changed' succeeded.")


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
    parser.add_argument("--health-port", type=int, help="kopf liveness endpoint port (0 disables)")
    parser.add_argument("--metrics-port", type=int, help="Prometheus metrics port (0 disables)")
    return parser


def _configure_logging(settings: _settings.OperatorSettings) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if settings.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    handler.addFilter(QuietChildEvents())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(settings.log_level)
    logging.getLogger("urllib3").setLevel(logging.WARNING)


def main(argv: list[str] | None = None) -> int:
    """Parse flags, configure logging and metrics, and run kopf until SIGINT/SIGTERM.

    Args:
        argv (list[str] | None, optional): Arguments without the program name. Defaults to sys.argv[1:].

    Returns:
        int: 0 after a clean stop, 2 for invalid settings.
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
    context = handlers.Context(settings=settings, reconciler=reconcile.Reconciler(client, handlers.post_event))
    if settings.metrics_port:
        prometheus_client.start_http_server(settings.metrics_port)
    kopf.run(
        registry=handlers.REGISTRY,
        clusterwide=settings.all_namespaces,
        namespaces=settings.served_namespaces,
        standalone=True,
        liveness_endpoint=f"http://0.0.0.0:{settings.health_port}/healthz" if settings.health_port else None,
        memo=context,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
