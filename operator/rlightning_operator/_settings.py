"""Operator settings: typed, with defaults, read from `RLIGHTNING_OPERATOR_*` environment variables.

Command-line flags (`__main__`) override the environment. The Helm chart sets these variables.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from rlightning import contract

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
        description="Port of kopf's liveness endpoint /healthz on 0.0.0.0; 0 disables it.",
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
    api_timeout_seconds: float = Field(
        default=30.0, gt=0, le=600, description="Bound on each request of the reconciler to the API server."
    )
    workers: int = Field(
        default=16,
        ge=1,
        le=256,
        description="Threads running reconciles (and API connections kept); bounds concurrent reconciles.",
    )

    @model_validator(mode="after")
    def _scope(self) -> OperatorSettings:
        if self.all_namespaces and self.namespaces:
            raise ValueError("set either namespaces or all_namespaces, not both")
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
            elif name == "all_namespaces":
                values[name] = raw.strip().lower() in ("1", "true", "yes")
            else:
                values[name] = raw.strip()
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls.model_validate(values)
