"""Configuration: pydantic models of a PolicyGroup and the loading of manifest files.

Pure data and validation; no torch, no kopf, no I/O beyond reading a manifest file. The CRD in `crds/` is
generated from `PolicyGroupSpec` and `PolicyGroupStatus`; pods and the CLI validate with the same models.
"""

from rlightning.config._crd import build_crd, crd_yaml
from rlightning.config._load import ManifestError, format_validation_error, load_manifest, parse_manifest
from rlightning.config._pod import PodConfig, ResourceRequirements
from rlightning.config._policy import EnvConfig, OptimConfig, PolicyConfig, WeightBufferConfig
from rlightning.config._roles import CheckpointConfig, EvalConfig, TrainConfig, WeightSyncConfig
from rlightning.config._spec import ObjectMeta, PolicyGroupManifest, PolicyGroupSpec, PortsConfig
from rlightning.config._template import PodTemplate
from rlightning.config._timings import SyncTimings
from rlightning.config._status import (
    CheckpointReport,
    Condition,
    EvalStatus,
    PolicyGroupStatus,
    RestartStatus,
    TrainingStatus,
    TrainStatus,
)

__all__ = [
    "CheckpointConfig",
    "CheckpointReport",
    "Condition",
    "EnvConfig",
    "EvalConfig",
    "EvalStatus",
    "ManifestError",
    "ObjectMeta",
    "OptimConfig",
    "PodConfig",
    "PodTemplate",
    "PolicyConfig",
    "PolicyGroupManifest",
    "PolicyGroupSpec",
    "PolicyGroupStatus",
    "PortsConfig",
    "ResourceRequirements",
    "RestartStatus",
    "SyncTimings",
    "TrainConfig",
    "TrainStatus",
    "TrainingStatus",
    "WeightBufferConfig",
    "WeightSyncConfig",
    "build_crd",
    "crd_yaml",
    "format_validation_error",
    "load_manifest",
    "parse_manifest",
]
