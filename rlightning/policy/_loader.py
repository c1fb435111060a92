"""Loading a policy class from its import path (`spec.policy.policyClass`) and building a policy from a spec."""

from __future__ import annotations

import importlib

from rlightning.config import PolicyConfig
from rlightning.policy import base_policy


def load_policy_class(path: str) -> type[base_policy.BasePolicy]:
    """Import `"package.module:ClassName"` and check it is a concrete BasePolicy subclass.

    Args:
        path (str): The import path, as in `spec.policy.policyClass`.

    Returns:
        type[BasePolicy]: The class.

    Raises:
        ValueError: When `path` is not of the form `module:Class`.
        ImportError: When the module cannot be imported.
        AttributeError: When the module has no such attribute.
        TypeError: When the attribute is not a concrete BasePolicy subclass.
    """
    module_name, sep, class_name = path.partition(":")
    if not sep or not module_name or not class_name or ":" in class_name:
        raise ValueError(f"policy class must be written 'package.module:ClassName', got {path!r}")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        raise ImportError(f"cannot import module {module_name!r} of policy class {path!r}: {error}") from error
    try:
        cls = getattr(module, class_name)
    except AttributeError:
        raise AttributeError(f"module {module_name!r} has no attribute {class_name!r}") from None
    if not isinstance(cls, type) or not issubclass(cls, base_policy.BasePolicy):
        raise TypeError(f"{path!r} is not a subclass of rlightning.policy.BasePolicy")
    if getattr(cls, "__abstractmethods__", None):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TypeError(f"{path!r} is abstract: it does not implement {missing}")
    return cls


def build_policy(config: PolicyConfig, role: base_policy.PolicyRole | str) -> base_policy.BasePolicy:
    """Construct the policy `spec.policy` names, for a role (not initialised yet: call `init_train`/`init_eval`).

    Args:
        config (PolicyConfig): `spec.policy`.
        role (PolicyRole | str): `train` or `eval`.

    Returns:
        BasePolicy: The new policy.

    Raises:
        ValueError, ImportError, AttributeError, TypeError: From `load_policy_class` or the class's own
            validation of `policy_kwargs` (pydantic.ValidationError is a ValueError).
    """
    return load_policy_class(config.policy_class)(config, role)
