"""What a trainer or evaluator process learns from its environment: the ENV_* variables of the contract, and
torchrun's (`rlightning.contract.TorchrunEnv`).

Pods and the processes of `rlightning run` get them from the same launch plan (`rlightning.launch`). Nothing
else configures a process: the rest comes from the manifest at `ENV_SPEC_PATH`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from rlightning import contract, launch


class SettingsError(ValueError):
    """An environment variable of the contract is missing or malformed; the message names it."""


def _int(environ: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None or raw == "":
        if default is None:
            raise SettingsError(f"{name}: required environment variable is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise SettingsError(f"{name}: expected an integer, got {raw!r}") from None


def eval_ordinal(environ: Mapping[str, str]) -> int:
    """An evaluator's ordinal: `ENV_EVAL_ORDINAL`, else the trailing `-N` of `ENV_POD_NAME` (StatefulSet pods).

    Args:
        environ (Mapping[str, str]): The process environment.

    Returns:
        int: The ordinal, >= 0.

    Raises:
        SettingsError: Neither variable gives an ordinal.
    """
    if environ.get(contract.ENV_EVAL_ORDINAL, "") != "":
        ordinal = _int(environ, contract.ENV_EVAL_ORDINAL)
        if ordinal < 0:
            raise SettingsError(f"{contract.ENV_EVAL_ORDINAL}: must be >= 0, got {ordinal}")
        return ordinal
    pod_name = environ.get(contract.ENV_POD_NAME, "")
    match = re.search(r"-(\d+)$", pod_name)
    if match is None:
        raise SettingsError(
            f"{contract.ENV_EVAL_ORDINAL}: not set, and {contract.ENV_POD_NAME}={pod_name!r} does not end in -<ordinal>"
        )
    return int(match.group(1))


@dataclass(frozen=True)
class ProcessSettings:
    """The contract's environment variables, parsed.

    Attributes:
        group_name (str): metadata.name of the PolicyGroup (`ENV_GROUP_NAME`).
        namespace (str | None): Its namespace; None when running locally (`ENV_NAMESPACE`).
        spec_path (Path): The validated manifest (`ENV_SPEC_PATH`).
        run_dir (Path): Where metrics, checkpoints and the summary go (`ENV_RUN_DIR`).
        master_addr (str): Host of trainer rank 0, which hosts the weight-sync store (`ENV_TRAIN_MASTER_ADDR`).
        weight_sync_port (int): Port of the weight-sync store (`ENV_WEIGHT_SYNC_PORT`).
        metrics_port (int): Prometheus port; 0 disables it (`ENV_METRICS_PORT`).
        report_status (bool): Whether trainer rank 0 patches status.training (`ENV_REPORT_STATUS` = `1`).
        role (str | None): A `contract.PolicyRole` value (`ENV_ROLE`); None when unset (an entrypoint started by
            hand).
        expected_evaluators (int | None): Evaluators the local launcher started (`ENV_EXPECTED_EVALUATORS`);
            None in pods, where the trainer counts the evaluators registered with its weight sender.
        trajectory_endpoints (tuple[str, ...]): `host:port` of every trainer rank's trajectory intake
            (`ENV_TRAJECTORY_ENDPOINTS`, evaluators only); empty when unset.
        fleet_data (bool): Whether the evaluators produce the training data (`ENV_FLEET_DATA` = `1`).
        health_file (Path | None): The file of the pod's probe (`ENV_HEALTH_FILE`); None outside pods.
        attempt (int): The trainer gang's attempt (`ENV_TRAIN_ATTEMPT`); 0 outside the operator's pods.
        epoch (int): The fencing epoch of that attempt (`ENV_TRAIN_EPOCH`, `contract.train_epoch`); the attempt
            when unset.
        bind_host (str | None): The address the process's listening ports bind (`ENV_BIND_HOST`): 127.0.0.1 in
            a local run; None (unset, pods): all interfaces.
        launch_time (float | None): Epoch seconds when `rlightning run` started (`ENV_LAUNCH_TIME`); None in pods.
        torchrun (contract.TorchrunEnv): The rank, local rank and world size torchrun set (`RANK`, `LOCAL_RANK`,
            `WORLD_SIZE`); defaults (rank 0 of one) in an evaluator or a process started by hand.
    """

    group_name: str
    namespace: str | None
    spec_path: Path
    run_dir: Path
    master_addr: str
    weight_sync_port: int
    metrics_port: int
    report_status: bool
    role: str | None = None
    expected_evaluators: int | None = None
    trajectory_endpoints: tuple[str, ...] = ()
    fleet_data: bool = False
    health_file: Path | None = None
    attempt: int = 0
    epoch: int = 0
    bind_host: str | None = None
    launch_time: float | None = None
    torchrun: contract.TorchrunEnv = contract.TorchrunEnv()

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> ProcessSettings:
        """Read the settings from the environment.

        Args:
            environ (Mapping[str, str] | None, optional): Defaults to `os.environ`.

        Returns:
            ProcessSettings: The parsed settings.

        Raises:
            SettingsError: A required variable is missing, a number is malformed or the role is unknown.
        """
        environ = os.environ if environ is None else environ
        role = environ.get(contract.ENV_ROLE) or None
        if role is not None and role not in tuple(contract.PolicyRole):
            allowed = " or ".join(repr(member.value) for member in contract.PolicyRole)
            raise SettingsError(f"{contract.ENV_ROLE}: must be {allowed}, got {role!r}")
        expected = environ.get(contract.ENV_EXPECTED_EVALUATORS, "")
        expected_evaluators = None if expected == "" else _int(environ, contract.ENV_EXPECTED_EVALUATORS)
        if expected_evaluators is not None and expected_evaluators < 0:
            raise SettingsError(f"{contract.ENV_EXPECTED_EVALUATORS}: must be >= 0, got {expected_evaluators}")
        endpoints = tuple(e for e in environ.get(contract.ENV_TRAJECTORY_ENDPOINTS, "").split(",") if e)
        malformed = [e for e in endpoints if not re.fullmatch(r"[^\s:,]+:\d{1,5}", e)]
        if malformed:
            raise SettingsError(
                f"{contract.ENV_TRAJECTORY_ENDPOINTS}: expected comma-separated host:port, got {malformed}"
            )
        launch_time = environ.get(contract.ENV_LAUNCH_TIME, "")
        try:
            launched_at = float(launch_time) if launch_time else None
        except ValueError:
            raise SettingsError(f"{contract.ENV_LAUNCH_TIME}: expected epoch seconds, got {launch_time!r}") from None
        try:
            torchrun = contract.TorchrunEnv.from_env(environ)
        except ValueError as error:
            raise SettingsError(str(error)) from None
        spec_path = environ.get(contract.ENV_SPEC_PATH, "")
        if not spec_path:
            raise SettingsError(f"{contract.ENV_SPEC_PATH}: required environment variable is not set")
        return cls(
            group_name=environ.get(contract.ENV_GROUP_NAME, ""),
            namespace=environ.get(contract.ENV_NAMESPACE) or None,
            spec_path=Path(spec_path),
            run_dir=Path(environ.get(contract.ENV_RUN_DIR) or contract.DEFAULT_RUN_DIR_IN_POD),
            master_addr=environ.get(contract.ENV_TRAIN_MASTER_ADDR) or "127.0.0.1",
            weight_sync_port=_int(environ, contract.ENV_WEIGHT_SYNC_PORT, contract.WEIGHT_SYNC_PORT),
            metrics_port=_int(environ, contract.ENV_METRICS_PORT, 0),
            report_status=environ.get(contract.ENV_REPORT_STATUS, "") == "1",
            role=role,
            expected_evaluators=expected_evaluators,
            trajectory_endpoints=endpoints,
            fleet_data=environ.get(contract.ENV_FLEET_DATA, "") == "1",
            health_file=Path(environ[contract.ENV_HEALTH_FILE]) if environ.get(contract.ENV_HEALTH_FILE) else None,
            attempt=_int(environ, contract.ENV_TRAIN_ATTEMPT, 0),
            epoch=_int(environ, contract.ENV_TRAIN_EPOCH, _int(environ, contract.ENV_TRAIN_ATTEMPT, 0)),
            bind_host=environ.get(contract.ENV_BIND_HOST) or None,
            launch_time=launched_at,
            torchrun=torchrun,
        )

    def require_role(self, entrypoint_role: contract.PolicyRole) -> None:
        """Check that the process was started as the role of the entrypoint it runs.

        A pod whose `ENV_ROLE` names the other role runs the wrong entrypoint (a template or command mix-up);
        failing at once is clearer than a trainer and an evaluator that wait for each other forever.

        Args:
            entrypoint_role (contract.PolicyRole): The entrypoint's role.

        Raises:
            SettingsError: `ENV_ROLE` is set to a different role (unset is accepted: a process started by hand).
        """
        if self.role is not None and self.role != entrypoint_role:
            raise SettingsError(
                f"{contract.ENV_ROLE}: is {self.role!r} but this is the {entrypoint_role.value!r} entrypoint "
                f"({launch.TRAIN_MODULE if entrypoint_role == contract.PolicyRole.TRAIN else launch.EVAL_MODULE})"
            )
