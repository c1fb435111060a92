"""The operator's Prometheus metrics (served on contract.OPERATOR_METRICS_PORT by `__main__`)."""

from __future__ import annotations

import prometheus_client

RECONCILES = prometheus_client.Counter(
    "rlightning_operator_reconciles_total",
    "Reconciles of a PolicyGroup, by trigger (create, update, resume; child: a whole reconcile after a child's "
    "event; child-status: a status refresh after a child's or pod's event; recheck: a status refresh that a "
    "condition turning with time asked for).",
    ["trigger"],
)
RECONCILE_ERRORS = prometheus_client.Counter(
    "rlightning_operator_reconcile_errors_total",
    "Reconciles that ended in an error, by trigger and error class (invalid, transient, permanent, unexpected).",
    ["trigger", "error"],
)
API_REQUESTS = prometheus_client.Counter(
    "rlightning_operator_api_requests_total",
    "Requests of the reconciler to the Kubernetes API (kopf's own watches and bookkeeping excluded).",
    ["verb", "kind", "code"],
)
API_SECONDS = prometheus_client.Histogram(
    "rlightning_operator_api_request_seconds",
    "Duration of the reconciler's Kubernetes API requests in seconds.",
    ["verb"],
)
WATCH_EVENTS = prometheus_client.Counter(
    "rlightning_operator_watch_events_total",
    "Events of watched children and pods, by kind and outcome (pass: a pass was scheduled or one was pending; "
    "ignored: nothing the status or the plan reads changed).",
    ["kind", "outcome"],
)
ACTIONS = prometheus_client.Counter(
    "rlightning_operator_actions_total",
    "Actions applied to children, by type (create, patch, scale, recreate, force-delete of a pod) and kind.",
    ["type", "kind"],
)
GANG_RESTARTS = prometheus_client.Counter(
    "rlightning_operator_gang_restarts_total",
    "Restarts of a trainer gang, by reason (Preempted, NodeLost, Evicted, Failed, PodDeleted; "
    "`_disruption.RESTART_REASONS`).",
    ["reason"],
)
CHECKPOINT_ASKS = prometheus_client.Counter(
    "rlightning_operator_checkpoint_requests_total",
    "Checkpoints asked of a trainer gang because a node its trainers run on was marked for disruption.",
)
