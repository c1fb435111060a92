"""Operator settings: typed, with defaults, read from `RLIGHTNING_OPERATOR_*` environment variables.

Command-line flags (`__main__`) override the environment. The Helm chart sets these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlightning import contract
from rlightning_operator._builders import NetworkPolicyOptions

ENV_PREFIX = "RLIGHTNING_OPERATOR_"
RETRY_DELAYS_SECONDS = (1.0, 2.0, 5.0, 10.0, 30.0, 60.0)
"""Backoff, by attempt, of a reconcile after an API error or while a child blocks it (being deleted, another
owner's), for handlers and child-triggered refreshes alike; every 60 s from the sixth attempt on."""


def retry_delay(attempt: int) -> float:
    """Seconds to wait before retry number `attempt` (0-based) of a reconcile: `RETRY_DELAYS_SECONDS`, capped.

    Args:
        attempt (int): Failed or blocked attempts so far.

    Returns:
        float: The delay in seconds.
    """
    return RETRY_DELAYS_SECONDS[min(attempt, len(RETRY_DELAYS_SECONDS) - 1)]


class OperatorSettings(BaseModel):
    """How the operator runs. Each field maps to `RLIGHTNING_OPERATOR_<FIELD IN UPPER CASE>`."""

    model_config = ConfigDict(extra="forbid")

    namespaces: list[str] = Field(
        default_factory=list,
        description="Namespaces to serve (env: comma-separated). Empty with all_namespaces false: 'default'.",
    )
    all_namespaces: bool = Field(
        default=False, description="Serve every namespace (cluster-wide watches; needs a ClusterRole)."
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description="Log level.")
    log_format: Literal["text", "json"] = Field(
        default="text", description="text for people, json (one object per line) for log collectors."
    )
    health_port: int = Field(
        default=contract.OPERATOR_HEALTH_PORT,
        ge=0,
        le=65535,
        description="Port of the liveness endpoint /healthz on 0.0.0.0 (`_health`); 0 disables it.",
    )
    metrics_port: int = Field(
        default=contract.OPERATOR_METRICS_PORT,
        ge=0,
        le=65535,
        description="Port of the Prometheus metrics endpoint on 0.0.0.0; 0 disables it.",
    )
    refresh_delay_seconds: float = Field(
        default=0.5,
        ge=0,
        le=60,
        description=(
            "Seconds a child's change (Job, StatefulSet) waits before the PolicyGroup is reconciled, so that a "
            "burst of changes (1000 pods becoming ready) costs one reconcile, not one per change."
        ),
    )
    pass_interval_seconds: float = Field(
        default=2.0,
        ge=0,
        le=60,
        description=(
            "Least seconds between the starts of two passes of one PolicyGroup that the operator schedules itself "
            "(its children's and pods' changes, retries, rechecks): a group whose pods become ready one by one "
            "gets a status write every few seconds, not one per pod (the first change still waits only "
            "refresh_delay_seconds)."
        ),
    )
    api_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="Bound on each request of the reconciler to the API server."
    )
    workers: int = Field(
        default=16,
        ge=1,
        le=256,
        description=(
            "Threads running reconciles (and API connections kept); bounds concurrent reconciles, and kopf's "
            "connections beside its watches (its annotation patches and Events)."
        ),
    )

    watch_server_timeout_seconds: int = Field(
        default=30,
        gt=0,
        le=3600,
        description=(
            "timeoutSeconds of every watch request: the API server ends each watch after this long and kopf "
            "reconnects from the last resourceVersion, so no watch lives on a connection older than this. "
            "Whole seconds: the API server parses an integer."
        ),
    )
    watch_client_timeout_seconds: float = Field(
        default=45.0,
        gt=0,
        le=3600,
        description=(
            "Client-side bound on every watch request: a watch whose connection went quiet (dropped without a "
            "reset) is abandoned and made again after this long. Must exceed watch_server_timeout_seconds."
        ),
    )
    api_silence_limit_seconds: float = Field(
        default=60.0,
        gt=0,
        le=3600,
        description=(
            "The liveness endpoint fails once no request to the API server has been answered for this long "
            "(the operator asks at least every heartbeat_seconds), so the kubelet restarts an operator cut off "
            "from the API server."
        ),
    )
    heartbeat_seconds: float = Field(
        default=5.0,
        gt=0,
        le=600,
        description="Period of the operator's own light request (GET /version) when nothing else was answered.",
    )
    leader_election: bool = Field(
        default=False,
        description=(
            "Act only while holding the coordination.k8s.io Lease `lease_name` in `lease_namespace`, so that any "
            "number of replicas may run (the Helm chart turns it on); off, the process acts at once."
        ),
    )
    lease_namespace: str = Field(default="default", description="Namespace of the leader-election Lease.")
    lease_name: str = Field(default="rlightning-operator", description="Name of the leader-election Lease.")
    lease_duration_seconds: float = Field(
        default=15.0,
        ge=1,
        le=600,
        description=(
            "How long a standby waits, after the holder's last renewal it observed, before it takes the Lease "
            "(client-go's and controller-runtime's default, 15 s)."
        ),
    )
    renew_deadline_seconds: float = Field(
        default=10.0,
        ge=1,
        le=600,
        description=(
            "The holder stops acting (exits) when it could not renew the Lease for this long (client-go's "
            "default, 10 s); below lease_duration_seconds, so it stops before a standby may take over."
        ),
    )
    retry_period_seconds: float = Field(
        default=2.0,
        ge=0.1,
        le=600,
        description="Period of renewals and of a standby's attempts (client-go's default, 2 s).",
    )

    network_policy: bool = Field(
        default=True,
        description=(
            "Give each PolicyGroup's trainers a NetworkPolicy that admits only the group's own pods (and the "
            "metrics scrapers to the metrics port); turn off on clusters without NetworkPolicy support."
        ),
    )
    network_policy_metrics_namespace: str = Field(
        default="",
        pattern=r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)?$",
        description=(
            "Namespace whose pods may scrape the trainers' metrics port (a Prometheus in `monitoring`); empty: "
            "every pod of the PolicyGroup's own namespace."
        ),
    )

    @property
    def network_policy_options(self) -> NetworkPolicyOptions | None:
        """The reconciler's NetworkPolicy options; None when `network_policy` is off."""
        if not self.network_policy:
            return None
        return NetworkPolicyOptions(metrics_namespace=self.network_policy_metrics_namespace)

    @model_validator(mode="after")
    def _scope(self) -> OperatorSettings:
        if self.all_namespaces and self.namespaces:
            raise ValueError("set either namespaces or all_namespaces, not both")
        if self.watch_client_timeout_seconds <= self.watch_server_timeout_seconds:
            raise ValueError("watch_client_timeout_seconds must exceed watch_server_timeout_seconds")
        # client-go's rules: the holder gives up before a standby may take over, and retries before giving up.
        if not self.retry_period_seconds < self.renew_deadline_seconds < self.lease_duration_seconds:
            raise ValueError(
                "retry_period_seconds < renew_deadline_seconds < lease_duration_seconds must hold"
            )
        return self

    @property
    def served_namespaces(self) -> list[str]:
        """Namespaces passed to kopf; empty when cluster-wide."""
        if self.all_namespaces:
            return []
        return sorted(self.namespaces) or ["default"]

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides: object) -> OperatorSettings:
        """Settings from `RLIGHTNING_OPERATOR_*` variables, then `overrides` (non-None values) on top.

        Args:
            environ (Mapping[str, str] | None, optional): The environment. Defaults to os.environ.
            **overrides (object): Field values from the command line; None means "not given".

        Returns:
            OperatorSettings: Validated settings.

        Raises:
            pydantic.ValidationError: A variable or flag has an invalid value (the message names the field).
        """
        environ = os.environ if environ is None else environ
        values: dict[str, object] = {}
        for name in cls.model_fields:
            raw = environ.get(ENV_PREFIX + name.upper())
            if raw is None:
                continue
            if name == "namespaces":
                values[name] = [item.strip() for item in raw.split(",") if item.strip()]
            elif name in ("all_namespaces", "leader_election", "network_policy"):
                values[name] = raw.strip().lower() in ("1", "true", "yes")
            else:
                values[name] = raw.strip()
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls.model_validate(values)
