"""Deep checks of a PolicyGroup manifest: what the pydantic models cannot see on their own.

`rlightning.config.load_manifest` checks structure (fields, types, bounds). The checks here import things:
the gymnasium registry for `spec.env.id`, the policy class named by `spec.policy.policyClass`, and the
class's own `kwargs_model` for `spec.policy.policyKwargs`. The CLI runs both before `validate` and `run`; the
pod entrypoints run both on start, so a manifest the CLI accepts is one the pods accept.
"""

from __future__ import annotations

import importlib
from pathlib import Path

from pydantic import ValidationError

from rlightning.config import ManifestError, PolicyGroupManifest, format_validation_error, load_manifest


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


def check_policy(manifest: PolicyGroupManifest) -> list[str]:
    """Check that the policy class loads, is a BasePolicy subclass and accepts the policy kwargs.

    Kwargs are checked with the class attribute `kwargs_model` (a pydantic model) when the class has one.

    Args:
        manifest (PolicyGroupManifest): A structurally valid manifest.

    Returns:
        list[str]: Problems as `"spec.policy.policyClass: ..."` or `"spec.policy.policyKwargs.<key>: ..."`
            lines; empty when the policy is usable.
    """
    from rlightning.policy import load_policy_class

    policy = manifest.spec.policy
    try:
        policy_class = load_policy_class(policy.policy_class)
    except Exception as error:  # noqa: BLE001 - importing user code may raise anything; report, never crash
        reason = " ".join(line.strip() for line in str(error).splitlines() if line.strip())  # one line per problem
        return [f"spec.policy.policyClass: {reason or type(error).__name__}"]
    kwargs_model = getattr(policy_class, "kwargs_model", None)
    if kwargs_model is None:
        return []
    try:
        kwargs_model.model_validate(policy.policy_kwargs)
    except ValidationError as error:
        return format_validation_error(error, prefix="spec.policy.policyKwargs")
    return []


def check_manifest(manifest: PolicyGroupManifest) -> list[str]:
    """Run every deep check on a structurally valid manifest.

    Args:
        manifest (PolicyGroupManifest): The manifest from `load_manifest` or `parse_manifest`.

    Returns:
        list[str]: One `"<field path>: <rule>"` line per problem; empty when the manifest can run.
    """
    return check_env_id(manifest.spec.env.id) + check_policy(manifest)


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
