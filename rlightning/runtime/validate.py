"""Deep checks of a PolicyGroup manifest: what the pydantic models cannot see on their own.

`rlightning.config.load_manifest` checks structure (fields, types, bounds), as the API server checks it against
the CRD. The checks here import things: the gymnasium registry for `spec.env.id`, the policy class named by
`spec.policy.policyClass`, the class's own `kwargs_model` for `spec.policy.policyKwargs`, and, with one env
copy built from `spec.env` (cheap: no reset, no step), the class's `space_problems` for the env's observation
and action spaces (a continuous-action SAC with a Discrete env). The CLI runs both before `validate` and `run`;
the pod entrypoints run both on start, so a manifest the CLI accepts is one the pods accept.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from rlightning import launch
from rlightning.config import ManifestError, PolicyGroupManifest, format_validation_error, load_manifest

if TYPE_CHECKING:
    from rlightning.policy import BasePolicy


def check_env_id(env_id: str) -> list[str]:
    """Check that `env_id` names a registered gymnasium environment.

    An id of the form `"module:EnvId"` imports `module` first, as `gymnasium.make` does.

    Args:
        env_id (str): The value of `spec.env.id`.

    Returns:
        list[str]: Problems as `"spec.env.id: <rule>"` lines; empty when the id is registered.
    """
    import gymnasium

    module, _, name = env_id.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ImportError as error:
            return [f"spec.env.id: cannot import module {module!r} named in {env_id!r}: {error}"]
    if name not in gymnasium.envs.registry:
        return [f"spec.env.id: {env_id!r} is not a registered gymnasium environment id"]
    return []


def check_policy(manifest: PolicyGroupManifest, spaces: bool = True) -> list[str]:
    """Check that the policy class loads, is a BasePolicy subclass, accepts the policy kwargs and the env's spaces.

    Kwargs are checked with the class attribute `kwargs_model` (a pydantic model) when the class has one; the
    spaces of one env copy made from `spec.env` with the class's `space_problems` (what it declares it supports).

    Args:
        manifest (PolicyGroupManifest): A structurally valid manifest.
        spaces (bool, optional): Also make the env and check its spaces (needs a registered `spec.env.id`).
            Defaults to True.

    Returns:
        list[str]: Problems as `"spec.policy.policyClass: ..."`, `"spec.policy.policyKwargs.<key>: ..."` or
            `"spec.env: ..."` lines; empty when the policy is usable.
    """
    from rlightning.policy import load_policy_class

    policy = manifest.spec.policy
    try:
        policy_class = load_policy_class(policy.policy_class)
    except Exception as error:  # noqa: BLE001 - importing user code may raise anything; report, never crash
        return [f"spec.policy.policyClass: {_one_line(error)}"]
    kwargs_model = getattr(policy_class, "kwargs_model", None)
    if kwargs_model is not None:
        try:
            kwargs_model.model_validate(policy.policy_kwargs)
        except ValidationError as error:
            return format_validation_error(error, prefix="spec.policy.policyKwargs")
    return check_spaces(manifest, policy_class) if spaces else []


def check_spaces(manifest: PolicyGroupManifest, policy_class: type[BasePolicy]) -> list[str]:
    """Make one copy of `spec.env` and check its spaces against what `policy_class` supports.

    Args:
        manifest (PolicyGroupManifest): A structurally valid manifest with a registered `spec.env.id`.
        policy_class (type[BasePolicy]): The loaded policy class.

    Returns:
        list[str]: `"spec.env: cannot make ..."` when the env cannot be made from `spec.env` (its kwargs), else
            one `"spec.policy.policyClass: ..."` line per space the class does not support; empty when it does.
    """
    from rlightning.policy._env_meta import EnvMeta

    env = manifest.spec.env
    try:
        env_meta = EnvMeta.from_env_config(env)
    except Exception as error:  # noqa: BLE001 - an env's constructor may raise anything; report, never crash
        return [f"spec.env: cannot make {env.id!r} with env.kwargs {env.kwargs}: {_one_line(error)}"]
    try:
        problems = policy_class.space_problems(env_meta)
    except Exception as error:  # noqa: BLE001 - user code
        return [f"spec.policy.policyClass: {policy_class.__name__}.space_problems failed: {_one_line(error)}"]
    return [f"spec.policy.policyClass: {problem}" for problem in problems]


def _one_line(error: BaseException) -> str:
    """An exception's message on one line (one line per problem), or its type when it has none."""
    return " ".join(line.strip() for line in str(error).splitlines() if line.strip()) or type(error).__name__


def check_manifest(manifest: PolicyGroupManifest) -> list[str]:
    """Run every deep check on a structurally valid manifest.

    Args:
        manifest (PolicyGroupManifest): The manifest from `load_manifest` or `parse_manifest`.

    Returns:
        list[str]: One `"<field path>: <rule>"` line per problem; empty when the manifest can run.
    """
    env_problems = check_env_id(manifest.spec.env.id)
    return env_problems + check_policy(manifest, spaces=not env_problems)


def paused_fleet(manifest: PolicyGroupManifest) -> bool:
    """Whether the spec trains on the fleet's data (`rlightning.launch.fleet_collects`) with no evaluator.

    In a cluster that is a paused fleet, valid: training waits until the PolicyGroup is scaled up. A local run
    starts exactly `eval.replicas` evaluators and nothing scales it, so it would wait for data forever.

    Args:
        manifest (PolicyGroupManifest): A validated manifest.

    Returns:
        bool: True for `eval.replicas: 0` with the fleet as the data source.
    """
    return manifest.spec.eval.replicas == 0 and launch.fleet_collects(manifest.spec)


PAUSED_FLEET_NOTE = (
    "spec.eval.replicas: 0 evaluators with the fleet as the data source (train.dataSource: fleet): in a cluster a "
    "paused fleet, training waits until it is scaled up; `rlightning run` refuses it"
)
def pod_only_notes(manifest: PolicyGroupManifest) -> list[str]:
    """What `rlightning run` ignores of a manifest: each role's pod template (its processes are no pods).

    Args:
        manifest (PolicyGroupManifest): A validated manifest.

    Returns:
        list[str]: One note per role that has a template, naming the field.
    """
    return [
        f"spec.{role}.template: pods only; `rlightning run` ignores it (its volumes, containers, env, envFrom, "
        "labels, ...: local processes inherit this shell's environment and files)"
        for role, config in (("train", manifest.spec.train), ("eval", manifest.spec.eval))
        if config.template is not None
    ]


PAUSED_FLEET_LOCAL = (
    "spec.eval.replicas: 0 evaluators with the fleet as the data source (train.dataSource: fleet): a local run "
    "would wait for data forever (nothing scales it up); set eval.replicas >= 1, or train.dataSource: trainers"
)


def validate_file(path: str | Path) -> PolicyGroupManifest:
    """Load a manifest file and run the structural and the deep checks.

    Args:
        path (str | Path): The manifest (YAML, one document).

    Returns:
        PolicyGroupManifest: The validated manifest.

    Raises:
        ManifestError: With one line per problem; deep checks run only on a structurally valid manifest.
    """
    manifest = load_manifest(path)
    problems = check_manifest(manifest)
    if problems:
        raise ManifestError(problems)
    return manifest
