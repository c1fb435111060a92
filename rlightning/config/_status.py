"""status of a PolicyGroup: written by the operator (children, conditions) and trainer rank 0 (training)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlightning.config._base import StrictModel

Phase = Literal["Pending", "Running", "Restarting", "Succeeded", "Failed", "Invalid"]


class Condition(StrictModel):
    """A Kubernetes-style condition (metav1.Condition)."""

    type: str = Field(description="Condition type, for example Ready, TrainersReady, EvaluatorsReady, Valid.")
    status: Literal["True", "False", "Unknown"] = Field(description="True, False or Unknown.")
    reason: str = Field(default="", description="CamelCase reason for the last transition.")
    message: str = Field(default="", description="Human-readable detail.")
    last_transition_time: str | None = Field(default=None, description="RFC 3339 time of the last status change.")
    observed_generation: int | None = Field(default=None, description="metadata.generation this was computed for.")


class TrainStatus(StrictModel):
    """Trainer pods of the Job."""

    desired: int = Field(default=0, ge=0, description="Trainer pods wanted (spec.train.nodes).")
    ready: int = Field(default=0, ge=0, description="Trainer pods running and ready.")
    succeeded: int = Field(default=0, ge=0, description="Trainer pods that completed.")
    failed: int = Field(default=0, ge=0, description="Trainer pod failures counted by the Job.")
    summary: str = Field(default="", description="'<ready>/<desired>', the TRAINERS column of kubectl get.")
    attempt: int = Field(
        default=0, ge=0, description="Attempt of the trainer gang: 0 first, one more at each restart of the gang."
    )


class RestartStatus(StrictModel):
    """Restarts of the trainer gang, each a new attempt."""

    total: int = Field(default=0, ge=0, description="Restarts so far (failures + disruptions): the RESTARTS column.")
    failures: int = Field(
        default=0, ge=0, description="Restarts caused by a failed trainer pod (bounded by spec.train.maxRestarts)."
    )
    disruptions: int = Field(
        default=0,
        ge=0,
        description="Restarts caused by a trainer pod deleted, evicted, preempted or lost with its node.",
    )
    reason: str = Field(
        default="",
        description="Why the gang last restarted: Preempted, NodeLost, Evicted, Failed or PodDeleted.",
    )
    by_reason: dict[str, int] = Field(
        default_factory=dict, description="Restarts so far by reason (the keys of reason), e.g. {Preempted: 2}."
    )
    pod: str = Field(default="", description="The trainer pod whose failure or loss caused the last restart.")
    message: str = Field(default="", description="What happened to that pod.")


class EvalStatus(StrictModel):
    """Evaluator pods of the StatefulSet."""

    desired: int = Field(default=0, ge=0, description="Evaluators wanted (spec.eval.replicas).")
    ready: int = Field(default=0, ge=0, description="Evaluators running and ready.")
    summary: str = Field(
        default="",
        description="'<ready>/<desired>', then ':stopped' or ':serving' after training: the EVALUATORS column.",
    )
    after_training: Literal["", "Stopped", "Serving"] = Field(
        default="",
        description=(
            "Once training has ended: Stopped (scaled to zero) or Serving the final weights (spec.eval.afterTraining); "
            "empty while training runs."
        ),
    )


class CheckpointReport(StrictModel):
    """The last checkpoint trainer rank 0 wrote."""

    iteration: int = Field(default=0, ge=0, description="The iteration it holds (this attempt's own count).")
    seconds: float = Field(
        default=0.0, ge=0,
        description="How long writing it took, in seconds: what a pod's grace period must cover after SIGTERM.",
    )
    request: str | None = Field(
        default=None,
        description="The checkpoint request it answered (the PolicyGroup's annotation "
        "rlightning.io/checkpoint-request); null for a periodic or final one.",
    )
    written_at: str | None = Field(default=None, description="RFC 3339 time it was committed.")


class TrainingStatus(StrictModel):
    """Progress reported by trainer rank 0."""

    attempt: int = Field(default=0, ge=0, description="The trainer gang's attempt that wrote this report.")
    iteration: int = Field(default=0, ge=0, description="Training iterations done in the run, over every attempt.")
    env_steps: int = Field(
        default=0, ge=0, description="Environment steps trained on in the run, summed over ranks and attempts."
    )
    attempt_env_steps: int | None = Field(
        default=None, ge=0, description="Environment steps trained on by this attempt alone, summed over ranks."
    )
    weight_version: int = Field(default=0, ge=0, description="Newest weight version published to evaluators.")
    train_return: float | None = Field(default=None, description="Mean return of recent training episodes.")
    eval_return: float | None = Field(default=None, description="Mean return reported by the evaluators.")
    consistent: bool | None = Field(
        default=None,
        description=(
            "Whether every evaluator's weights match the trainer's (digest and fingerprint); null when no evaluator's "
            "report was compared."
        ),
    )
    consistent_reason: str | None = Field(
        default=None,
        description="Why consistent is null (no evaluator's report compared) or, in the final report, false.",
    )
    last_sync_seconds: float | None = Field(default=None, ge=0, description="Duration of the last sync in seconds.")
    last_sync_bytes: int | None = Field(default=None, ge=0, description="Bytes sent by the last sync.")
    env_steps_per_second: float | None = Field(
        default=None, ge=0, description="Env steps trained on per second in the last iteration."
    )
    policy_lag_mean: float | None = Field(
        default=None, ge=0, description="Mean policy lag (weight versions) of the evaluator batches trained on last."
    )
    policy_lag_max: int | None = Field(default=None, ge=0, description="Largest policy lag trained on last.")
    dropped_batches: int = Field(
        default=0, ge=0, description="Evaluator batches dropped since start (older than maxPolicyLag, or invalid)."
    )
    waiting_for_data_seconds: float | None = Field(
        default=None,
        ge=0,
        description=(
            "Seconds the trainers have been waiting for the evaluators' batches (training paused); null when not."
        ),
    )
    last_checkpoint: CheckpointReport | None = Field(
        default=None,
        description="The last checkpoint the trainers wrote (an earlier attempt's until this one writes one).",
    )
    updated_at: str | None = Field(default=None, description="RFC 3339 time of this report.")


class PolicyGroupStatus(StrictModel):
    """The whole status subresource."""

    phase: Phase | None = Field(default=None, description="Pending, Running, Restarting, Succeeded, Failed or Invalid.")
    observed_generation: int | None = Field(default=None, description="metadata.generation last reconciled.")
    conditions: list[Condition] = Field(default_factory=list, description="Latest observations, one per type.")
    train: TrainStatus = Field(default_factory=TrainStatus, description="Trainer pods.")
    eval: EvalStatus = Field(default_factory=EvalStatus, description="Evaluator pods.")
    replicas: int = Field(default=0, ge=0, description="Evaluator pods that exist (scale subresource).")
    selector: str = Field(default="", description="Label selector of evaluator pods (scale subresource, HPA).")
    restarts: RestartStatus = Field(default_factory=RestartStatus, description="Restarts of the trainer gang.")
    training: TrainingStatus = Field(default_factory=TrainingStatus, description="Progress from trainer rank 0.")
