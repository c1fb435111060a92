"""Runtime: the process entrypoints that run in pods and locally, and the local launcher behind `rlightning run`.

Belongs here: `train` (`python -m rlightning.runtime.train`, under torchrun; its rank 0 tracks the evaluator
fleet in `_fleet`, decides the stop in `_stop` and writes the records in `_records`) and `eval`
(`python -m rlightning.runtime.eval`), configured only by the contract's ENV_* variables (`settings`) and the
manifest at ENV_SPEC_PATH; the deep manifest checks (`validate`); the run directory layout and its records
(`rundir`, `report`); the local launcher (`local`) and its terminal view (`progress`); rollout collection
(`collector`, written with the policies). Not here: the policies and the weight-sync protocol (see
`rlightning.policy`, `rlightning.weights`), Kubernetes objects (the operator).

The entrypoint modules import torch; import them directly rather than through this package.
"""

from rlightning.runtime.rundir import RunDir, default_run_dir
from rlightning.runtime.settings import ProcessSettings, SettingsError, eval_ordinal
from rlightning.runtime.validate import check_manifest, validate_file

__all__ = [
    "ProcessSettings",
    "RunDir",
    "SettingsError",
    "check_manifest",
    "default_run_dir",
    "eval_ordinal",
    "validate_file",
]
