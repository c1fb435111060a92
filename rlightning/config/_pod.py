"""What a pod of either role asks of the scheduler: resources and placement."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator, model_validator

from rlightning.config._base import StrictModel

# A Kubernetes resource quantity (https://kubernetes.io/docs/reference/kubernetes-api/common-definitions/quantity/).
QUANTITY_PATTERN = r"^([+-]?[0-9.]+)([eEinumkKMGTP]*[-+]?[0-9]*)$"
GPU_RESOURCE = "nvidia.com/gpu"
"""The extended resource name of NVIDIA GPUs (device plugin)."""


class ResourceRequirements(StrictModel):
    """Requests and limits in Kubernetes' own form, for example `{"cpu": "2", "memory": "4Gi"}`.

    GPUs are the extended resource `nvidia.com/gpu`; Kubernetes needs it in limits (requests default to it).
    """

    requests: dict[str, str] = Field(
        default_factory=dict,
        description="Resources the scheduler reserves, by name (cpu, memory, nvidia.com/gpu), as quantities.",
    )
    limits: dict[str, str] = Field(
        default_factory=dict,
        description="Hard caps by resource name, as quantities. nvidia.com/gpu must be set here to get GPUs.",
    )

    @field_validator("requests", "limits")
    @classmethod
    def _quantities(cls, value: dict[str, str]) -> dict[str, str]:
        import re

        for name, quantity in value.items():
            if not re.match(QUANTITY_PATTERN, str(quantity)):
                raise ValueError(f"{name}={quantity!r} is not a Kubernetes quantity such as '500m', '2' or '4Gi'")
        return value

    @model_validator(mode="after")
    def _gpu_requests_match_limits(self) -> ResourceRequirements:
        # Kubernetes rejects an extended resource whose request differs from its limit.
        request = self.requests.get(GPU_RESOURCE)
        if request is not None and self.limits.get(GPU_RESOURCE) != request:
            raise ValueError(
                f"requests.{GPU_RESOURCE} must equal limits.{GPU_RESOURCE} (extended resources are not "
                f"overcommitted), got requests={request!r}, limits={self.limits.get(GPU_RESOURCE)!r}"
            )
        return self


class PodConfig(StrictModel):
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
