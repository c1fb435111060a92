"""The pure status function: observed children -> the part of a PolicyGroup's status the operator owns.

The operator owns `phase`, `observedGeneration`, `conditions`, `train`, `eval`, `restarts`, `replicas` and
`selector`; `training` belongs to trainer rank 0 and is never written here (the status patch is a JSON merge
patch without that key). Condition types: Valid, TrainersReady, EvaluatorsReady, Admitted (only when the trainer
Job names a Kueue queue), CheckpointsPersistent, TrainerRestarting (once the gang restarted), DataFlowing (while
training runs and rank 0 has reported), TrainingProgressing (while every trainer pod is ready: whether rank 0 of the
current attempt reports, within `Observation.stall_seconds`; reasons Starting, Iterating, NotStarted, Stalled),
Ready (Valid, TrainersReady and EvaluatorsReady), CheckpointWithinGracePeriod (once rank 0 reported a checkpoint:
whether it took less than the trainer pods' grace period, `_disruption.checkpoint_grace`).
DataFlowing is read from what the trainer reports (status.training `waitingForDataSeconds`): False, reason
WaitingForData, once the trainers have waited `DATA_WAIT_SECONDS` for the evaluators' batches (training paused);
it is not part of Ready (every pod is ready; the data is not there). A suspended trainer Job (waiting for Kueue's
admission) is not stuck: TrainersReady is False with reason Queued and the phase stays Pending.

The trainer gang is classified once (`classify`: a `TrainerState`), and tables give the phase (`PHASES`) and
TrainersReady (`TRAINERS_READY`, one small function per state). Trainer pods that succeeded while their Job is not
Complete yet are a gang finishing (`Finishing`: phase Running, TrainersReady True), never one forming.

Restarts of the trainer gang (`_planner.plan_restart`): while attempt N+1 forms (the Job of attempt N goes, the
new one's pods are not all ready) the phase is `Restarting`, TrainersReady says `Restarting` with the lost pod,
and TrainerRestarting is True with the restart's reason (`_disruption.restart_reason`: Preempted, NodeLost, Evicted,
Failed, PodDeleted). A Job failed after spec.train.maxRestarts restarts caused by failures gives reason
MaxRestartsReached. Once training has ended, evaluators are `Stopped` (scaled to zero) or `Serving`
(spec.eval.afterTraining).

Validity has two sources: the operator's structural validation (`Observation.problems`, reason InvalidSpec)
and the pods' deep checks (policyClass, policyKwargs, env id; only the runtime can run them): a trainer Job
failed by its pod failure policy on `contract.EXIT_BAD_MANIFEST` gives phase Invalid with Valid=False, reason
InvalidSpecInPod.

While pods are not ready, their own status says why (`_pods`): TrainersReady or EvaluatorsReady is False with
reason CrashLoopBackOff (the pod, container, last exit code and restarts), Unschedulable (the scheduler's
message) or, for evaluators, RolloutStuck (a pod of the new revision holds the rolling update); Waiting when
none of these shows. Ready takes the reason of the first condition that is not True, which `kubectl get pg`
shows in its REASON column.

Pods the operator force-deleted from a node that stopped answering (`Observation.unreachable`): TrainersReady or
EvaluatorsReady (the pods' role) ends its message with `node N unreachable since T` until it is True again, their
replacements ready (`unreachable_left` says which to keep naming).
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rlightning import contract, launch
from rlightning_operator import _builders as builders
from rlightning_operator import _disruption as disruption
from rlightning_operator import _pods as pods

OWNED_FIELDS = ("phase", "observedGeneration", "conditions", "train", "eval", "restarts", "replicas", "selector")
RESTARTING = "Restarting"
FINISHING = "Finishing"
MAX_RESTARTS_REACHED = "MaxRestartsReached"
CHECKPOINTS_NOT_PERSISTENT = "CheckpointsNotPersistent"
WAITING_FOR_DATA = "WaitingForData"
DATA_WAIT_SECONDS = 30.0
"""Seconds the trainers wait for the fleet's batches before DataFlowing turns False (as long as the trainer's own
warning interval, `rlightning.runtime._records.WAITING_LOG_SECONDS`: shorter waits are an evaluator reconnecting or a
weight version being applied)."""
PROGRESSING = "TrainingProgressing"
NOT_STARTED = "NotStarted"
STALLED = "Stalled"
WARNING_REASONS = (
    MAX_RESTARTS_REACHED, WAITING_FOR_DATA, NOT_STARTED, STALLED, disruption.CHECKPOINT_SLOWER_THAN_GRACE,
)
"""Reasons of this module whose appearance is posted as a Warning Event (beside `_pods.REASONS`)."""
RESTART_FIELDS = ("total", "failures", "disruptions", "reason", "pod", "message", "byReason")
"""Keys of status.restarts (`rlightning.config.RestartStatus`); `reason` is one of `_disruption.RESTART_REASONS`."""
Stranded = pods.Stranded  # in `Observation`'s annotations its field `pods` hides the module


@dataclasses.dataclass(frozen=True)
class Observation:
    """What the status is computed from.

    Attributes:
        name (str): metadata.name of the PolicyGroup.
        generation (int): metadata.generation of the PolicyGroup.
        problems (Sequence[str]): Validation problems (`"<field>: <rule>"`); empty when the spec is valid.
        nodes (int): Trainer pods desired (spec.train.nodes); 0 when invalid.
        replicas (int): Evaluators desired (spec.eval.replicas); 0 when invalid.
        job (Mapping[str, Any] | None): The trainers' Job as read, or None.
        stateful_set (Mapping[str, Any] | None): The evaluators' StatefulSet as read, or None.
        pods (Sequence[Mapping[str, Any]]): The group's pods as read (only while `pods_matter`), or ().
        conflicts (Sequence[str]): Children that another owner controls, as `Kind/name: <reason>`.
        previous (Sequence[Mapping[str, Any]]): The conditions currently in status (for lastTransitionTime).
        now (str): RFC 3339 time used for conditions that change.
        attempt (int): The trainer gang's current attempt; a Job of another one is being replaced.
        restarts (Mapping[str, Any]): status.restarts to write (keys `RESTART_FIELDS`).
        max_restarts (int): spec.train.maxRestarts.
        after_training (str): spec.eval.afterTraining, `Stop` or `Serve`.
        checkpoints_persistent (bool): Whether the trainers' run directory is a PersistentVolumeClaim.
        fleet_data (bool): Whether the trainers learn from the evaluators' batches (`launch.fleet_collects`).
        training (Mapping[str, Any]): status.training as trainer rank 0 last wrote it ({} before its first report).
        stall_seconds (float): How long ready trainers may go without a report of an iteration
            (`launch.stall_seconds`); 0 leaves condition TrainingProgressing out.
        unreachable (Sequence[Stranded]): Pods force-deleted from nodes that stopped answering, until their
            role is ready again (`unreachable_left`): TrainersReady or EvaluatorsReady names the nodes meanwhile.
        grace_seconds (int): The trainer pods' terminationGracePeriodSeconds; 0 leaves condition
            CheckpointWithinGracePeriod out (`_disruption.checkpoint_grace`).
    """

    name: str
    generation: int
    problems: Sequence[str] = ()
    nodes: int = 0
    replicas: int = 0
    job: Mapping[str, Any] | None = None
    stateful_set: Mapping[str, Any] | None = None
    pods: Sequence[Mapping[str, Any]] = ()
    conflicts: Sequence[str] = ()
    previous: Sequence[Mapping[str, Any]] = ()
    now: str = ""
    attempt: int = 0
    restarts: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    max_restarts: int = 0
    after_training: str = "Stop"
    checkpoints_persistent: bool = True
    fleet_data: bool = False
    training: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    stall_seconds: float = 0.0
    unreachable: Sequence[Stranded] = ()
    grace_seconds: int = 0


def _job_condition(job: Mapping[str, Any] | None, type_: str) -> Mapping[str, Any] | None:
    """The Job's condition `type_` when its status is True, else None."""
    for condition in ((job or {}).get("status") or {}).get("conditions") or []:
        if condition.get("type") == type_ and condition.get("status") == "True":
            return condition
    return None


def training_ended(job: Mapping[str, Any] | None, attempt: int) -> bool:
    """Whether the Job of the gang's current attempt is Complete or Failed (no restart follows a Failed one that
    `_planner.plan_restart` left alone: exit code 2, or no restart left).

    Args:
        job (Mapping[str, Any] | None): The trainers' Job as read.
        attempt (int): The current attempt.

    Returns:
        bool: True once training has ended.
    """
    if job is None or builders.attempt_of(job) != attempt:
        return False
    return bool(_job_condition(job, "Complete") or _job_condition(job, "Failed"))


def _rejected_in_pod(failed: Mapping[str, Any] | None) -> bool:
    """Whether the Job failed through its pod failure policy: its only FailJob rules match a container exiting
    with `contract.EXIT_BAD_MANIFEST` (builders.build_train), so the runtime rejected the spec.

    The Job controller gives its Failed condition the reason `PodFailurePolicy` then (Kubernetes API reference,
    JobCondition; `batch.JobReasonPodFailurePolicy`).
    """
    return failed is not None and failed.get("reason") == pods.POD_FAILURE_POLICY_REASON


def _condition(type_: str, ok: bool, reason: str, message: str, observation: Observation) -> dict[str, Any]:
    status = "True" if ok else "False"
    transition = observation.now
    for previous in observation.previous:
        if previous.get("type") == type_ and previous.get("status") == status and previous.get("lastTransitionTime"):
            transition = previous["lastTransitionTime"]
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": observation.generation,
    }


class TrainerState(enum.StrEnum):
    """What the trainer gang of the current attempt is doing, classified once per status pass (`classify`)."""

    REJECTED = "Rejected"
    """The Job failed through its pod failure policy: a pod rejected the spec."""
    FAILED = "Failed"
    """The Job failed with no restart left."""
    COMPLETE = "Complete"
    """The Job is Complete."""
    FINISHING = "Finishing"
    """Some trainer pod of the attempt succeeded while the Job is not Complete yet: the gang is ending, not forming."""
    RESTARTING = "Restarting"
    """A restart's attempt forms: its Job is missing (the old one goes) or not all its pods are ready."""
    MISSING = "Missing"
    """No Job of the current attempt, and no restart so far."""
    SUSPENDED = "Suspended"
    """The Job is suspended (waiting for Kueue's admission, or by someone else)."""
    RUNNING = "Running"
    """Every trainer pod is ready."""
    WAITING = "Waiting"
    """Some trainer pod is not ready yet."""


PHASES: Mapping[TrainerState, str] = {
    TrainerState.REJECTED: "Invalid",
    TrainerState.FAILED: "Failed",
    TrainerState.COMPLETE: "Succeeded",
    TrainerState.FINISHING: "Running",
    TrainerState.RESTARTING: RESTARTING,
    TrainerState.MISSING: "Pending",
    TrainerState.SUSPENDED: "Pending",
    TrainerState.RUNNING: "Running",
    TrainerState.WAITING: "Pending",
}
"""status.phase by the trainer gang's state."""
ENDED = frozenset({TrainerState.REJECTED, TrainerState.FAILED, TrainerState.COMPLETE})
"""States in which training has ended (`training_ended`): evaluators stop or serve."""


@dataclasses.dataclass(frozen=True)
class Trainers:
    """The trainer gang of the current attempt as observed.

    Attributes:
        state (TrainerState): What it is doing.
        job (Mapping[str, Any] | None): The Job of the current attempt (None while another attempt's goes).
        ready (int): Its ready pods.
        finished (int): Its pods that succeeded (the Job's count, or the pods' phase when the Job lags).
        pods (Sequence[Mapping[str, Any]]): The trainer pods of the current attempt (read only while some is not
            ready).
        failed (Mapping[str, Any] | None): The Job's Failed condition.
    """

    state: TrainerState
    job: Mapping[str, Any] | None
    ready: int
    finished: int
    pods: Sequence[Mapping[str, Any]]
    failed: Mapping[str, Any] | None

    @property
    def job_status(self) -> Mapping[str, Any]:
        """The trainer Job's `.status` (empty before the Job exists or has one)."""
        return (self.job or {}).get("status") or {}


def classify(obs: Observation) -> Trainers:
    """Classify the trainer gang of the current attempt (the first state that holds, in `TrainerState`'s order).

    Args:
        obs (Observation): What the status is computed from.

    Returns:
        Trainers: The state and the figures the conditions read.
    """
    # A Job of another attempt is on its way out: the current attempt has no Job yet.
    job = obs.job if obs.job is not None and builders.attempt_of(obs.job) == obs.attempt else None
    job_status = (job or {}).get("status") or {}
    ready = int(job_status.get("ready") or 0)
    trainers = [p for p in _of_role(obs.pods, contract.PolicyRole.TRAIN) if builders.attempt_of(p) == obs.attempt]
    succeeded = sum((p.get("status") or {}).get("phase") == "Succeeded" for p in trainers)
    finished = max(int(job_status.get("succeeded") or 0), succeeded)
    failed = _job_condition(job, "Failed")
    checks = (
        (TrainerState.REJECTED, lambda: _rejected_in_pod(failed)),
        (TrainerState.FAILED, lambda: failed is not None),
        (TrainerState.COMPLETE, lambda: _job_condition(job, "Complete") is not None),
        # A trainer exits 0 only once the ranks agreed to stop: the others finish too, then the Job is Complete.
        (TrainerState.FINISHING, lambda: job is not None and finished > 0),
        (TrainerState.RESTARTING, lambda: bool(obs.restarts.get("total")) and (job is None or ready < obs.nodes)),
        (TrainerState.MISSING, lambda: job is None),
        (TrainerState.SUSPENDED, lambda: _suspended(job)),
        (TrainerState.RUNNING, lambda: ready >= obs.nodes),
    )
    state = next((state for state, holds in checks if holds()), TrainerState.WAITING)
    return Trainers(state, job, ready, finished, trainers, failed)


def _trainers_rejected(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    detail = (gang.failed or {}).get("message") or f"a container exited with code {contract.EXIT_BAD_MANIFEST}"
    return False, "InvalidSpecInPod", (
        f"a trainer pod rejected the spec ({detail}); see `kubectl logs job/{contract.train_name(obs.name)} "
        f"-c {contract.VALIDATE_CONTAINER}`"
    )


def _trainers_failed(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    # `_planner.plan_restart` restarts a failed attempt while it may: none is left
    restarts = _restarts(obs)
    last = f"; the last restart: {restarts['message']}" if restarts["message"] else ""
    return False, MAX_RESTARTS_REACHED, (
        f"the trainer Job failed ({(gang.failed or {}).get('reason') or 'Failed'}) with no restart left: "
        f"{restarts['failures']} of spec.train.maxRestarts {obs.max_restarts} used{last}"
    )


def _trainers_complete(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    return True, "Completed", "training completed"


def _trainers_finishing(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    return True, FINISHING, f"training ends: {gang.finished}/{obs.nodes} trainer pods finished, the Job completes next"


def _trainers_restarting(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    message = (f"attempt {obs.attempt} forming after {_restarts(obs)['message']}; "
               f"{gang.ready}/{obs.nodes} trainer pods ready")
    problem = pods.diagnose(gang.pods)
    return False, RESTARTING, message if problem is None else f"{message}; {problem.message}"


def _trainers_missing(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    return False, "JobMissing", f"Job {contract.train_name(obs.name)} does not exist"


def _trainers_suspended(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    # waiting for admission (Kueue): no pods yet is no problem
    return False, *_suspension(gang.job)


def _trainers_running(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    return True, "AllReady", f"{gang.ready}/{obs.nodes} trainer pods ready"


def _trainers_waiting(obs: Observation, gang: Trainers) -> tuple[bool, str, str]:
    message = f"{gang.ready}/{obs.nodes} trainer pods ready"
    problem = pods.diagnose(gang.pods, int(gang.job_status.get("failed") or 0))
    return (False, "Waiting", message) if problem is None else (False, problem.reason, f"{message}; {problem.message}")


TRAINERS_READY: Mapping[TrainerState, Callable[[Observation, Trainers], tuple[bool, str, str]]] = {
    TrainerState.REJECTED: _trainers_rejected,
    TrainerState.FAILED: _trainers_failed,
    TrainerState.COMPLETE: _trainers_complete,
    TrainerState.FINISHING: _trainers_finishing,
    TrainerState.RESTARTING: _trainers_restarting,
    TrainerState.MISSING: _trainers_missing,
    TrainerState.SUSPENDED: _trainers_suspended,
    TrainerState.RUNNING: _trainers_running,
    TrainerState.WAITING: _trainers_waiting,
}
"""TrainersReady's (status, reason, message) by the trainer gang's state."""


def compute_status(observation: Observation) -> dict[str, Any]:
    """The operator's part of status.

    Args:
        observation (Observation): The PolicyGroup's generation and validity, and its observed children.

    Returns:
        dict[str, Any]: camelCase keys `OWNED_FIELDS` (a JSON merge patch for the status subresource).
    """
    obs = observation
    if obs.problems:
        return _invalid_status(obs)
    gang = classify(obs)
    train_ok, train_reason, train_message = TRAINERS_READY[gang.state](obs, gang)
    trainers_ready = _naming_unreachable(_condition("TrainersReady", train_ok, train_reason, train_message, obs), obs,
                                         contract.PolicyRole.TRAIN)
    evaluators_ready, after_training = _evaluators_condition(obs, gang)
    evaluators_ready = _naming_unreachable(evaluators_ready, obs, contract.PolicyRole.EVAL)
    valid = (_condition("Valid", False, train_reason, train_message, obs) if gang.state is TrainerState.REJECTED
             else _condition("Valid", True, "Validated", "the spec is valid", obs))
    conditions = [valid, trainers_ready, evaluators_ready]
    admitted = _admitted_condition(obs)
    if admitted is not None:
        conditions.append(admitted)
    ready = _ready_condition(obs, conditions)  # the extra conditions below are not part of Ready
    extra = [_checkpoints_condition(obs)]
    if obs.restarts.get("total"):
        extra.append(_restarting_condition(obs, gang.state))
    if gang.state is TrainerState.RUNNING and obs.training:
        extra.append(_data_condition(obs))
    if gang.state is TrainerState.RUNNING and obs.stall_seconds:
        extra.append(_progress(obs, trainers_ready["lastTransitionTime"])[0])
    grace = disruption.checkpoint_grace(obs.training, obs.grace_seconds) if obs.grace_seconds else None
    if grace is not None:
        extra.append(_condition(disruption.CHECKPOINT_GRACE, *grace, obs))
    conditions += [*extra, ready]
    eval_desired = 0 if after_training == "Stopped" else obs.replicas
    eval_ready = _eval_ready(obs)
    return {
        "phase": PHASES[gang.state],
        "observedGeneration": obs.generation,
        "conditions": conditions,
        "train": {
            "desired": obs.nodes,
            "ready": gang.ready,
            "succeeded": int(gang.job_status.get("succeeded") or 0),
            "failed": int(gang.job_status.get("failed") or 0),
            "summary": f"{gang.ready}/{obs.nodes}",
            "attempt": obs.attempt,
        },
        "eval": {
            "desired": eval_desired,
            "ready": eval_ready,
            # No space: `kubectl get pg` shows it as one column.
            "summary": f"{eval_ready}/{eval_desired}" + (f":{after_training.lower()}" if after_training else ""),
            "afterTraining": after_training,
        },
        "restarts": _restarts(obs),
        "replicas": int((((obs.stateful_set or {}).get("status") or {}).get("replicas")) or 0),
        "selector": builders.selector_string(obs.name, contract.PolicyRole.EVAL),
    }


def _invalid_status(obs: Observation) -> dict[str, Any]:
    """The status of a spec the operator's validation refused (`Observation.problems`)."""
    message = "; ".join(obs.problems)
    valid = _condition("Valid", False, "InvalidSpec", message, obs)
    ready = _condition("Ready", False, "InvalidSpec", "the spec is invalid: " + message, obs)
    return {
        "phase": "Invalid",
        "observedGeneration": obs.generation,
        "conditions": [valid, ready],
        "train": {"desired": 0, "ready": 0, "succeeded": 0, "failed": 0, "summary": "0/0", "attempt": obs.attempt},
        "eval": {"desired": 0, "ready": 0, "summary": "0/0", "afterTraining": ""},
        "restarts": _restarts(obs),
        "replicas": 0,
        "selector": builders.selector_string(obs.name, contract.PolicyRole.EVAL),
    }


def _evaluators_condition(obs: Observation, gang: Trainers) -> tuple[dict[str, Any], str]:
    """EvaluatorsReady, and status.eval.afterTraining (`Stopped`, `Serving`, or "" while training runs)."""
    after_training = ""
    if gang.state in ENDED:
        after_training = "Stopped" if obs.after_training == "Stop" else "Serving"
    if after_training == "Stopped":
        return _condition("EvaluatorsReady", True, "Stopped",
                          "training has ended: evaluators scaled to zero (spec.eval.afterTraining: Stop)", obs), \
            after_training
    if obs.stateful_set is None:
        return _condition("EvaluatorsReady", False, "StatefulSetMissing",
                          f"StatefulSet {contract.eval_name(obs.name)} does not exist", obs), after_training
    eval_ready = _eval_ready(obs)
    ok = eval_ready >= obs.replicas
    reason, message = ("AllReady" if ok else "Waiting"), f"{eval_ready}/{obs.replicas} evaluator pods ready"
    evaluators = _of_role(obs.pods, contract.PolicyRole.EVAL)
    problem = pods.stuck_rollout(obs.stateful_set, evaluators, obs.now) or pods.diagnose(evaluators)
    if not ok and problem is not None:
        reason, message = problem.reason, f"{message}; {problem.message}"
    return _condition("EvaluatorsReady", ok, reason, message, obs), after_training


# -- Nodes that stopped answering ------------------------------------------------------------------------
READINESS: Mapping[str, str] = {contract.PolicyRole.TRAIN: "TrainersReady", contract.PolicyRole.EVAL: "EvaluatorsReady"}
"""The condition that names the nodes a role's pods were force-deleted from, while it is not True."""


def _naming_unreachable(condition: dict[str, Any], obs: Observation, role: contract.PolicyRole) -> dict[str, Any]:
    """`condition` (`READINESS[role]`) with `pods.unreachable_nodes` of `role`'s pods in `obs.unreachable` at the
    end of its message, while it is not True.
    """
    nodes = pods.unreachable_nodes([left for left in obs.unreachable if left.role == role])
    if condition["status"] == "True" or not nodes:
        return condition
    return {**condition, "message": f"{condition['message']}; {nodes}"}


def unreachable_left(unreachable: Sequence[Stranded], computed: Mapping[str, Any]) -> list[Stranded]:
    """The force-deleted pods whose nodes the status must still name: those whose role's readiness condition
    (`READINESS`) in `computed` is not True. Once it is True their replacements are ready (or training ended).

    Args:
        unreachable (Sequence[Stranded]): Pods force-deleted so far and not yet replaced.
        computed (Mapping[str, Any]): `compute_status` of an observation with them.

    Returns:
        list[Stranded]: The ones to keep; a pod of no known role, or a condition absent (an invalid spec),
            keeps its pods.
    """
    status = {c["type"]: c["status"] for c in computed.get("conditions") or []}
    return [left for left in unreachable if status.get(READINESS.get(left.role, "")) != "True"]


def _ready_condition(obs: Observation, conditions: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Ready: Conflict while another owner controls a child, else the first of `conditions` not True."""
    if obs.conflicts:
        return _condition("Ready", False, "Conflict",
                          "children controlled by another owner: " + "; ".join(obs.conflicts), obs)
    not_ready = [c for c in conditions if c["status"] != "True"]
    if not not_ready:
        return _condition("Ready", True, "AllReady", "trainers and evaluators ready", obs)
    return _condition("Ready", False, not_ready[0]["reason"], not_ready[0]["message"], obs)


# -- Gang admission (Kueue) ------------------------------------------------------------------------------
QUEUED_REASON = "Queued"
"""TrainersReady's and Admitted's reason while a queued trainer Job waits for Kueue to admit it."""


def _suspended(job: Mapping[str, Any] | None) -> bool:
    return bool(((job or {}).get("spec") or {}).get("suspend"))


def _queue(job: Mapping[str, Any] | None) -> str | None:
    return (((job or {}).get("metadata") or {}).get("labels") or {}).get(contract.LABEL_KUEUE_QUEUE)


def _suspension(job: Mapping[str, Any] | None) -> tuple[str, str]:
    """(reason, message) of a suspended trainer Job: queued in Kueue, or suspended by someone else."""
    queue = _queue(job)
    if queue:
        return QUEUED_REASON, f"the trainer Job waits in Kueue queue {queue!r} for admission of all its pods at once"
    return "Suspended", "the trainer Job is suspended (spec.suspend); no trainer pod runs until it is resumed"


def _admitted_condition(obs: Observation) -> dict[str, Any] | None:
    """Condition Admitted of a PolicyGroup whose trainer Job names a Kueue queue: False (reason Queued) while the
    Job is suspended, True once Kueue un-suspended it; None for a Job in no queue (nothing admits it).
    """
    if obs.job is None or not _queue(obs.job):
        return None
    if _suspended(obs.job):
        return _condition("Admitted", False, *_suspension(obs.job), obs)
    return _condition("Admitted", True, "Admitted", f"Kueue queue {_queue(obs.job)!r} admitted the trainers", obs)


# -- The fleet's data ------------------------------------------------------------------------------------
def waiting_for_data(training: Mapping[str, Any]) -> bool:
    """Whether status.training says the trainers have waited `DATA_WAIT_SECONDS` or more for the fleet's batches."""
    waited = training.get("waitingForDataSeconds")
    return isinstance(waited, (int, float)) and waited >= DATA_WAIT_SECONDS


def data_condition_stale(group: Mapping[str, Any]) -> bool:
    """Whether a PolicyGroup's DataFlowing condition disagrees with its status.training (a status refresh is due).

    Only the trainer writes status.training, and no child changes when the data stops: the operator learns of it
    from the PolicyGroup's own events, and this keeps those events from each costing a refresh.

    Args:
        group (Mapping[str, Any]): The PolicyGroup as delivered by its watch.

    Returns:
        bool: True when the condition says the data flows while the trainers wait, or the reverse; or when a
            running PolicyGroup whose trainer reported has none yet.
    """
    group_status = group.get("status") or {}
    training = group_status.get("training") or {}
    if not training:
        return False
    current = next((c for c in group_status.get("conditions") or [] if c.get("type") == "DataFlowing"), None)
    if current is None:  # not computed since the trainer's first report
        return group_status.get("phase") == "Running"
    return (current.get("status") == "True") == waiting_for_data(training)


def _data_condition(obs: Observation) -> dict[str, Any]:
    if not obs.fleet_data:
        return _condition("DataFlowing", True, "TrainersCollect",
                          "the trainers collect their own data (spec.train.dataSource)", obs)
    if waiting_for_data(obs.training):
        return _condition("DataFlowing", False, WAITING_FOR_DATA,
                          f"the trainers have waited {obs.training['waitingForDataSeconds']:.0f} s for the evaluators' "
                          f"batches and training is paused; {_eval_ready(obs)}/{obs.replicas} evaluator pods ready",
                          obs)
    rate = obs.training.get("envStepsPerSecond")
    detail = f" ({rate:.0f} env steps/s)" if isinstance(rate, (int, float)) else ""
    return _condition("DataFlowing", True, "Flowing", f"the trainers learn from the evaluators' batches{detail}", obs)


# -- Trainers up but not training ------------------------------------------------------------------------
def _progress(obs: Observation, ready_since: str) -> tuple[dict[str, Any], float | None]:
    """TrainingProgressing of a gang whose pods are all ready, and the seconds until it would turn False (None when
    it is False already, or a time cannot be read).

    Trainer rank 0 reports when its attempt starts (after the rendezvous and the resume) and then at least every
    `launch.STATUS_REPORT_SECONDS` while its loop moves (`updatedAt`); a report of another attempt does not count.
    The messages name times, not durations up to now, so that a later pass that finds nothing new writes nothing.
    """
    report = obs.training if int(obs.training.get("attempt") or 0) == obs.attempt else {}
    margin = launch.LIVENESS_MARGIN_SECONDS + launch.STATUS_REPORT_SECONDS
    bound = f"bound {obs.stall_seconds:.0f} s: 3 x spec.weightSync.timeoutSeconds + {margin:.0f} s"
    train = contract.train_name(obs.name)
    if not report.get("updatedAt"):
        waited = _seconds_between(ready_since, obs.now)
        if waited is not None and waited > obs.stall_seconds:
            return _condition(PROGRESSING, False, NOT_STARTED, (
                f"the trainer pods have been ready since {ready_since}, longer than the {bound}, and rank 0 of "
                f"attempt {obs.attempt} has not started: the rendezvous has not formed (does {train}-0.{train} "
                f"resolve?) or its start is stuck; see `kubectl logs job/{train}`"), obs), None
        return _condition(PROGRESSING, True, "Starting",
                          f"attempt {obs.attempt}: waiting for rank 0 to start ({bound})", obs), \
            None if waited is None else obs.stall_seconds - waited
    age = _seconds_between(report["updatedAt"], obs.now)
    if age is not None and age > obs.stall_seconds:
        return _condition(PROGRESSING, False, STALLED, (
            f"no report from the trainers for longer than the {bound}: the last, at {report['updatedAt']}, was "
            f"iteration {report.get('iteration', 0)}; training does not move"), obs), None
    return _condition(PROGRESSING, True, "Iterating", f"attempt {obs.attempt} reports its iterations ({bound})",
                      obs), None if age is None else obs.stall_seconds - age


ROLLOUT_RECHECK_SECONDS = 5.0
"""While the evaluators roll to a new revision (and it is not yet reported stuck), the status is computed again this
often. A stuck rollout is read from the watched pods, and under load a pod's event alone was seen not to bring the
pass that reports it (tests/operator/test_cluster_pods.py, RolloutStuck never reported); a pass reads no object from
the API, so this costs a group nothing but while it rolls."""


def recheck_seconds(observation: Observation, computed: Mapping[str, Any]) -> float | None:
    """When the status must be computed again although nothing may change meanwhile: TrainingProgressing turns
    False with time alone, and a rolling update may get stuck on a pod (`ROLLOUT_RECHECK_SECONDS`).

    Args:
        observation (Observation): What `computed` was computed from.
        computed (Mapping[str, Any]): `compute_status(observation)`.

    Returns:
        float | None: Seconds from `observation.now` (at least 1), or None when no condition waits on time.
    """
    current = {c["type"]: c for c in computed.get("conditions") or []}
    due: list[float] = []
    stuck = (current.get("EvaluatorsReady") or {}).get("reason") == pods.ROLLOUT_STUCK
    if _rolling(observation.stateful_set) and not stuck:
        due.append(ROLLOUT_RECHECK_SECONDS)
    if PROGRESSING in current and current[PROGRESSING]["status"] == "True":
        progress_due = _progress(observation, current["TrainersReady"]["lastTransitionTime"])[1]
        if progress_due is not None:
            due.append(max(1.0, progress_due + 1.0))
    return min(due) if due else None


def progress_condition_stale(group: Mapping[str, Any]) -> bool:
    """Whether a PolicyGroup's TrainingProgressing lags status.training (a status refresh is due): it says Starting
    while rank 0 of the current attempt has reported, or it is False while a report came after it turned False
    (training moves again, or a new attempt's rank 0 started).

    Args:
        group (Mapping[str, Any]): The PolicyGroup as delivered by its watch.

    Returns:
        bool: True when a refresh would change the condition.
    """
    group_status = group.get("status") or {}
    current = next((c for c in group_status.get("conditions") or [] if c.get("type") == PROGRESSING), None)
    training = group_status.get("training") or {}
    if current is None or not training.get("updatedAt"):
        return False
    if current.get("reason") == "Starting":
        return int(training.get("attempt") or 0) == int((group_status.get("train") or {}).get("attempt") or 0)
    later = _seconds_between(current.get("lastTransitionTime") or "", training["updatedAt"])
    return current.get("status") == "False" and later is not None and later > 0


def _seconds_between(start: str, end: str) -> float | None:
    """Seconds from RFC 3339 time `start` to `end`; None when either cannot be read."""
    try:
        parsed = [datetime.datetime.fromisoformat(t.replace("Z", "+00:00")) for t in (start, end)]
        return (parsed[1] - parsed[0]).total_seconds()
    except (ValueError, TypeError):
        return None


def _restarts(obs: Observation) -> dict[str, Any]:
    defaults: dict[str, Any] = {"total": 0, "failures": 0, "disruptions": 0, "byReason": {}}
    return {field: obs.restarts.get(field, defaults.get(field, "")) for field in RESTART_FIELDS}


def _checkpoints_condition(obs: Observation) -> dict[str, Any]:
    if obs.checkpoints_persistent:
        return _condition("CheckpointsPersistent", True, "PersistentVolumeClaim",
                          "the trainers' run directory is spec.train.checkpoint.persistentVolumeClaim", obs)
    return _condition("CheckpointsPersistent", False, CHECKPOINTS_NOT_PERSISTENT,
                      "the trainers' run directory is an emptyDir: a restarted trainer gang keeps only the weight "
                      "version (from the evaluators), not weights, optimizer and progress; set "
                      "spec.train.checkpoint.persistentVolumeClaim", obs)


def _restarting_condition(obs: Observation, state: TrainerState) -> dict[str, Any]:
    restarts = _restarts(obs)
    counts = f"{restarts['total']} restarts ({restarts['failures']} failures, {restarts['disruptions']} disruptions)"
    if restarts["byReason"]:
        counts += " by reason: " + ", ".join(f"{n} {r}" for r, n in sorted(restarts["byReason"].items()))
    if state is TrainerState.RESTARTING:
        return _condition("TrainerRestarting", True, restarts["reason"] or RESTARTING,
                          f"attempt {obs.attempt} forming after {restarts['message']}; {counts}", obs)
    reason = "TrainingEnded" if state in ENDED or state is TrainerState.FINISHING else "AttemptRunning"
    return _condition("TrainerRestarting", False, reason,
                      f"attempt {obs.attempt}; {counts}; the last after {restarts['message']}", obs)


def _eval_ready(obs: Observation) -> int:
    return int((((obs.stateful_set or {}).get("status") or {}).get("readyReplicas")) or 0)


def _of_role(group_pods: Sequence[Mapping[str, Any]], role: contract.PolicyRole) -> list[Mapping[str, Any]]:
    return [p for p in group_pods if ((p.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE) == role]


def pods_matter(
    nodes: int, replicas: int, job: Mapping[str, Any] | None, stateful_set: Mapping[str, Any] | None
) -> bool:
    """Whether `compute_status` needs the pods: some trainer or evaluator is not ready, or a rollout runs.

    With every pod ready (the steady state) a status pass reads no pods.

    Args:
        nodes (int): Trainer pods desired.
        replicas (int): Evaluators desired.
        job (Mapping[str, Any] | None): The trainers' Job as read.
        stateful_set (Mapping[str, Any] | None): The evaluators' StatefulSet as read.

    Returns:
        bool: True when pods should be read.
    """
    job_status = (job or {}).get("status") or {}
    sts_status = (stateful_set or {}).get("status") or {}
    finished = _job_condition(job, "Complete") or _job_condition(job, "Failed")
    trainers_waiting = job is not None and not finished and int(job_status.get("ready") or 0) < nodes
    evaluators_waiting = stateful_set is not None and int(sts_status.get("readyReplicas") or 0) < replicas
    return trainers_waiting or evaluators_waiting or _rolling(stateful_set)


def _rolling(stateful_set: Mapping[str, Any] | None) -> bool:
    """Whether the evaluators' StatefulSet is rolling to a new revision (its update and current revisions differ)."""
    sts_status = (stateful_set or {}).get("status") or {}
    return sts_status.get("updateRevision") not in (None, sts_status.get("currentRevision"))


def pod_fingerprint(pod: Mapping[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What the status reads from one pod, as (shape, progress) like `child_fingerprint`: its problem as `_pods`
    diagnoses it (crash loop with its restarts, failure, unschedulable), its deletion and, for a trainer, its phase
    and loss. A pod that only moves along its start (scheduled, started, ready) keeps its fingerprint: the Job and
    the StatefulSet count those, and their events refresh the status. The shape never changes (a pod's change needs
    a status refresh, never a reconcile of the children).

    Args:
        pod (Mapping[str, Any]): A pod as watched.

    Returns:
        tuple[tuple[Any, ...], tuple[Any, ...]]: (("Pod",), (problem, deletion mark, trainer phase once finished,
            trainer loss)); `QUIET_POD` for a pod with nothing to report.
    """
    trainer = ((pod.get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ROLE) == contract.PolicyRole.TRAIN
    deleting = bool((pod.get("metadata") or {}).get("deletionTimestamp"))  # a trainer pod deleted ends its attempt
    phase = (pod.get("status") or {}).get("phase") if trainer else None
    phase = phase if phase in ("Succeeded", "Failed") else None  # a trainer that finished
    loss = pods.trainer_loss([pod]) if trainer else None
    return ("Pod",), (pods.diagnose([pod]), deleting, phase, loss)


QUIET_POD = pod_fingerprint({})
"""The fingerprint of a pod with nothing to report: what a pod seen for the first time is compared with."""


REFUSAL_REASONS = {403: "Forbidden", 422: "Invalid"}
"""Ready's reason by HTTP status when the API server refuses a request of a reconcile; others: `ApiRefused`."""


def refused_conditions(
    previous: Sequence[Mapping[str, Any]], generation: int, http_status: int, message: str, now: str
) -> list[dict[str, Any]] | None:
    """The conditions after the API server refused a request of a reconcile: Ready=False naming the refusal.

    Everything else in status stays as it is (the refusal left the children unobserved); the next reconcile that
    succeeds recomputes Ready.

    Args:
        previous (Sequence[Mapping[str, Any]]): The conditions currently in status.
        generation (int): metadata.generation of the PolicyGroup.
        http_status (int): The refused request's HTTP status (403 Forbidden, 422 Invalid, ...).
        message (str): What was refused and the API server's message.
        now (str): RFC 3339 time, for a Ready condition that changes.

    Returns:
        list[dict[str, Any]] | None: The conditions to write, or None when Ready already says exactly this (so
            that a retry writes nothing and posts no second Warning).
    """
    reason = REFUSAL_REASONS.get(http_status, "ApiRefused")
    observation = Observation("", generation, previous=previous, now=now)
    ready = _condition("Ready", False, reason, message, observation)
    current = next((c for c in previous if c.get("type") == "Ready"), None)
    if current is not None and all(current.get(k) == ready[k] for k in ("status", "reason", "message")):
        return None
    return [dict(c) for c in previous if c.get("type") != "Ready"] + [ready]


def child_fingerprint(child: Mapping[str, Any]) -> tuple[tuple[Any, ...], tuple[Any, ...]]:
    """What the planner and `compute_status` read from a Job or StatefulSet, as comparable tuples.

    A child event whose fingerprint equals the previous one (for example a StatefulSet's `availableReplicas`
    moving) cannot change the status or the plan, so it triggers nothing; one that changes
    only the progress part needs a status refresh, not a reconcile of every child.

    Args:
        child (Mapping[str, Any]): A Job or StatefulSet as watched.

    Returns:
        tuple[tuple[Any, ...], tuple[Any, ...]]: (shape: kind, spec hash, deletion mark, owners, desired
            replicas; progress: the status fields `compute_status` reads).
    """
    metadata = child.get("metadata") or {}
    spec = child.get("spec") or {}
    child_status = child.get("status") or {}
    conditions = tuple(sorted((c.get("type"), c.get("status")) for c in child_status.get("conditions") or []))
    shape = (
        child.get("kind"),
        (metadata.get("annotations") or {}).get(contract.ANNOTATION_SPEC_HASH),
        bool(metadata.get("deletionTimestamp")),
        tuple(sorted(ref.get("uid", "") for ref in metadata.get("ownerReferences") or [])),
        spec.get("replicas"),
    )
    progress = tuple(child_status.get(field) for field in ("ready", "succeeded", "failed", "replicas", "readyReplicas",
                                                            "currentRevision", "updateRevision"))
    return shape, progress + (conditions,)


def differs(current: Mapping[str, Any] | None, computed: Mapping[str, Any]) -> bool:
    """Whether the operator's fields in `current` status differ from `computed` (so that a write is needed).

    Args:
        current (Mapping[str, Any] | None): status as read (may hold `training` and other writers' fields).
        computed (Mapping[str, Any]): The result of `compute_status`.

    Returns:
        bool: True when any of `OWNED_FIELDS` differs.
    """
    current = current or {}
    return any(current.get(field) != computed.get(field) for field in OWNED_FIELDS)
