"""The merge of a role's pod template (`spec.<role>.template`) with the pod the operator builds. Pure.

Validation (`rlightning.config._template`) has already refused every field the operator owns, so the merge adds
and never overwrites: the user's labels and annotations beside the operator's, the user's volumes, containers and
initContainers after the operator's; of the runtime container (the template's container named after the role)
env, envFrom and volumeMounts after the operator's and any other field as written (securityContext, workingDir,
lifecycle, ...); every other pod field as written (imagePullSecrets, serviceAccountName, securityContext,
runtimeClassName, ...). The `pod:` shorthand's fields are in `pod_spec` already; a template may not set them.
"""

from __future__ import annotations

import copy
from typing import Any

from rlightning.config import PodTemplate

_APPENDED = ("containers", "initContainers", "volumes")
"""Lists of the pod spec where the user's items follow the operator's."""
_APPENDED_IN_RUNTIME = ("env", "envFrom", "volumeMounts")
"""Lists of the runtime container where the user's items follow the operator's."""


def merge(
    pod_spec: dict[str, Any], metadata: dict[str, Any], template: PodTemplate | None, role: str
) -> tuple[dict[str, Any], dict[str, Any]]:
    """A role's pod spec and pod metadata with the user's template merged in.

    Args:
        pod_spec (dict[str, Any]): The pod spec the operator built; its runtime container is named `role`.
        metadata (dict[str, Any]): The pod template's metadata the operator built (labels, annotations).
        template (PodTemplate | None): The validated `spec.<role>.template`; None leaves both unchanged.
        role (str): `train` or `eval`.

    Returns:
        tuple[dict[str, Any], dict[str, Any]]: New pod spec and metadata; labels and annotations sorted by key.
    """
    spec, meta = copy.deepcopy(pod_spec), copy.deepcopy(metadata)
    if template is None:
        return spec, meta
    wire = template.wire()
    for kind in ("labels", "annotations"):
        added = wire["metadata"].get(kind, {})
        if added:
            meta[kind] = dict(sorted({**meta.get(kind, {}), **added}.items()))
    user = wire["spec"]
    runtime = next(c for c in spec["containers"] if c["name"] == role)
    user_runtime: dict[str, Any] = next((c for c in user.get("containers", []) if c["name"] == role), {})
    for field, value in user_runtime.items():
        if field in _APPENDED_IN_RUNTIME:
            runtime[field] = [*runtime.get(field, []), *value]
        elif field != "name":
            runtime[field] = value
    for field, value in user.items():
        if field in _APPENDED:
            items = [item for item in value if not (field == "containers" and item["name"] == role)]
            if items:
                spec[field] = [*spec.get(field, []), *items]
        else:
            spec[field] = value
    return spec, meta
