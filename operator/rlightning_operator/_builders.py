"""Pure builders: a validated PolicyGroup manifest -> the manifests of its children (plain dicts).

Builders never call the API, read the environment or the clock; the same input gives the same output. Beside the
manifest they take what the operator decided about the run (`RunState`: the trainers' attempt, the creation time,
whether the evaluators are stopped) and return the whole desired state. Owner references are not set here: the
reconciler adds them (`with_owner`). Every child carries the spec-hash
annotation (contract.ANNOTATION_SPEC_HASH) that the planner compares; the pod templates of the Job and the
StatefulSet carry a hash that ignores `spec.eval.replicas`, `minReplicas` and `maxReplicas`, so scaling never
looks like a template change, and `disruptionBudget`, which only the evaluators' PodDisruptionBudget reads. A
pod's command, environment and grace period come from the launch plan (`rlightning.launch`) that `rlightning run`
starts its processes from too. Trainer pods carry the node autoscalers' do-not-disrupt annotations; a PolicyGroup
labelled with a Kueue queue gets a suspended trainer Job (`_queue`).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import hashlib
import json
from collections.abc import Mapping
from typing import Any

import yaml

from rlightning import contract, launch
from rlightning.config import EvalConfig, PolicyGroupManifest, PolicyGroupSpec, TrainConfig
from rlightning_operator import _template

SCALING_FIELDS = ("replicas", "minReplicas", "maxReplicas")
"""Fields of spec.eval that only size the evaluator fleet: excluded from every hash."""
PYTHON = "python"
"""The image's interpreter."""
NODE_RANK_FROM_JOB_INDEX = "$(JOB_COMPLETION_INDEX)"
"""torchrun's node rank: Kubernetes expands `$(VAR)` in a command from the container's environment, where an
Indexed Job sets JOB_COMPLETION_INDEX."""
DOWNWARD_API_FIELDS = {contract.ENV_NAMESPACE: "metadata.namespace", contract.ENV_POD_NAME: "metadata.name"}
"""The pod field (downward API) that fills each variable a launch plan lists in `env_from_pod`."""
DISRUPTION_BUDGET_FIELD = "disruptionBudget"
"""The field of spec.eval that only the evaluators' PodDisruptionBudget reads: excluded from the pods' hashes."""
TRAINER_POD_ANNOTATIONS = {
    contract.ANNOTATION_CLUSTER_AUTOSCALER_SAFE_TO_EVICT: "false",
    contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT: "true",
}
"""Node autoscalers leave a trainer's node alone: a DDP gang loses all its ranks' progress since the last
checkpoint when one of them goes."""


@dataclasses.dataclass(frozen=True)
class RunState:
    """What the operator decided about a PolicyGroup's run, which the builders take beside its spec: the children
    they return are the whole desired state, nothing is stamped on afterwards (JobSet's `constructJob` builds each
    Job with its restart attempt the same way).

    Attributes:
        attempt (int, optional): The trainer gang's attempt, 0 first (the planner's `Restarts.attempt`): a label of
            the Job and its pods, `contract.ENV_TRAIN_ATTEMPT` and part of the Job's hash. Defaults to 0.
        created_seconds (int, optional): The PolicyGroup's `metadata.creationTimestamp`, Unix seconds
            (`created_seconds`; 0 when unknown): with the attempt, the trainers' fencing epoch. Defaults to 0.
        evaluators_stopped (bool, optional): Training has ended and spec.eval.afterTraining is Stop: the
            StatefulSet gets 0 replicas. Defaults to False.
    """

    attempt: int = 0
    created_seconds: int = 0
    evaluators_stopped: bool = False


def digest(value: Any) -> str:
    """A short, stable hash of a JSON-serialisable value (sha256 of canonical JSON, 16 hex digits).

    Args:
        value (Any): Dicts, lists, strings and numbers.

    Returns:
        str: 16 lower-case hex digits.
    """
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def labels(group: str, role: str | None = None) -> dict[str, str]:
    """The labels every child (and, with `role`, every pod) of PolicyGroup `group` carries.

    Args:
        group (str): metadata.name of the PolicyGroup.
        role (str | None, optional): `train` or `eval`; None for children of no role. Defaults to None.

    Returns:
        dict[str, str]: Label key -> value, keys from rlightning.contract.
    """
    result = {contract.LABEL_GROUP: group, contract.LABEL_MANAGED_BY: contract.MANAGED_BY_VALUE}
    if role is not None:
        result[contract.LABEL_ROLE] = str(role)  # a plain str, not the enum: manifests are plain data
    return dict(sorted(result.items()))


def selector(group: str, role: str) -> dict[str, str]:
    """The label selector of the pods of one role of PolicyGroup `group` (a subset of `labels`)."""
    return {contract.LABEL_GROUP: group, contract.LABEL_ROLE: str(role)}


def selector_string(group: str, role: str) -> str:
    """`selector` as a label-selector string (`k=v,k=v`), the form of status.selector for the scale subresource."""
    return ",".join(f"{key}={value}" for key, value in sorted(selector(group, role).items()))


def train_host(group: str, namespace: str, index: int) -> str:
    """The stable DNS name of trainer pod `index`: `<job>-<index>.<headless service>.<namespace>.svc`.

    An Indexed Job's pod gets hostname `<job>-<index>`; with `subdomain` set to a headless Service of the same
    namespace it resolves as `<hostname>.<subdomain>.<namespace>.svc` (Kubernetes DNS for pods).
    """
    return f"{contract.train_name(group)}-{index}.{contract.train_name(group)}.{namespace}.svc"


def train_master_addr(group: str, namespace: str) -> str:
    """The stable DNS name of trainer pod 0 (torchrun's master, the weight-sync store)."""
    return train_host(group, namespace, 0)


def role_view(spec: PolicyGroupSpec, role: str) -> dict[str, Any]:
    """The part of the spec that the pods of `role` depend on: all of it but the scaling fields, the evaluators'
    disruption budget and the other role's scheduling (`pod`, `template`), in wire form.

    Args:
        spec (PolicyGroupSpec): The validated spec.
        role (str): `train` or `eval`.

    Returns:
        dict[str, Any]: camelCase dict.
    """
    data = spec.model_dump(by_alias=True, mode="json")
    for key in (*SCALING_FIELDS, DISRUPTION_BUDGET_FIELD):
        data[contract.PolicyRole.EVAL].pop(key, None)
    other = contract.PolicyRole.EVAL if role == contract.PolicyRole.TRAIN else contract.PolicyRole.TRAIN
    data[other].pop("pod", None)
    data[other].pop("template", None)
    return data


def _metadata(name: str, namespace: str, group: str, role: str | None = None) -> dict[str, Any]:
    return {"name": name, "namespace": namespace, "labels": labels(group, role)}


def _stamp(manifest: dict[str, Any], value: Any) -> dict[str, Any]:
    manifest["metadata"]["annotations"] = {contract.ANNOTATION_SPEC_HASH: digest(value)}
    return manifest


def _ports(spec: PolicyGroupSpec, role: str) -> list[tuple[str, int]]:
    """(name, port) pairs a role's pods listen on, metrics last and only when enabled."""
    ports = []
    if role == contract.PolicyRole.TRAIN:
        ports = [
            (contract.TORCHRUN_PORT_NAME, spec.ports.torchrun),
            (contract.WEIGHT_SYNC_PORT_NAME, spec.ports.weight_sync),
            *(
                (contract.trajectory_port_name(rank), spec.ports.trajectories + rank)
                for rank in range(spec.train.procs_per_node)
            ),
        ]
    if spec.ports.metrics:
        ports.append((contract.METRICS_PORT_NAME, spec.ports.metrics))
    return ports


def launch_site(manifest: PolicyGroupManifest, namespace: str) -> launch.LaunchSite:
    """Where the pods of a PolicyGroup run, for its launch plans: the mounted spec, trainer pod 0 as master,
    the node rank from the Job's completion index, metrics on, a fleet sized by the StatefulSet.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.

    Returns:
        launch.LaunchSite: The site of its pods.
    """
    return launch.LaunchSite(
        python=PYTHON,
        master_addr=train_master_addr(manifest.metadata.name, namespace),
        trainer_hosts=tuple(
            train_host(manifest.metadata.name, namespace, index) for index in range(manifest.spec.train.nodes)
        ),
        spec_path=f"{contract.SPEC_MOUNT_DIR}/{contract.SPEC_FILE_NAME}",
        run_dir=contract.DEFAULT_RUN_DIR_IN_POD,
        node_rank=NODE_RANK_FROM_JOB_INDEX,
        metrics=True,
        expected_evaluators=None,
        in_pod=True,
    )


def _env(plan: launch.LaunchPlan) -> list[dict[str, Any]]:
    env: dict[str, dict[str, Any]] = {name: {"value": value} for name, value in plan.env.items()}
    for name in plan.env_from_pod:
        env[name] = {"valueFrom": {"fieldRef": {"fieldPath": DOWNWARD_API_FIELDS[name]}}}
    return [{"name": name, **value} for name, value in sorted(env.items())]


def _run_dir_source(spec: PolicyGroupSpec, role: str) -> dict[str, Any]:
    """The volume source of the run directory: the trainer's checkpoint claim when set, else an emptyDir."""
    claim = spec.train.checkpoint.persistent_volume_claim
    if role == contract.PolicyRole.TRAIN and claim:
        return {"persistentVolumeClaim": {"claimName": claim}}
    return {"emptyDir": {}}


def _role_config(spec: PolicyGroupSpec, role: str) -> TrainConfig | EvalConfig:
    return spec.train if role == contract.PolicyRole.TRAIN else spec.eval


NODE_LOSS_TAINTS = ("node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable")
"""NoExecute taints the node lifecycle controller puts on a node whose kubelet reports NotReady or stops answering
(Kubernetes docs, "Taints and Tolerations", taint-based evictions)."""


def node_loss_tolerations(given: list[dict[str, Any]], role: TrainConfig | EvalConfig) -> list[dict[str, Any]]:
    """Tolerations of :data:`NODE_LOSS_TAINTS` for the role's `unreachableTolerationSeconds`, but for the taints
    `given` (the pod shorthand's tolerations) already names, by key or by a toleration of every key.

    Without them the admission plugin DefaultTolerationSeconds gives every pod 300 s; once the taint manager evicts
    a pod, the operator forces it out (`_pods.released_at`). The taint manager takes the shortest matching
    `tolerationSeconds`, so one of ours beside a user's would override the user's.

    Args:
        given (list[dict[str, Any]]): `pod.tolerations` of the role, as the user wrote them.
        role (TrainConfig | EvalConfig): The role's config.

    Returns:
        list[dict[str, Any]]: Toleration objects (operator Exists, effect NoExecute), by taint key.
    """
    if any(not toleration.get("key") and toleration.get("operator") == "Exists" for toleration in given):
        return []
    named = {toleration.get("key") for toleration in given}
    seconds = role.unreachable_toleration_seconds
    return [
        {"key": key, "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": seconds}
        for key in NODE_LOSS_TAINTS
        if key not in named
    ]


def _pod_spec(manifest: PolicyGroupManifest, namespace: str, role: str) -> dict[str, Any]:
    spec, group = manifest.spec, manifest.metadata.name
    pod = _role_config(spec, role).pod
    plan = launch.plan(manifest, role, launch_site(manifest, namespace))
    resources = pod.resources.model_dump(by_alias=True, mode="json")
    container: dict[str, Any] = {
        "name": str(role),
        "image": pod.image or spec.image,
        "imagePullPolicy": spec.image_pull_policy,
        "command": list(plan.argv),
        "env": _env(plan),
        "ports": [{"name": name, "containerPort": port, "protocol": "TCP"} for name, port in _ports(spec, role)],
        "resources": {key: dict(sorted(value.items())) for key, value in resources.items() if value},
        # The first failing trainer rank, or an evaluator, writes its own exception there
        # (`rlightning.runtime._errors`); when none did (a signal, a crash outside Python), the kubelet takes the
        # log's tail instead.
        "terminationMessagePath": contract.TERMINATION_LOG_IN_POD,
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": contract.RUN_DIR_VOLUME, "mountPath": contract.DEFAULT_RUN_DIR_IN_POD},
            {"name": contract.SPEC_VOLUME, "mountPath": contract.SPEC_MOUNT_DIR, "readOnly": True},
            {"name": contract.SHM_VOLUME, "mountPath": contract.SHM_MOUNT_PATH},
        ],
    }
    if plan.probe is not None:
        container[f"{plan.probe.kind}Probe"] = {
            "exec": {"command": list(plan.probe.argv)},
            "periodSeconds": plan.probe.period_seconds,
            "timeoutSeconds": plan.probe.period_seconds,
            "failureThreshold": plan.probe.failure_threshold,
        }
    result: dict[str, Any] = {
        "serviceAccountName": contract.service_account_name(group),
        "terminationGracePeriodSeconds": plan.grace_seconds,
        "containers": [container],
        "volumes": [
            {"name": contract.RUN_DIR_VOLUME, **_run_dir_source(spec, role)},
            {"name": contract.SPEC_VOLUME, "configMap": {"name": contract.config_name(group)}},
            # Memory-backed /dev/shm: the container runtime's 64 MiB breaks NCCL and torch's shared memory.
            {"name": contract.SHM_VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": pod.shm_size}},
        ],
    }
    if pod.node_selector:
        result["nodeSelector"] = dict(sorted(pod.node_selector.items()))
    tolerations = [*copy.deepcopy(pod.tolerations), *node_loss_tolerations(pod.tolerations, _role_config(spec, role))]
    if tolerations:
        result["tolerations"] = tolerations
    if pod.affinity:
        result["affinity"] = copy.deepcopy(pod.affinity)
    if pod.priority_class_name:
        result["priorityClassName"] = pod.priority_class_name
    return result


def build_config_map(manifest: PolicyGroupManifest, namespace: str) -> dict[str, Any]:
    """The ConfigMap holding the validated manifest (defaults filled in) as `contract.SPEC_FILE_NAME`.

    The scaling fields of spec.eval (`SCALING_FIELDS`) are left out: the fleet size changes through the scale
    subresource without touching anything but the StatefulSet, so a pod must not rely on it (the mounted spec
    validates with their defaults).

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.

    Returns:
        dict[str, Any]: A v1 ConfigMap.
    """
    group = manifest.metadata.name
    document: dict[str, Any] = {
        "apiVersion": contract.GROUP_VERSION,
        "kind": contract.KIND,
        "metadata": {"name": group, "namespace": namespace},
        "spec": manifest.spec.model_dump(by_alias=True, mode="json"),
    }
    for field in SCALING_FIELDS:
        del document["spec"][contract.PolicyRole.EVAL][field]
    data = {contract.SPEC_FILE_NAME: yaml.safe_dump(document, sort_keys=True)}
    result = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": _metadata(contract.config_name(group), namespace, group),
        "data": data,
    }
    return _stamp(result, data)


def _service_accounts(manifest: PolicyGroupManifest) -> list[str]:
    """The ServiceAccounts the pods run as: the operator's, and any a role's template names instead."""
    names = {contract.service_account_name(manifest.metadata.name)}
    for role in contract.PolicyRole:
        template = _role_config(manifest.spec, role).template
        if template is not None and template.spec.service_account_name:
            names.add(template.spec.service_account_name)
    return sorted(names)


def build_rbac(manifest: PolicyGroupManifest, namespace: str) -> list[dict[str, Any]]:
    """The pods' ServiceAccount, and a Role + RoleBinding that let them get and patch this PolicyGroup's status.

    Trainer rank 0 writes status.training through the status subresource; nothing else is granted. A role's pod
    template may name another ServiceAccount (object storage, say): the RoleBinding binds it too.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.

    Returns:
        list[dict[str, Any]]: ServiceAccount, Role, RoleBinding (v1, rbac.authorization.k8s.io/v1).
    """
    group = manifest.metadata.name
    name = contract.service_account_name(group)
    account: dict[str, Any] = {
        "apiVersion": "v1", "kind": "ServiceAccount", "metadata": _metadata(name, namespace, group)
    }
    role: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": _metadata(name, namespace, group),
        "rules": [
            {
                "apiGroups": [contract.API_GROUP],
                "resources": [f"{contract.PLURAL}/status"],
                "resourceNames": [group],
                "verbs": ["get", "patch"],
            }
        ],
    }
    binding: dict[str, Any] = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": _metadata(name, namespace, group),
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name},
        "subjects": [
            {"kind": "ServiceAccount", "name": account_name, "namespace": namespace}
            for account_name in _service_accounts(manifest)
        ],
    }
    account = _stamp(account, account["metadata"]["labels"])
    role = _stamp(role, role["rules"])
    binding = _stamp(binding, [binding["roleRef"], binding["subjects"]])
    return [account, role, binding]


def _service(manifest: PolicyGroupManifest, namespace: str, role: str) -> dict[str, Any]:
    group = manifest.metadata.name
    name = contract.train_name(group) if role == contract.PolicyRole.TRAIN else contract.eval_name(group)
    ports = _ports(manifest.spec, role)
    spec: dict[str, Any] = {
        "clusterIP": "None",
        "publishNotReadyAddresses": True,
        "selector": selector(group, role),
        "ports": [
            {"name": port_name, "port": port, "targetPort": port, "protocol": "TCP"} for port_name, port in ports
        ],
    }
    if not ports:  # a headless Service may have no ports; keep the key out rather than an empty list
        del spec["ports"]
    result = {"apiVersion": "v1", "kind": "Service", "metadata": _metadata(name, namespace, group, role), "spec": spec}
    return _stamp(result, spec)


def _validate_container(pod_spec: dict[str, Any]) -> dict[str, Any]:
    """The trainers' init container: `python -m rlightning.cli validate <mounted spec>`.

    The deep checks (policyClass, policyKwargs, env id) need the runtime, so only a pod can run them. The
    trainer container cannot report a rejection by its exit code: torchrun exits 1 whenever a worker fails, so
    the worker's `contract.EXIT_BAD_MANIFEST` never reaches the Job. This container exits with it before
    torchrun starts, which the pod failure policy turns into a failed Job (reported as phase Invalid).
    """
    main = pod_spec["containers"][0]
    return {
        "name": contract.VALIDATE_CONTAINER,
        "image": main["image"],
        "imagePullPolicy": main["imagePullPolicy"],
        "command": [PYTHON, "-m", "rlightning.cli", "validate", f"{contract.SPEC_MOUNT_DIR}/{contract.SPEC_FILE_NAME}"],
        "resources": copy.deepcopy(main["resources"]),
        "volumeMounts": [copy.deepcopy(m) for m in main["volumeMounts"] if m["name"] == contract.SPEC_VOLUME],
    }


def _workload(
    api_version: str,
    kind: str,
    manifest: PolicyGroupManifest,
    namespace: str,
    spec: dict[str, Any],
    pod_spec: dict[str, Any],
) -> dict[str, Any]:
    """A Job (trainers) or StatefulSet (evaluators) running `pod_spec` merged with the role's pod template; its
    metadata and pod template carry the hash of its spec and of the role's view of the PolicyGroup's spec.
    """
    role = contract.PolicyRole.TRAIN if kind == "Job" else contract.PolicyRole.EVAL
    group = manifest.metadata.name
    pod_metadata: dict[str, Any] = {"labels": labels(group, role)}
    if role == contract.PolicyRole.TRAIN:
        pod_metadata["annotations"] = dict(TRAINER_POD_ANNOTATIONS)
    pod_spec, pod_metadata = _template.merge(pod_spec, pod_metadata, _role_config(manifest.spec, role).template, role)
    spec["template"] = {"metadata": pod_metadata, "spec": pod_spec}
    value = digest([spec, role_view(manifest.spec, role)])
    annotations = {**spec["template"]["metadata"].get("annotations", {}), contract.ANNOTATION_SPEC_HASH: value}
    spec["template"]["metadata"]["annotations"] = dict(sorted(annotations.items()))
    name = contract.train_name(group) if role == contract.PolicyRole.TRAIN else contract.eval_name(group)
    metadata = {**_metadata(name, namespace, group, role), "annotations": {contract.ANNOTATION_SPEC_HASH: value}}
    return {"apiVersion": api_version, "kind": kind, "metadata": metadata, "spec": spec}


def build_train(
    manifest: PolicyGroupManifest, namespace: str, state: RunState = RunState()
) -> list[dict[str, Any]]:
    """The trainers: a headless Service (rendezvous DNS, resolvable before readiness) and an Indexed Job for one
    attempt of the gang (`state.attempt`), suspended for Kueue when the PolicyGroup names a queue (`_queue`).

    Each Job pod runs the trainer's launch plan: `python -m torch.distributed.run --nnodes=N --nproc-per-node=P
    --node-rank=$(JOB_COMPLETION_INDEX) --master-addr=<pod 0 DNS> --master-port=<ports.torchrun> ...
    -m rlightning.runtime.train`. The pod failure
    policy fails the Job at once on exit code 2 (a manifest the runtime rejects; retrying cannot help) and
    does not count disruptions (preemption, eviction, node drain) as failures; `backoffLimit` 0 fails the Job on
    the first other failure, and the operator restarts the gang as a new attempt (`_attempt`). An init container
    (`contract.VALIDATE_CONTAINER`) runs `rlightning validate` on the mounted spec first, so that a spec only the
    runtime can reject fails the Job that way too (torchrun itself exits 1 on any failed worker). The train
    container's termination message is the first failing rank's own exception (`contract.TERMINATION_LOG_IN_POD`,
    `FallbackToLogsOnError`; an evaluator's is its own), which the PolicyGroup's conditions show.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.
        state (RunState, optional): The attempt and the creation time. Defaults to attempt 0, created at 0.

    Returns:
        list[dict[str, Any]]: [Service, Job]. The Job and its pod template carry the spec hash of the train view,
            the queue and the attempt.
    """
    spec, group = manifest.spec, manifest.metadata.name
    name = contract.train_name(group)
    pod_spec = _pod_spec(manifest, namespace, contract.PolicyRole.TRAIN)
    pod_spec.update({"restartPolicy": "Never", "subdomain": name, "initContainers": [_validate_container(pod_spec)]})
    bad_manifest = {"operator": "In", "values": [contract.EXIT_BAD_MANIFEST]}
    job_spec: dict[str, Any] = {
        "completionMode": "Indexed",
        "completions": spec.train.nodes,
        "parallelism": spec.train.nodes,
        # No retry of one index inside an attempt: a replaced pod would join the old attempt's rendezvous. The
        # operator restarts the whole gang instead (`_attempt`, spec.train.maxRestarts).
        "backoffLimit": 0,
        "podReplacementPolicy": "Failed",
        "podFailurePolicy": {
            "rules": [
                {"action": "FailJob", "onExitCodes": {"containerName": container, **bad_manifest}}
                for container in (contract.VALIDATE_CONTAINER, str(contract.PolicyRole.TRAIN))
            ]
            + [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget"}]}]
        },
    }
    job = _workload("batch/v1", "Job", manifest, namespace, job_spec, pod_spec)
    _queue(manifest, job)
    _attempt(job, state, len(pod_spec["containers"][0]["env"]))
    return [_service(manifest, namespace, contract.PolicyRole.TRAIN), job]


def attempt_of(child: Mapping[str, Any] | None) -> int:
    """The trainer gang's attempt a Job or pod belongs to (its `contract.LABEL_ATTEMPT` label; 0 when absent).

    Args:
        child (Mapping[str, Any] | None): A Job or pod as built or read.

    Returns:
        int: The attempt, 0 for a child without the label or an unreadable one.
    """
    value = (((child or {}).get("metadata") or {}).get("labels") or {}).get(contract.LABEL_ATTEMPT, "0")
    return int(value) if str(value).isdigit() else 0


def _rehash(job: dict[str, Any], part: Any) -> None:
    """Fold `part` into the spec hash of `job` and of its pod template."""
    value = digest([job["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH], part])
    for metadata in (job["metadata"], job["spec"]["template"]["metadata"]):
        metadata["annotations"][contract.ANNOTATION_SPEC_HASH] = value


def _attempt(job: dict[str, Any], state: RunState, operator_env: int) -> None:
    """Make the trainers' Job being built (`build_train`) one attempt of the gang; its first `operator_env`
    environment variables are the launch plan's (sorted), the rest the pod template's, which stay last so that
    their `$(VAR)` references see ours (Kubernetes expands only variables defined before).

    The attempt is a label of the Job and its pods, `contract.ENV_TRAIN_ATTEMPT` in the trainer container, and
    part of the spec hash, so the planner replaces the Job of another attempt (JobSet's restart attempts, done by
    this operator: the whole gang goes before the next attempt starts). The container also gets the attempt's
    fencing epoch (`contract.ENV_TRAIN_EPOCH`, `contract.train_epoch`), which the hash leaves out: it follows from
    the attempt and the PolicyGroup's creation time.
    """
    template = job["spec"]["template"]
    for metadata in (job["metadata"], template["metadata"]):
        metadata["labels"] = dict(sorted({**metadata["labels"], contract.LABEL_ATTEMPT: str(state.attempt)}.items()))
    container = next(c for c in template["spec"]["containers"] if c["name"] == str(contract.PolicyRole.TRAIN))
    epoch = contract.train_epoch(state.created_seconds, state.attempt)
    stamped = {contract.ENV_TRAIN_ATTEMPT: state.attempt, contract.ENV_TRAIN_EPOCH: epoch}
    ours = [e for e in container["env"][:operator_env] if e["name"] not in stamped]
    ours = sorted([*ours, *({"name": k, "value": str(v)} for k, v in stamped.items())], key=lambda e: e["name"])
    container["env"] = [*ours, *container["env"][operator_env:]]
    _rehash(job, state.attempt)


def created_seconds(body: Mapping[str, Any]) -> int:
    """An object's `metadata.creationTimestamp` (RFC 3339, set by the API server) as Unix seconds; 0 when absent or
    unreadable.
    """
    stamp = str((body.get("metadata") or {}).get("creationTimestamp") or "")
    try:
        return max(0, int(datetime.datetime.fromisoformat(stamp).timestamp()))
    except ValueError:
        return 0


def build_eval(
    manifest: PolicyGroupManifest, namespace: str, state: RunState = RunState()
) -> list[dict[str, Any]]:
    """The evaluators: a headless Service and a StatefulSet (Parallel pod management, stable ordinals).

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.
        state (RunState, optional): Whether the evaluators are stopped. Defaults to running.

    Returns:
        list[dict[str, Any]]: [Service, StatefulSet]. `spec.replicas` is `spec.eval.replicas`, 0 once
            `state.evaluators_stopped`; the hash on the StatefulSet and its pod template ignores it.
    """
    spec, group = manifest.spec, manifest.metadata.name
    name = contract.eval_name(group)
    pod_spec = _pod_spec(manifest, namespace, contract.PolicyRole.EVAL)
    sts_spec: dict[str, Any] = {
        "serviceName": name,
        "podManagementPolicy": "Parallel",
        "selector": {"matchLabels": selector(group, contract.PolicyRole.EVAL)},
        "updateStrategy": {"type": "RollingUpdate"},
    }
    sts = _workload("apps/v1", "StatefulSet", manifest, namespace, sts_spec, pod_spec)
    replicas = 0 if state.evaluators_stopped else spec.eval.replicas
    sts["spec"] = {"replicas": replicas, **sts["spec"]}  # after hashing: scaling is no template change
    return [_service(manifest, namespace, contract.PolicyRole.EVAL), sts]


def build_disruption_budgets(manifest: PolicyGroupManifest, namespace: str) -> list[dict[str, Any]]:
    """PodDisruptionBudgets (policy/v1) of the trainers and of the evaluators.

    Trainers: `minAvailable` = spec.train.nodes, so no voluntary disruption (an eviction by a drain or a node
    autoscaler) ever takes a trainer pod while the gang runs. It says what `maxUnavailable: 0` means, in the only
    form that holds for a Job's pods: the disruption controller computes `maxUnavailable` and percentages from the
    scale of the pods' controller, which a Job lacks ("Arbitrary workloads and selectors",
    https://kubernetes.io/docs/tasks/run-application/configure-pdb/). Evaluators:
    spec.eval.disruptionBudget as written (a StatefulSet has a scale, so both fields and percentages hold).

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.

    Returns:
        list[dict[str, Any]]: [trainers' PDB `<name>-train`, evaluators' PDB `<name>-eval`], each hashed on its
            spec.
    """
    group, budget = manifest.metadata.name, manifest.spec.eval.disruption_budget
    specs = {
        contract.PolicyRole.TRAIN: {"minAvailable": manifest.spec.train.nodes},
        contract.PolicyRole.EVAL: budget.model_dump(by_alias=True, mode="json", exclude_none=True),
    }
    result = []
    for role, spec in specs.items():
        name = contract.train_name(group) if role == contract.PolicyRole.TRAIN else contract.eval_name(group)
        spec = {**spec, "selector": {"matchLabels": selector(group, role)}}
        budget_manifest = {
            "apiVersion": "policy/v1",
            "kind": "PodDisruptionBudget",
            "metadata": _metadata(name, namespace, group, role),
            "spec": spec,
        }
        result.append(_stamp(budget_manifest, spec))
    return result


NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"
"""The label the API server puts on every namespace, with its name (Kubernetes 1.21 and later)."""


@dataclasses.dataclass(frozen=True)
class NetworkPolicyOptions:
    """What the per-group NetworkPolicy admits beside the group's own pods (`OperatorSettings.network_policy_*`).

    Attributes:
        metrics_namespace (str): The namespace whose pods may scrape the trainers' metrics port (a Prometheus in
            `monitoring`); "" admits every pod of the PolicyGroup's own namespace. Defaults to "".
    """

    metrics_namespace: str = ""


def build_network_policy(
    manifest: PolicyGroupManifest, namespace: str, options: NetworkPolicyOptions
) -> dict[str, Any]:
    """The trainers' NetworkPolicy (networking.k8s.io/v1, Ingress only): nothing reaches a trainer pod but the
    PolicyGroup's own pods, and the scrapers of `options` its metrics port.

    The group's pods are admitted on every port, not only the spec's (torchrun's rendezvous, the weight-sync store,
    the trajectory intakes): gloo and NCCL connect the DDP ranks and the weight-sync groups over ports each process
    binds at random (ephemeral ports). Egress is left alone (trainers reach the API server and the evaluators).
    The operator itself never connects to a pod; kubelet probes are exec probes.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.
        options (NetworkPolicyOptions): Who may scrape the metrics port.

    Returns:
        dict[str, Any]: The NetworkPolicy `<name>-train`, hashed on its spec.
    """
    group, metrics = manifest.metadata.name, manifest.spec.ports.metrics
    scrapers = ({"namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: options.metrics_namespace}}}
                if options.metrics_namespace else {"podSelector": {}})
    ingress: list[dict[str, Any]] = [{"from": [{"podSelector": {"matchLabels": {contract.LABEL_GROUP: group}}}]}]
    if metrics:
        ingress.append({"from": [scrapers], "ports": [{"protocol": "TCP", "port": metrics}]})
    spec = {
        "podSelector": {"matchLabels": selector(group, contract.PolicyRole.TRAIN)},
        "policyTypes": ["Ingress"],
        "ingress": ingress,
    }
    policy = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": _metadata(contract.train_name(group), namespace, group, contract.PolicyRole.TRAIN),
        "spec": spec,
    }
    return _stamp(policy, spec)


def _queue(manifest: PolicyGroupManifest, job: dict[str, Any]) -> None:
    """Make the trainers' Job being built (`build_train`) the one Kueue admits when the PolicyGroup carries
    `contract.LABEL_KUEUE_QUEUE`: with that label and created suspended, so that no trainer pod exists until Kueue
    admits the whole gang (its quota for all `parallelism` pods at once) and un-suspends it. Without the label,
    nothing changes.

    The queue name enters the Job's hash: moving a PolicyGroup to another queue (or out of queueing) recreates the
    Job, which Kueue requires (it refuses a queue change of an admitted Job). The operator never patches
    `spec.suspend` afterwards: Kueue owns it (it suspends the Job again when it preempts the workload).
    """
    queue = manifest.metadata.labels.get(contract.LABEL_KUEUE_QUEUE)
    if not queue:
        return
    job["metadata"]["labels"] = dict(sorted({**job["metadata"]["labels"], contract.LABEL_KUEUE_QUEUE: queue}.items()))
    job["spec"]["suspend"] = True
    _rehash(job, queue)


def build_workloads(
    manifest: PolicyGroupManifest, namespace: str, state: RunState = RunState()
) -> list[dict[str, Any]]:
    """The two children whose status the PolicyGroup's follows: the trainer Job and the evaluator StatefulSet,
    built alone (no ConfigMap rendering, RBAC or policies) for a status pass that compares only them.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.
        state (RunState, optional): The run as the operator decided it. Defaults to `RunState()`.

    Returns:
        list[dict[str, Any]]: [Job, StatefulSet], as in `build_children`.
    """
    return [build_train(manifest, namespace, state)[1], build_eval(manifest, namespace, state)[1]]


def build_children(
    manifest: PolicyGroupManifest,
    namespace: str,
    network_policy: NetworkPolicyOptions | None = None,
    state: RunState = RunState(),
) -> list[dict[str, Any]]:
    """Every child of a PolicyGroup, in creation order: what pods mount and use first, then workloads.

    Args:
        manifest (PolicyGroupManifest): The validated PolicyGroup.
        namespace (str): Its namespace.
        network_policy (NetworkPolicyOptions | None, optional): Build the trainers' NetworkPolicy with these
            options; None builds none (a cluster without NetworkPolicy support). Defaults to None.
        state (RunState, optional): The run as the operator decided it. Defaults to `RunState()`.

    Returns:
        list[dict[str, Any]]: ConfigMap, ServiceAccount, Role, RoleBinding, trainer and evaluator
            PodDisruptionBudgets and the trainers' NetworkPolicy (before any pod, so that no pod is ever
            unprotected), trainer Service, Job, evaluator Service, StatefulSet.
    """
    service, job = build_train(manifest, namespace, state)
    policies = [] if network_policy is None else [build_network_policy(manifest, namespace, network_policy)]
    return [
        build_config_map(manifest, namespace),
        *build_rbac(manifest, namespace),
        *build_disruption_budgets(manifest, namespace),
        *policies,
        service,
        job,
        *build_eval(manifest, namespace, state),
    ]


def with_owner(child: dict[str, Any], owner: dict[str, Any]) -> dict[str, Any]:
    """A copy of `child` whose only owner reference is the PolicyGroup `owner` (controller, blocking deletion).

    Args:
        child (dict[str, Any]): A manifest from `build_children`.
        owner (dict[str, Any]): The PolicyGroup object (needs apiVersion, kind, metadata.name and metadata.uid).

    Returns:
        dict[str, Any]: The child with metadata.ownerReferences set; its metadata is a new dict, the rest is
            shared with `child`.
    """
    return {**child, "metadata": {**child["metadata"], "ownerReferences": [owner_reference(owner)]}}


def owner_reference(owner: dict[str, Any]) -> dict[str, Any]:
    """The controller owner reference to a PolicyGroup, so that garbage collection deletes children with it."""
    return {
        "apiVersion": owner.get("apiVersion", contract.GROUP_VERSION),
        "kind": owner.get("kind", contract.KIND),
        "name": owner["metadata"]["name"],
        "uid": owner["metadata"]["uid"],
        "controller": True,
        "blockOwnerDeletion": True,
    }
