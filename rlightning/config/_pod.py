"""What a pod of either role asks of the scheduler: resources and placement."""

from __future__ import annotations

import decimal
import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from rlightning.config._base import SpecModel

# A Kubernetes resource quantity (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/):
# a decimal number, then a binary suffix (Ki..Ei), a decimal SI suffix (n, u, m, k, M..E) or a decimal exponent.
QUANTITY_PATTERN = r"^[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?$"
# Bounds that let the API server's CEL cost estimate admit the request <= limit rule (an unbounded map of
# unbounded strings exceeds its budget); far above any real container's resources.
QUANTITY_MAX_LENGTH = 64
MAX_RESOURCES = 32
# RFC 1123 subdomain: what Kubernetes requires of object names such as a PriorityClass's (at most 253 characters).
DNS_SUBDOMAIN_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
_SUFFIX_FACTORS: dict[str, decimal.Decimal | int] = {
    "": 1, "n": decimal.Decimal("1e-9"), "u": decimal.Decimal("1e-6"), "m": decimal.Decimal("1e-3"),
    "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12, "P": 10**15, "E": 10**18,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60,
}  # fmt: skip


def parse_quantity(text: str) -> decimal.Decimal:
    """The value of a Kubernetes quantity, for example `"500m"` -> 0.5 and `"2Gi"` -> 2147483648.

    Args:
        text (str): A quantity as Kubernetes writes it (see QUANTITY_PATTERN's source).

    Returns:
        decimal.Decimal: Its value in base units (cores, bytes, devices).

    Raises:
        ValueError: When `text` is not a quantity.
    """
    match = re.fullmatch(QUANTITY_PATTERN, text)
    if match is None:
        raise ValueError(f"{text!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
    number = text[: match.start(3)] if match.group(3) else text
    suffix = match.group(3) or ""
    if suffix[:1] in ("e", "E"):
        return decimal.Decimal(number) * decimal.Decimal(10) ** int(suffix[1:])
    return decimal.Decimal(number) * _SUFFIX_FACTORS[suffix]
DEFAULT_SHM_SIZE = "1Gi"
"""/dev/shm of every pod: NVIDIA's PyTorch containers are run with `--shm-size=1g` (NGC containers user guide,
"Running a container"); KubeRay and Kubeflow mount a memory-backed emptyDir there for the same reason."""
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource name of NVIDIA GPUs (device plugin)."""


class ResourceRequirements(SpecModel):
    """Requests and limits in Kubernetes' own form, for example `{"cpu": "2", "memory": "4Gi"}`.

    GPUs are the extended resource `nvidia.com/gpu`; Kubernetes needs it in limits (requests default to it).
    """

    requests: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCES,
        description="Resources the scheduler reserves, by name (cpu, memory, nvidia.com/gpu), as quantities.",
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        max_length=MAX_RESOURCES,
        description="Hard caps by resource name, as quantities. nvidia.com/gpu must be set here to get GPUs.",
    )

    def cpu_cores(self) -> decimal.Decimal | None:
        """The container's CPU in cores: its limit, else its request (what it may use); None when neither is set."""
        cpu = self.limits.get("cpu", self.requests.get("cpu"))
        return None if cpu is None else parse_quantity(cpu)

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        for name, quantity in value.items():
            if len(str(quantity)) > QUANTITY_MAX_LENGTH or re.fullmatch(QUANTITY_PATTERN, str(quantity)) is None:
                raise ValueError(f"{name}: {quantity!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
        return value

    @model_validator(mode="after")
    def _requests_within_limits(self) -> ResourceRequirements:
        # The API server rejects a pod whose request exceeds its limit; say so before any pod is built.
        for name in sorted(self.requests.keys() & self.limits.keys()):
            if parse_quantity(self.requests[name]) > parse_quantity(self.limits[name]):
                raise ValueError(
                    f"requests.{name}: must not exceed limits.{name}, "
                    f"got requests={self.requests[name]!r}, limits={self.limits[name]!r}"
                )
        return self

    @model_validator(mode="after")
    def _gpu_requests_match_limits(self) -> ResourceRequirements:
        # Kubernetes rejects an extended resource whose request differs from its limit.
        request = self.requests.get(GPU_RESOURCE)
        if request is not None and self.limits.get(GPU_RESOURCE) != request:
            raise ValueError(
                f"requests.{GPU_RESOURCE}: must equal limits.{GPU_RESOURCE} (extended resources are not "
                f"overcommitted), got requests={request!r}, limits={self.limits.get(GPU_RESOURCE)!r}"
            )
        return self


class PodConfig(SpecModel):
    """Scheduling of the pods of one role: resources, node selection, tolerations, affinity."""

    resources: ResourceRequirements = Field(
        default_factory=ResourceRequirements,
        description="Container resources; cluster autoscalers size nodes from the requests of pending pods.",
    )
    node_selector: dict[str, str] = Field(
        default_factory=dict, description="Node labels the pod requires (pod.spec.nodeSelector)."
    )
    tolerations: list[dict[str, Any]] = Field(
        default_factory=list, description="Taints the pod tolerates, as Kubernetes Toleration objects."
    )
    affinity: dict[str, Any] = Field(
        default_factory=dict, description="A Kubernetes Affinity object (node, pod and anti-pod affinity)."
    )
    image: str | None = Field(
        default=None, description="Container image for this role; defaults to spec.image."
    )
    shm_size: str = Field(
        default=DEFAULT_SHM_SIZE,
        max_length=QUANTITY_MAX_LENGTH,
        pattern=QUANTITY_PATTERN,
        description=(
            "Size limit of the memory-backed emptyDir mounted at /dev/shm (a container runtime's default of 64 MiB "
            "is too small for torch's shared memory and NCCL). Counts against the pod's memory."
        ),
    )
    priority_class_name: str | None = Field(
        default=None,
        max_length=253,
        pattern=DNS_SUBDOMAIN_PATTERN,
        description=(
            "PriorityClass of this role's pods (pod.spec.priorityClassName): the scheduler preempts lower-priority "
            "pods for them, and node autoscalers order their work by it. The PriorityClass must exist."
        ),
    )
