"""The PolicyGroup CustomResourceDefinition, generated from `PolicyGroupSpec` and `PolicyGroupStatus`.

pydantic's JSON Schema is turned into a Kubernetes structural schema (OpenAPI v3.0 subset): `$ref`s are
inlined, `anyOf [X, null]` becomes `X` with `nullable: true`, `exclusiveMinimum` takes the v3.0 boolean form,
free-form maps keep `x-kubernetes-preserve-unknown-fields`, and cross-field rules are CEL
`x-kubernetes-validations` (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
custom-resource-definitions/#specifying-a-structural-schema and #validation-rules).
"""

from __future__ import annotations

import copy
from typing import Any

import yaml
from pydantic import BaseModel

from rlightning import contract
from rlightning.config._pod import GPU_RESOURCE, QUANTITY_MAX_LENGTH, QUANTITY_PATTERN
from rlightning.config._spec import NAME_PATTERN, NCCL_NAME_PATTERN, PolicyGroupSpec
from rlightning.config._status import PolicyGroupStatus
from rlightning.config._template import template_rules

# CEL rules per model ($defs name), each mirrored by a pydantic validator in that model.
_GPU = GPU_RESOURCE
_CEL_RULES: dict[str, list[dict[str, str]]] = {
    "EvalConfig": [
        {
            "rule": "self.minReplicas <= self.replicas && self.replicas <= self.maxReplicas",
            "message": "replicas must satisfy minReplicas <= replicas <= maxReplicas",
            "fieldPath": ".replicas",
            "reason": "FieldValueInvalid",
        },
    ],
    "ResourceRequirements": [
        {
            "rule": (
                f"!has(self.requests) || !('{_GPU}' in self.requests) || "
                f"(has(self.limits) && '{_GPU}' in self.limits && self.limits['{_GPU}'] == self.requests['{_GPU}'])"
            ),
            "message": f"requests.{_GPU} must equal limits.{_GPU} (extended resources are not overcommitted)",
            "fieldPath": ".requests",
            "reason": "FieldValueInvalid",
        },
        {
            # Kubernetes' CEL quantity library (1.28+; kubernetes.io/docs/reference/using-api/cel/
            # #kubernetes-quantity-library). isQuantity skips values the pattern already refuses.
            "rule": (
                "!has(self.requests) || !has(self.limits) || self.requests.all(name, !(name in self.limits) || "
                "!isQuantity(self.requests[name]) || !isQuantity(self.limits[name]) || "
                "!quantity(self.requests[name]).isGreaterThan(quantity(self.limits[name])))"
            ),
            "message": "each request must not exceed the limit of the same resource",
            "fieldPath": ".requests",
            "reason": "FieldValueInvalid",
        },
    ],
    "DisruptionBudgetConfig": [
        {
            "rule": "has(self.maxUnavailable) != has(self.minAvailable)",
            "message": "set exactly one of maxUnavailable and minAvailable",
            "reason": "FieldValueInvalid",
        },
    ],
    "PortsConfig": [
        {
            "rule": (
                "self.torchrun != self.weightSync && (self.metrics == 0 || "
                "(self.metrics != self.torchrun && self.metrics != self.weightSync))"
            ),
            "message": "torchrun, weightSync and metrics (unless 0) must be distinct ports",
            "reason": "FieldValueInvalid",
        },
    ],
}
_CEL_RULES["TrainConfig"] = [
    *template_rules(contract.PolicyRole.TRAIN),
    {
        # TrainConfig._one_rank_per_gpu.
        "rule": (
            f"!has(self.pod.resources.limits) || !('{_GPU}' in self.pod.resources.limits) || "
            f"!isQuantity(self.pod.resources.limits['{_GPU}']) || "
            f"(quantity(self.pod.resources.limits['{_GPU}']).isInteger() && "
            f"quantity(self.pod.resources.limits['{_GPU}']).asInteger() == self.procsPerNode)"
        ),
        "message": f"procsPerNode must equal pod.resources.limits.{_GPU} (one DDP rank per GPU)",
        "fieldPath": ".procsPerNode",
        "reason": "FieldValueInvalid",
    },
]
_CEL_RULES["EvalConfig"] += template_rules(contract.PolicyRole.EVAL)
_CEL_RULES["PolicyGroupSpec"] = [
    {
        # PolicyGroupSpec._trajectory_ports_free: a trainer pod binds trajectories + r for each local rank r.
        "rule": (
            "self.ports.trajectories + self.train.procsPerNode - 1 <= 65535 && "
            "[self.ports.torchrun, self.ports.weightSync, self.ports.metrics].all(port, "
            "port < self.ports.trajectories || port >= self.ports.trajectories + self.train.procsPerNode)"
        ),
        "message": (
            "ports trajectories .. trajectories + train.procsPerNode - 1 (one per rank of a trainer pod) must be "
            "<= 65535 and not include torchrun, weightSync or metrics"
        ),
        "fieldPath": ".ports.trajectories",
        "reason": "FieldValueInvalid",
    },
    {
        # PolicyGroupSpec._rollout_workers_fit.
        "rule": "!has(self.eval.rolloutWorkers) || self.eval.rolloutWorkers <= 1 || self.policy.rolloutMode == 'async'",
        "message": "more than 1 needs policy.rolloutMode async",
        "fieldPath": ".eval.rolloutWorkers",
        "reason": "FieldValueInvalid",
    },
    {
        "rule": "!has(self.eval.rolloutWorkers) || self.eval.rolloutWorkers <= self.env.numEnvs",
        "message": "at most env.numEnvs (each worker steps its own env copies)",
        "fieldPath": ".eval.rolloutWorkers",
        "reason": "FieldValueInvalid",
    },
]
_CEL_RULES["PolicyGroupSpec"].append(
    {
        # PolicyGroupSpec._nccl_names.
        "rule": f"!has(self.nccl) || self.nccl.all(name, name.matches('{NCCL_NAME_PATTERN}'))",
        "message": f"only NCCL settings (names matching {NCCL_NAME_PATTERN}) belong in nccl",
        "fieldPath": ".nccl",
        "reason": "FieldValueInvalid",
    }
)
_ROOT_RULES = [
    {
        "rule": f"size(self.metadata.name) <= {contract.MAX_GROUP_NAME_LENGTH}",
        "message": f"metadata.name must be at most {contract.MAX_GROUP_NAME_LENGTH} characters "
        "(children add suffixes; pod names must fit 63-character labels)",
    },
    {
        "rule": f"self.metadata.name.matches('{NAME_PATTERN}')",
        "message": "metadata.name must be a DNS label: lower-case letters, digits and '-', starting with a letter",
    },
]
# Maps whose values are Kubernetes quantities (pydantic checks them in a field validator).
_QUANTITY_MAPS = {("ResourceRequirements", "requests"), ("ResourceRequirements", "limits")}
_DROPPED_KEYS = ("title", "$defs")


def _convert(node: Any, defs: dict[str, Any], *, keep_defaults: bool, model: str | None = None) -> Any:  # noqa: C901 - one case per JSON Schema construct
    """Turn one pydantic JSON Schema node into its structural OpenAPI v3.0 form (recursively)."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    if "required" in node:  # a $def inlined twice must not share its list (YAML would write an anchor)
        node["required"] = list(node["required"])
    if "$ref" in node:  # inline, keeping the field's own description and default
        name = node.pop("$ref").rsplit("/", 1)[-1]
        inlined = _convert(defs[name], defs, keep_defaults=keep_defaults, model=name)
        inlined.update({key: value for key, value in node.items() if key not in _DROPPED_KEYS})
        if keep_defaults and "default" not in inlined and "required" not in inlined:
            # The API server applies nested defaults only under a present parent, and checks a default
            # against the CEL rules as written: so the default is the object of its fields' defaults.
            properties = inlined.get("properties", {})
            inlined["default"] = {key: value["default"] for key, value in properties.items() if "default" in value}
        return _clean(inlined, keep_defaults)
    any_of = node.pop("anyOf", None)
    if any_of is not None:
        options = [option for option in any_of if option.get("type") != "null"]
        if sorted(option.get("type", "") for option in options) == ["integer", "string"]:
            options = [_int_or_string(options)]
        if len(options) != 1:
            raise ValueError(f"cannot express anyOf {any_of} in a structural schema")
        merged = _convert(options[0], defs, keep_defaults=keep_defaults)
        merged.update({key: value for key, value in node.items() if key not in _DROPPED_KEYS})
        if len(options) != len(any_of):
            merged["nullable"] = True
        return _clean(merged, keep_defaults)
    if "const" in node:
        node["enum"] = [node.pop("const")]
    if isinstance(node.get("exclusiveMinimum"), (int, float)) and not isinstance(node["exclusiveMinimum"], bool):
        node["minimum"], node["exclusiveMinimum"] = node["exclusiveMinimum"], True
    if isinstance(node.get("exclusiveMaximum"), (int, float)) and not isinstance(node["exclusiveMaximum"], bool):
        node["maximum"], node["exclusiveMaximum"] = node["exclusiveMaximum"], True
    if node.get("type") == "object":
        extra = node.pop("additionalProperties", None)
        properties = node.get("properties")
        if properties is not None:
            converted = {}
            for key, value in properties.items():
                child = _convert(value, defs, keep_defaults=keep_defaults)
                if (model, key) in _QUANTITY_MAPS:
                    child["additionalProperties"] = {
                        "type": "string", "pattern": QUANTITY_PATTERN, "maxLength": QUANTITY_MAX_LENGTH
                    }
                if key in node.get("required", ()):
                    child.pop("default", None)  # a required field has no default
                converted[key] = child
            node["properties"] = converted
        if extra is True or (extra is None and properties is None):
            node["x-kubernetes-preserve-unknown-fields"] = True
        elif isinstance(extra, dict):
            node["additionalProperties"] = _convert(extra, defs, keep_defaults=keep_defaults)
        if model in _CEL_RULES:
            node["x-kubernetes-validations"] = copy.deepcopy(_CEL_RULES[model])
    if node.get("type") == "array" and "items" in node:
        node["items"] = _convert(node["items"], defs, keep_defaults=keep_defaults)
    return _clean(node, keep_defaults)


def _int_or_string(options: list[dict[str, Any]]) -> dict[str, Any]:
    """One structural schema for `anyOf [integer, string]` (Kubernetes IntOrString): no type, the marker
    `x-kubernetes-int-or-string`, and each option's constraints (the API server checks a number's only against
    numbers, a pattern only against strings).
    """
    merged: dict[str, Any] = {"x-kubernetes-int-or-string": True}
    for option in options:
        merged.update({key: value for key, value in option.items() if key != "type"})
    return merged


_KEY_ORDER = ("type", "description", "nullable", "default", "enum", "pattern", "minLength", "maxLength", "minimum",
              "exclusiveMinimum", "maximum", "exclusiveMaximum")


def _clean(node: dict[str, Any], keep_defaults: bool) -> dict[str, Any]:
    """Drop pydantic-only keys and null defaults; order keys for reading (type, description, ..., properties)."""
    for key in _DROPPED_KEYS:
        node.pop(key, None)
    if "default" in node and (not keep_defaults or node["default"] is None):
        del node["default"]
    first = [key for key in _KEY_ORDER if key in node]
    return {key: node[key] for key in first + sorted(set(node) - set(first))}


def model_schema(model: type[BaseModel], *, keep_defaults: bool) -> dict[str, Any]:
    """The structural OpenAPI v3.0 schema of a config model, as used in the CRD.

    Args:
        model (type[BaseModel]): A model from `rlightning.config`, for example `PolicyGroupSpec`.
        keep_defaults (bool): Emit defaults so that the API server fills them in (spec); status has none,
            so that it holds only what its writers wrote.

    Returns:
        dict[str, Any]: The schema, with every `$ref` inlined and every property described.

    Raises:
        ValueError: A field's type cannot be expressed as a structural schema.
    """
    raw = model.model_json_schema(by_alias=True, mode="validation")
    return _convert(raw, raw.get("$defs", {}), keep_defaults=keep_defaults, model=model.__name__)


def _printer_columns() -> list[dict[str, Any]]:
    return [
        {"name": "Phase", "type": "string", "jsonPath": ".status.phase", "description": "Lifecycle phase."},
        {
            "name": "Trainers",
            "type": "string",
            "jsonPath": ".status.train.summary",
            "description": "Trainer pods ready/desired.",
        },
        {
            "name": "Evaluators",
            "type": "string",
            "jsonPath": ".status.eval.summary",
            "description": "Evaluator pods ready/desired.",
        },
        {
            "name": "Restarts",
            "type": "integer",
            "jsonPath": ".status.restarts.total",
            "description": "Restarts of the trainer gang (failures and disruptions).",
        },
        {
            "name": "Weights",
            "type": "integer",
            "jsonPath": ".status.training.weightVersion",
            "description": "Newest weight version published to the evaluators.",
        },
        {
            "name": "Consistent",
            "type": "boolean",
            "jsonPath": ".status.training.consistent",
            "description": "Whether every evaluator holds the trainer's weights.",
        },
        {
            "name": "Steps/s",
            "type": "number",
            "jsonPath": ".status.training.envStepsPerSecond",
            "description": "Env steps trained on per second in the last iteration.",
        },
        {
            "name": "Lag",
            "type": "number",
            "jsonPath": ".status.training.policyLagMean",
            "description": "Mean policy lag (weight versions) of the evaluator batches trained on last.",
        },
        {
            "name": "Reason",
            "type": "string",
            "jsonPath": '.status.conditions[?(@.type=="Ready")].reason',
            "description": "Why the group is or is not Ready: AllReady, Waiting, CrashLoopBackOff, Unschedulable, ...",
        },
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]


def build_crd() -> dict[str, Any]:
    """The PolicyGroup CustomResourceDefinition (apiextensions.k8s.io/v1) as a plain dict.

    `crds/policygroups.rlightning.io.yaml` is this dict dumped as YAML (`rlightning crd`); a test fails
    when the two differ.

    Returns:
        dict[str, Any]: The CRD: group rlightning.io, version v1alpha1 (served, storage), namespaced kind
            PolicyGroup (plural policygroups, short name pg, category rlightning), with status and scale
            subresources and printer columns.
    """
    spec_schema = model_schema(PolicyGroupSpec, keep_defaults=True)
    status_schema = model_schema(PolicyGroupStatus, keep_defaults=False)
    status_schema["description"] = "Observed state, written by the operator and by trainer rank 0 (training)."
    schema = {
        "type": "object",
        "description": "A policy trained by DDP trainers and served by an evaluation fleet that follows its weights.",
        "required": ["spec"],
        "properties": {
            "apiVersion": {"type": "string", "description": "rlightning.io/v1alpha1."},
            "kind": {"type": "string", "description": "PolicyGroup."},
            "metadata": {"type": "object"},  # the API server allows nothing else here
            "spec": spec_schema,
            "status": status_schema,
        },
        "x-kubernetes-validations": copy.deepcopy(_ROOT_RULES),
    }
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": contract.CRD_NAME,
            "labels": {"app.kubernetes.io/name": "rlightning", "app.kubernetes.io/part-of": "rlightning"},
        },
        "spec": {
            "group": contract.API_GROUP,
            "scope": "Namespaced",
            "names": {
                "kind": contract.KIND,
                "listKind": f"{contract.KIND}List",
                "plural": contract.PLURAL,
                "singular": contract.SINGULAR,
                "shortNames": list(contract.SHORT_NAMES),
                "categories": list(contract.CATEGORIES),
            },
            "versions": [
                {
                    "name": contract.API_VERSION,
                    "served": True,
                    "storage": True,
                    "schema": {"openAPIV3Schema": schema},
                    "subresources": {
                        "status": {},
                        "scale": {
                            "specReplicasPath": ".spec.eval.replicas",
                            "statusReplicasPath": ".status.replicas",
                            "labelSelectorPath": ".status.selector",
                        },
                    },
                    "additionalPrinterColumns": _printer_columns(),
                }
            ],
        },
    }


def crd_yaml() -> str:
    """`build_crd()` as the YAML text checked in under `crds/` (block style, keys in insertion order).

    Returns:
        str: One YAML document with a leading comment naming its generator.
    """
    header = "# Generated from rlightning.config by `rlightning crd` (`make crd`). Do not edit.\n"
    return header + yaml.safe_dump(build_crd(), sort_keys=False, width=120, allow_unicode=True)
