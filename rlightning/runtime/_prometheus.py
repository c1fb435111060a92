"""Prometheus metrics of trainer and evaluator processes (prometheus-client), served on ENV_METRICS_PORT."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, start_http_server


class _Metrics:
    """A registry of its own, served on `port` once the subclass has created its metrics.

    Args:
        port (int): Port of the /metrics endpoint; 0 creates the metrics without serving them.
        bind_host (str | None, optional): The address the endpoint binds (`ProcessSettings.bind_host`); None: all
            interfaces. Defaults to None.
    """

    def __init__(self, port: int, bind_host: str | None = None) -> None:
        self.registry = CollectorRegistry()
        self.bind_host = bind_host
        self._create()
        self.serve(port)

    def serve(self, port: int) -> None:
        """Serve /metrics on `port` from now on (0: nothing), on `bind_host`.

        Args:
            port (int): The port.
        """
        if port:
            start_http_server(port, addr=self.bind_host or "0.0.0.0", registry=self.registry)

    def _create(self) -> None:
        raise NotImplementedError

    def _gauge(self, name: str, documentation: str) -> Gauge:
        return Gauge(name, documentation, registry=self.registry)

    def _counter(self, name: str, documentation: str) -> Counter:
        return Counter(name, documentation, registry=self.registry)


class TrainerMetrics(_Metrics):
    """Gauges and counters of a trainer rank 0.

    Args:
        port (int): Port of the /metrics endpoint; 0 creates the metrics without serving them.
        bind_host (str | None, optional): The address the endpoint binds; None: all interfaces. Defaults to None.
    """

    def _create(self) -> None:
        self.iteration = self._gauge("rlightning_train_iteration", "Training iterations done in the run.")
        self.env_steps = self._gauge(
            "rlightning_train_env_steps", "Environment steps of the run, over ranks and attempts."
        )
        self.train_return = self._gauge("rlightning_train_return", "Mean return of recent training episodes.")
        self.eval_return = self._gauge("rlightning_eval_return", "Mean return reported by the evaluators.")
        self.weight_version = self._gauge("rlightning_weight_version", "Newest published weight version.")
        self.consistent = self._gauge(
            "rlightning_eval_consistent",
            "1 when evaluators match the trainer; holds its last verdict while rlightning_eval_compared is 0.",
        )
        self.compared = self._gauge(
            "rlightning_eval_compared", "1 when the last check compared an evaluator's weights; 0: nothing compared."
        )
        self.sync_seconds = self._counter("rlightning_weight_sync_seconds", "Seconds spent publishing.")
        self.sync_bytes = self._counter("rlightning_weight_sync_bytes", "Bytes published.")
        self.sync_failures = self._counter("rlightning_weight_sync_failures", "Publishes that failed.")
        self.env_steps_per_second = self._gauge(
            "rlightning_train_env_steps_per_second", "Env steps trained on per second in the last iteration."
        )
        self.idle_fraction = self._gauge(
            "rlightning_train_idle_fraction", "Fraction of the last iteration the trainers waited for data."
        )
        self.policy_lag_mean = self._gauge(
            "rlightning_policy_lag_mean", "Mean policy lag (weight versions) of the last iteration's batches."
        )
        self.policy_lag_max = self._gauge("rlightning_policy_lag_max", "Largest policy lag of the last iteration.")
        self.dropped_batches = self._gauge(
            "rlightning_dropped_batches", "Evaluator batches dropped since start (too old or invalid)."
        )
        self.waiting_for_data = self._gauge(
            "rlightning_train_waiting_for_data_seconds", "Seconds the trainers have waited for the fleet's data now."
        )
        self.checkpoint_seconds = self._gauge(
            "rlightning_checkpoint_seconds", "Seconds the last checkpoint took to write (a grace period must cover it)."
        )
        self.attempt = self._gauge(
            "rlightning_train_attempt", "The trainer gang's attempt: 0, then 1 more at each restart of the gang."
        )


class EvaluatorMetrics(_Metrics):
    """Gauges of one evaluator.

    Args:
        port (int): Port of the /metrics endpoint; 0 creates the metrics without serving them.
        bind_host (str | None, optional): The address the endpoint binds; None: all interfaces. Defaults to None.
    """

    def _create(self) -> None:
        self.eval_return = self._gauge("rlightning_eval_return", "Mean return of the last report.")
        self.weight_version = self._gauge("rlightning_weight_version", "Weight version applied.")
        self.episodes = self._counter("rlightning_eval_episodes", "Evaluation episodes finished.")
        self.env_steps = self._counter("rlightning_eval_env_steps", "Env steps of training batches produced.")
        self.batches = self._counter("rlightning_eval_batches_sent", "Training batches sent to the trainers.")
