"""Reading a PolicyGroup manifest file into models, with one line per problem."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlightning.config._spec import PolicyGroupManifest


class ManifestError(ValueError):
    """A manifest that cannot be used; `problems` holds one `"<field path>: <rule>"` line each.

    Args:
        problems (list[str]): Human-readable problems, each naming the field (camelCase path) and the rule.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def format_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """Turn a pydantic `ValidationError` into `"<path>: <message>"` lines with camelCase paths.

    Args:
        error (ValidationError): The error raised by a model.
        prefix (str, optional): Path prepended to every location, for example `"spec.policy.policyKwargs"`.
            Defaults to "".

    Returns:
        list[str]: One line per error, in pydantic's order.
    """
    lines = []
    for item in error.errors():
        parts = [prefix] if prefix else []
        for loc in item["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            else:
                parts.append(str(loc))
        path = ".".join(parts) or "<root>"
        message = item["msg"]
        if item["type"] == "extra_forbidden":
            message = "unknown field"
        lines.append(f"{path}: {message}")
    return lines


def parse_manifest(document: Any) -> PolicyGroupManifest:
    """Validate one decoded YAML/JSON document as a PolicyGroup.

    Args:
        document (Any): The decoded object (a dict for a valid manifest).

    Returns:
        PolicyGroupManifest: The validated manifest with defaults filled in.

    Raises:
        ManifestError: With one line per problem.
    """
    if not isinstance(document, dict):
        raise ManifestError([f"<root>: expected a mapping (a PolicyGroup object), got {type(document).__name__}"])
    try:
        return PolicyGroupManifest.model_validate(document)
    except ValidationError as error:
        raise ManifestError(format_validation_error(error)) from None


def load_manifest(path: str | Path) -> PolicyGroupManifest:
    """Read and validate a PolicyGroup manifest file (YAML with exactly one document).

    Args:
        path (str | Path): The file.

    Returns:
        PolicyGroupManifest: The validated manifest.

    Raises:
        ManifestError: The file is missing or unreadable, is not YAML, holds other than one document, or
            the document is not a valid PolicyGroup.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise ManifestError([f"{path}: no such file"]) from None
    except OSError as error:
        raise ManifestError([f"{path}: cannot read: {error.strerror}"]) from None
    try:
        documents = [doc for doc in yaml.safe_load_all(text) if doc is not None]
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        raise ManifestError([f"{path}: not valid YAML{where}"]) from None
    if len(documents) != 1:
        raise ManifestError([f"{path}: expected one YAML document, found {len(documents)}"])
    return parse_manifest(documents[0])
