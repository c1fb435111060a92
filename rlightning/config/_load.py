"""Reading a PolicyGroup manifest file into models, with one line per problem."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from rlightning.config._spec import PolicyGroupManifest


class _ManifestLoader(yaml.SafeLoader):
    """PyYAML's safe loader reading plain scalars as kubectl does (go-yaml v2, sigs.k8s.io/yaml).

    Kept from YAML 1.1: `yes`/`no`/`on`/`off` are booleans. Changed: `y`/`n` are booleans too, `1e3` is a float and
    `0o10` an integer (go-yaml's forms PyYAML reads as strings), and `2024-01-01` stays a string (go-yaml keeps a
    timestamp-like value a string). So `image: y` or `numEnvs: 1e1` means the same to the CLI and the API server.
    """

    bool_values = {**yaml.SafeLoader.bool_values, "y": True, "n": False}


_ManifestLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != "tag:yaml.org,2002:timestamp"]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:bool", re.compile(r"^(?:y|Y|n|N)$"), list("yYnN"))
_ManifestLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float", re.compile(r"^[-+]?(?:\.[0-9]+|[0-9]+(?:\.[0-9]*)?)[eE][-+]?[0-9]+$"),
    list("-+.0123456789"),
)
_ManifestLoader.add_implicit_resolver("tag:yaml.org,2002:int", re.compile(r"^[-+]?0o[0-7_]+$"), list("-+0"))


class ManifestError(ValueError):
    """A manifest that cannot be used; `problems` holds one `"<field path>: <rule>"` line each.

    Args:
        problems (list[str]): Human-readable problems, each naming the field (camelCase path) and the rule.
    """

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


_UNION_MEMBER = re.compile(r"^(constrained-)?(int|str|float|bool|dict\[.*\]|list\[.*\])$|^function-\w+\[.*\]$")
"""A location part pydantic adds for each member of a union (`constrained-int`): not a field of the manifest."""
_RELATIVE_PATH = re.compile(r"^([A-Za-z][\w./-]*): (.+)$", re.DOTALL)
"""A validator's message that starts with the field it is about, relative to the model: `replicas: must ...`."""
_JSON_TYPES = {bool: "boolean", int: "integer", float: "number", str: "string", dict: "object", list: "array"}


def _given(value: Any) -> str:
    """A value as the manifest's reader sees it: its JSON type and (short) value, for example `string "4"`."""
    kind = "null" if value is None else _JSON_TYPES.get(type(value), type(value).__name__)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return f"{kind} {text if len(text) <= 40 else text[:37] + '...'}"


def format_validation_error(error: ValidationError, prefix: str = "") -> list[str]:
    """Turn a pydantic `ValidationError` into `"<path>: <message>"` lines with camelCase paths.

    A type error names what was given (`..., got string "4"`); the errors of a union's members at one
    path (an integer or a percentage) are joined into one line.

    Args:
        error (ValidationError): The error raised by a model.
        prefix (str, optional): Path prepended to every location, for example `"spec.policy.policyKwargs"`.
            Defaults to "".

    Returns:
        list[str]: One line per path, in pydantic's order.
    """
    by_path: dict[str, list[str]] = {}
    for item in error.errors():
        parts = [prefix] if prefix else []
        for loc in item["loc"]:
            if isinstance(loc, int):
                parts[-1:] = [f"{parts[-1]}[{loc}]"] if parts else [f"[{loc}]"]
            elif not _UNION_MEMBER.match(str(loc)):
                parts.append(str(loc))
        path = ".".join(parts) or "<root>"
        message = item["msg"]
        if item["type"] == "value_error":  # a validator's own rule; "<relative path>: <rule>" names a field
            message = message.removeprefix("Value error, ")
            field = _RELATIVE_PATH.match(message)
            if field is not None:
                path = f"{path}.{field.group(1)}" if parts else field.group(1)
                message = field.group(2)
        elif item["type"] == "extra_forbidden":
            message = "unknown field"
        elif item["type"].endswith("_type") or item["type"] in ("finite_number", "literal_error"):
            message = f"{message}, got {_given(item.get('input'))}"
        messages = by_path.setdefault(path, [])
        if message not in messages:
            messages.append(message)
    return [f"{path}: {'; or '.join(messages)}" for path, messages in by_path.items()]


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
        data = path.read_bytes()
    except FileNotFoundError:
        raise ManifestError([f"{path}: no such file"]) from None
    except OSError as error:
        raise ManifestError([f"{path}: cannot read: {error.strerror or error}"]) from None
    document = load_document(data, str(path))
    problems = unknown_object_fields(document)
    try:
        manifest = parse_manifest(document)
    except ManifestError as error:
        raise ManifestError(problems + error.problems) from None
    if problems:
        raise ManifestError(problems)
    return manifest


_OBJECT_FIELDS = ("apiVersion", "kind", "metadata", "spec", "status")
_OBJECT_META_FIELDS = (
    "name", "generateName", "namespace", "selfLink", "uid", "resourceVersion", "generation", "creationTimestamp",
    "deletionTimestamp", "deletionGracePeriodSeconds", "labels", "annotations", "ownerReferences", "finalizers",
    "managedFields",
)  # fmt: skip
"""The fields of Kubernetes' ObjectMeta (meta/v1); the models read only some of them."""


def unknown_object_fields(document: Any) -> list[str]:
    """Fields at the top of a manifest file or in its metadata that a Kubernetes object does not have.

    `kubectl apply` refuses them (strict field validation, its default); the models ignore the server-set
    metadata they do not read, so the file is checked here.

    Args:
        document (Any): The decoded document.

    Returns:
        list[str]: One `"<field>: unknown field"` line each.
    """
    if not isinstance(document, dict):
        return []
    problems = [f"{key}: unknown field" for key in document if key not in _OBJECT_FIELDS]
    metadata = document.get("metadata")
    if isinstance(metadata, dict):
        problems += [f"metadata.{key}: unknown field" for key in metadata if key not in _OBJECT_META_FIELDS]
    return problems


def load_document(data: bytes, name: str) -> Any:
    """Decode a manifest file's bytes (UTF-8, as kubectl reads it) into its one YAML document.

    Args:
        data (bytes): The file's content.
        name (str): The file, for messages.

    Returns:
        Any: The decoded document (a dict for a manifest; `parse_manifest` checks the rest).

    Raises:
        ManifestError: The bytes are not UTF-8 text, not YAML, or hold other than one document.
    """
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise ManifestError(
            [f"{name}: not UTF-8 text (byte 0x{data[error.start]:02x} at line {line}); save the manifest as UTF-8"]
        ) from None
    try:
        documents = [doc for doc in yaml.load_all(text, Loader=_ManifestLoader) if doc is not None]
    except yaml.reader.ReaderError as error:  # a control character: a binary file that happens to be UTF-8
        line = text[: error.position].count("\n") + 1
        code = error.character if isinstance(error.character, int) else ord(error.character)
        raise ManifestError(
            [f"{name}: not valid YAML at line {line}: control character U+{code:04X} (a binary file?)"]
        ) from None
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        where = f" at line {mark.line + 1}" if mark else ""
        problem = getattr(error, "problem", None)
        raise ManifestError([f"{name}: not valid YAML{where}" + (f": {problem}" if problem else "")]) from None
    except RecursionError:
        raise ManifestError([f"{name}: not valid YAML: nested too deeply"]) from None
    if len(documents) != 1:
        raise ManifestError([f"{name}: expected one YAML document, found {len(documents)}"])
    problems = [f"{path}: {value} is not a JSON number (kubectl cannot send it)"
                for path, value in _infinite(documents[0])]
    if problems:
        raise ManifestError(problems)
    return documents[0]


def _infinite(node: Any, path: str = "<root>") -> list[tuple[str, float]]:
    """(path, value) of every `.inf` or `.nan` in a decoded document (JSON, hence the API server, has none)."""
    if isinstance(node, float) and not math.isfinite(node):
        return [(path, node)]
    if isinstance(node, dict):
        return [found for key, value in node.items() for found in _infinite(value, _join(path, str(key)))]
    if isinstance(node, list):
        return [found for index, value in enumerate(node) for found in _infinite(value, f"{path}[{index}]")]
    return []


def _join(path: str, key: str) -> str:
    return key if path == "<root>" else f"{path}.{key}"
