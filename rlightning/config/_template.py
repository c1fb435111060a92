"""A role's pod template (`spec.train.template`, `spec.eval.template`): a Kubernetes PodTemplateSpec, as Kubeflow's
PyTorchJob and KubeRay take one, and the one list of what in it the operator owns.

The operator merges the template with what it owns (`rlightning_operator._template`); the fields it owns are
refused here (pydantic) and in the CRD (CEL rules generated from the same lists by `template_rules`), never
silently overwritten. The runtime container is the template's container named after the role (`train` or
`eval`): of it the template may set anything but `OWNED_CONTAINER_FIELDS`. The schema declares only the fields these
rules read and keeps every other field of the pod spec and its containers as written: a full PodTemplateSpec
schema is thousands of lines, and the API server checks the Job and StatefulSet the operator creates against the
real one.
"""

from __future__ import annotations

from typing import Any

from pydantic import ConfigDict, Field, field_validator

from rlightning import contract
from rlightning.config._base import SpecModel

OWNED_CONTAINER_FIELDS = (
    "image", "imagePullPolicy", "command", "args", "ports", "resources", "livenessProbe", "readinessProbe",
    "startupProbe",
)  # fmt: skip
"""Fields of the runtime container the operator sets (`pod.image`, `spec.imagePullPolicy`, the launch plan,
`pod.resources`); the template may set any other (env, envFrom and volumeMounts are added to the operator's)."""
OWNED_POD_FIELDS = ("restartPolicy", "subdomain", "hostname", "terminationGracePeriodSeconds")
"""Pod spec fields the Job, the StatefulSet and the launch plan (grace period) need as the operator sets them."""
SHORTHAND_FIELDS = ("nodeSelector", "tolerations", "affinity", "priorityClassName")
"""Pod spec fields that the `pod:` shorthand sets: they go there only, one place for scheduling (a CEL rule cannot
tell an empty `pod.affinity` from a set one, since its content is free-form)."""
OWNED_VOLUMES = (contract.RUN_DIR_VOLUME, contract.SPEC_VOLUME, contract.SHM_VOLUME)
OWNED_MOUNT_PATHS = (contract.DEFAULT_RUN_DIR_IN_POD, contract.SPEC_MOUNT_DIR, contract.SHM_MOUNT_PATH)
"""Mount paths of the runtime container that the operator's volumes take."""
OWNED_INIT_CONTAINERS = (contract.VALIDATE_CONTAINER,)
OWNED_ENV_PREFIXES = ("RLIGHTNING_", "NCCL_")
"""The runtime's own variables (`rlightning.contract`) and NCCL's, which `spec.nccl` sets for both roles."""
OWNED_ENV_NAMES = ("OMP_NUM_THREADS",)
"""Set by the launch plan from the pod's CPU (`rlightning.launch.THREADS_ENV`)."""
OWNED_KEY_PREFIX = f"{contract.API_GROUP}/"
"""Labels and annotations under the operator's prefix (group, role, attempt, spec hash)."""
OWNED_LABELS = (contract.LABEL_MANAGED_BY,)
OWNED_TRAINER_ANNOTATIONS = (
    contract.ANNOTATION_CLUSTER_AUTOSCALER_SAFE_TO_EVICT,
    contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT,
)
"""Node autoscalers' annotations that every trainer pod carries (a DDP gang must not lose a node)."""
# Bounds that keep the CEL rules' cost estimate within the API server's budget (an unbounded list of unbounded
# strings exceeds it); far above what a pod holds.
MAX_ITEMS = 64
MAX_ENV = 256
MAX_NAME_LENGTH = 253
_BY_NAME: dict[str, Any] = {"x-kubernetes-list-type": "map", "x-kubernetes-list-map-keys": ["name"]}
_OWNED = "Owned by the operator: refused."
_OWNED_IN_RUNTIME = "Refused in the runtime container (named after the role), whose is the operator's; free in others."
_SHORTHAND = "Set by the role's pod shorthand: refused here."


class _Open(SpecModel):
    """A Kubernetes object of which only some fields are declared; the others are kept as written."""

    model_config = SpecModel.model_config | ConfigDict(extra="allow")


class EnvVar(_Open):
    """A container's environment variable (only its name is read here)."""

    name: str = Field(max_length=MAX_NAME_LENGTH, description="The variable's name.")


class VolumeMount(_Open):
    """A container's volume mount (name and path are read here)."""

    name: str = Field(max_length=MAX_NAME_LENGTH, description="The volume's name.")
    mount_path: str = Field(max_length=4096, description="Where the volume appears in the container.")


class Container(_Open):
    """A container of the template: the runtime container (named after the role) or one the user adds."""

    name: str = Field(
        max_length=MAX_NAME_LENGTH, description="The container's name; the role's name marks the runtime container."
    )
    env: list[EnvVar] | None = Field(default=None, max_length=MAX_ENV, description="Environment variables.")
    volume_mounts: list[VolumeMount] | None = Field(default=None, max_length=MAX_ITEMS, description="Volume mounts.")
    image: str | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    image_pull_policy: str | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    command: list[str] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    args: list[str] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    ports: list[dict[str, Any]] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    resources: dict[str, Any] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    liveness_probe: dict[str, Any] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    readiness_probe: dict[str, Any] | None = Field(default=None, description=_OWNED_IN_RUNTIME)
    startup_probe: dict[str, Any] | None = Field(default=None, description=_OWNED_IN_RUNTIME)


class Volume(_Open):
    """A pod volume (only its name is read here)."""

    name: str = Field(max_length=MAX_NAME_LENGTH, description="The volume's name.")


class PodSpec(_Open):
    """A pod spec; the fields declared are the ones the operator owns or merges."""

    containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_ITEMS,
        json_schema_extra=_BY_NAME,
        description="The runtime container's additions, and sidecars.",
    )
    init_containers: list[Container] | None = Field(
        default=None,
        max_length=MAX_ITEMS,
        json_schema_extra=_BY_NAME,
        description="Init containers, run after the operator's.",
    )
    volumes: list[Volume] | None = Field(
        default=None, max_length=MAX_ITEMS, json_schema_extra=_BY_NAME, description="Volumes, beside the operator's."
    )

    @field_validator("containers", "init_containers", "volumes")
    @classmethod
    def _unique_names(cls, value: list[Container] | list[Volume] | None) -> Any:
        # Kubernetes' own schema keys these lists by name (x-kubernetes-list-type map), as the CRD does.
        names = [item.name for item in value or []]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        if duplicates:
            raise ValueError(f"names must be unique, got {', '.join(duplicates)} more than once")
        return value
    service_account_name: str | None = Field(
        default=None, description="The pods' ServiceAccount; the operator binds its Role to it too."
    )
    restart_policy: str | None = Field(default=None, description=_OWNED)
    subdomain: str | None = Field(default=None, description=_OWNED)
    hostname: str | None = Field(default=None, description=_OWNED)
    termination_grace_period_seconds: int | None = Field(default=None, description=_OWNED)
    node_selector: dict[str, str] | None = Field(default=None, description=_SHORTHAND)
    tolerations: list[dict[str, Any]] | None = Field(default=None, description=_SHORTHAND)
    affinity: dict[str, Any] | None = Field(default=None, description=_SHORTHAND)
    priority_class_name: str | None = Field(default=None, description=_SHORTHAND)


class PodTemplateMetadata(SpecModel):
    """What a pod template's metadata may hold: labels and annotations."""

    labels: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="Labels added to the role's pods."
    )
    annotations: dict[str, str] = Field(
        default_factory=dict, max_length=MAX_ITEMS, description="Annotations added to the role's pods."
    )


class PodTemplate(SpecModel):
    """A Kubernetes PodTemplateSpec merged into the role's pods (docs/operator.md, "Pod templates")."""

    metadata: PodTemplateMetadata = Field(
        default_factory=PodTemplateMetadata, description="Labels and annotations of the role's pods."
    )
    spec: PodSpec = Field(
        default_factory=PodSpec,
        description=(
            "A pod spec: volumes, extra containers and initContainers, imagePullSecrets, serviceAccountName, "
            "securityContext and any other pod field; of the container named after the role anything but its image, "
            "imagePullPolicy, command, args, ports, resources and probes. Fields the operator owns, and the pod "
            "shorthand's, are refused."
        ),
    )

    def wire(self) -> dict[str, Any]:
        """The template as Kubernetes takes it (camelCase, unset fields left out)."""
        return self.model_dump(by_alias=True, mode="json", exclude_none=True)


def _env_owned(name: str) -> bool:
    return name.startswith(OWNED_ENV_PREFIXES) or name in OWNED_ENV_NAMES


def template_problem(template: PodTemplate, role: str) -> str | None:  # noqa: C901 - one check per owned field, in order
    """The first field of a role's pod template that the operator owns, as an error message naming it.

    Args:
        template (PodTemplate): `spec.<role>.template`.
        role (str): `train` or `eval`: the runtime container's name.

    Returns:
        str | None: `template.<path>: <rule>`, or None when the operator owns nothing the template sets.
    """
    wire = template.wire()
    spec = wire.get("spec", {})
    metadata = wire.get("metadata", {})
    annotations = OWNED_TRAINER_ANNOTATIONS if role == contract.PolicyRole.TRAIN else ()
    for kind, owned in (("labels", OWNED_LABELS), ("annotations", annotations)):
        for key in metadata.get(kind, {}):
            if key.startswith(OWNED_KEY_PREFIX) or key in owned:
                keys = ", ".join((f"keys under {OWNED_KEY_PREFIX}", *owned))
                return f"template.metadata.{kind}.{key}: owned by the operator ({keys})"
    for field in OWNED_POD_FIELDS:
        if field in spec:
            return f"template.spec.{field}: owned by the operator (the Job, StatefulSet and launch plan set it)"
    for field in SHORTHAND_FIELDS:
        if field in spec:
            return f"template.spec.{field}: set it in the role's pod.{field}, the one place for scheduling"
    for volume in spec.get("volumes", []):
        if volume["name"] in OWNED_VOLUMES:
            return f"template.spec.volumes.{volume['name']}: volume names {OWNED_VOLUMES} are the operator's"
    for init in spec.get("initContainers", []):
        if init["name"] in OWNED_INIT_CONTAINERS:
            return f"template.spec.initContainers.{init['name']}: the operator's init container"
    for container in spec.get("containers", []):
        if container["name"] != role:
            continue
        prefix = f"template.spec.containers.{role}"
        taken = [field for field in OWNED_CONTAINER_FIELDS if field in container]
        if taken:
            return (
                f"{prefix}.{taken[0]}: owned by the operator ({', '.join(OWNED_CONTAINER_FIELDS)}; image and "
                "resources: pod.image, pod.resources)"
            )
        for env in container.get("env", []):
            if _env_owned(env["name"]):
                return (
                    f"{prefix}.env.{env['name']}: names starting {OWNED_ENV_PREFIXES} or in {OWNED_ENV_NAMES} are "
                    "set by the operator (NCCL settings: spec.nccl)"
                )
        for mount in container.get("volumeMounts", []):
            if mount["mountPath"] in OWNED_MOUNT_PATHS:
                return f"{prefix}.volumeMounts.{mount['mountPath']}: paths {OWNED_MOUNT_PATHS} are the operator's"
    return None


def _quoted(values: tuple[str, ...]) -> str:
    return "[" + ", ".join(f"'{value}'" for value in values) + "]"


def template_rules(role: str) -> list[dict[str, str]]:
    """The CEL rules of `spec.<role>` (TrainConfig, EvalConfig) that refuse what `template_problem` refuses.

    Args:
        role (str): `train` or `eval`.

    Returns:
        list[dict[str, str]]: `x-kubernetes-validations` entries, scoped to the role's config object.
    """
    spec = "self.template.spec"
    has_spec = "!has(self.template) || !has(self.template.spec) || "
    annotations = OWNED_TRAINER_ANNOTATIONS if role == contract.PolicyRole.TRAIN else ()
    env_owned = " || ".join(
        [f"e.name.startsWith('{prefix}')" for prefix in OWNED_ENV_PREFIXES] + [f"e.name in {_quoted(OWNED_ENV_NAMES)}"]
    )
    runtime_owned = [f"!has(c.{field})" for field in OWNED_CONTAINER_FIELDS]
    has_metadata = "!has(self.template) || !has(self.template.metadata) || "
    rules = [
        (
            has_metadata + "!has(self.template.metadata.labels) || self.template.metadata.labels.all(k, "
            f"!k.startsWith('{OWNED_KEY_PREFIX}') && !(k in {_quoted(OWNED_LABELS)}))",
            f"template.metadata.labels: keys under {OWNED_KEY_PREFIX} and {', '.join(OWNED_LABELS)} are the operator's",
            ".template.metadata.labels",
        ),
        (
            has_metadata + "!has(self.template.metadata.annotations) || self.template.metadata.annotations.all(k, "
            f"!k.startsWith('{OWNED_KEY_PREFIX}') && !(k in {_quoted(annotations)}))",
            f"template.metadata.annotations: keys under {OWNED_KEY_PREFIX}"
            + "".join(f", {key}" for key in annotations) + " are the operator's",
            ".template.metadata.annotations",
        ),
        (
            has_spec + " && ".join(f"!has({spec}.{field})" for field in OWNED_POD_FIELDS),
            f"template.spec: {', '.join(OWNED_POD_FIELDS)} are owned by the operator",
            ".template.spec",
        ),
        (
            has_spec + " && ".join(f"!has({spec}.{field})" for field in SHORTHAND_FIELDS),
            f"template.spec: {', '.join(SHORTHAND_FIELDS)} go in the role's pod shorthand",
            ".template.spec",
        ),
        (
            has_spec + f"!has({spec}.volumes) || {spec}.volumes.all(v, !(v.name in {_quoted(OWNED_VOLUMES)}))",
            f"template.spec.volumes: names {OWNED_VOLUMES} are the operator's",
            ".template.spec.volumes",
        ),
        (
            has_spec + f"!has({spec}.initContainers) || {spec}.initContainers.all(c, "
            f"!(c.name in {_quoted(OWNED_INIT_CONTAINERS)}))",
            f"template.spec.initContainers: {OWNED_INIT_CONTAINERS} is the operator's init container",
            ".template.spec.initContainers",
        ),
        (
            has_spec + f"!has({spec}.containers) || {spec}.containers.all(c, c.name != '{role}' || ("
            + " && ".join(runtime_owned)
            + f" && (!has(c.env) || c.env.all(e, !({env_owned})))"
            + f" && (!has(c.volumeMounts) || c.volumeMounts.all(m, !(m.mountPath in {_quoted(OWNED_MOUNT_PATHS)})))))",
            f"template.spec.containers: the runtime container ({role}) may not set "
            f"{', '.join(OWNED_CONTAINER_FIELDS)}, no env starting {OWNED_ENV_PREFIXES} or in {OWNED_ENV_NAMES} "
            f"(NCCL settings: spec.nccl), no mount at {OWNED_MOUNT_PATHS}",
            ".template.spec.containers",
        ),
    ]
    return [
        {"rule": rule, "message": message, "fieldPath": path, "reason": "FieldValueForbidden"}
        for rule, message, path in rules
    ]
