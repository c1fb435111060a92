"""Prometheus metrics of trainer and evaluator processes (prometheus-client), served on ENV_METRICS_PORT."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class TrainerMetrics:
    """Gauges and counters of a trainer rank 0.

    Args:
        port (int): Port of the /metrics endpoint; 0 creates the metrics without serving them.
    """

    def __init__(self, port: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.iteration = Gauge("rlightning_train_iteration", "Training iterations done.", registry=r)
        self.env_steps = Gauge("rlightning_train_env_steps", "Environment steps summed over ranks.", registry=r)
        self.train_return = Gauge("rlightning_train_return", "Mean return of recent training episodes.", registry=r)
        self.eval_return = Gauge("rlightning_eval_return", "Mean return reported by the evaluators.", registry=r)
        self.weight_version = Gauge("rlightning_weight_version", "Newest published weight version.", registry=r)
        self.consistent = Gauge("rlightning_eval_consistent", "1 when evaluators match the trainer.", registry=r)
        self.sync_seconds = Counter("rlightning_weight_sync_seconds", "Seconds spent publishing.", registry=r)
        self.sync_bytes = Counter("rlightning_weight_sync_bytes", "Bytes published.", registry=r)
        self.sync_failures = Counter("rlightning_weight_sync_failures", "Publishes that failed.", registry=r)
        if port:
            start_http_server(port, registry=r)


class EvaluatorMetrics:
    """Gauges of one evaluator.

    Args:
        port (int): Port of the /metrics endpoint; 0 creates the metrics without serving them.
    """

    def __init__(self, port: int) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.eval_return = Gauge("rlightning_eval_return", "Mean return of the last report.", registry=r)
        self.weight_version = Gauge("rlightning_weight_version", "Weight version applied.", registry=r)
        self.episodes = Counter("rlightning_eval_episodes", "Evaluation episodes finished.", registry=r)
        if port:
            start_http_server(port, registry=r)
