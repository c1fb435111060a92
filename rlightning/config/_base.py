"""The bases of every config model: closed (no unknown fields), camelCase on the wire, snake_case in Python.

`SpecModel`, the base of everything a user writes (a PolicyGroup's metadata and spec), is also strict about
types, as the API server is about the CRD's schema: an integer field takes only an integer (not `"4"`, not
`true`, not `2.5`; `2.0` is 2, as kubectl sends it), a string field only a string, a boolean field only a boolean,
a number field an integer or a float (the CRD's `type: number` takes both), and no float is infinite or NaN (JSON
has no such number). A null
given to a field that is not nullable counts as not given (its default applies), as the API server prunes
such nulls before defaulting (https://kubernetes.io/docs/tasks/extend-kubernetes/custom-resources/
custom-resource-definitions/#defaulting-and-nullable). So the CLI, the pods and the API server give a manifest
the same verdict.
"""

from __future__ import annotations

import functools
import types
import typing
from typing import Annotated, Any, Union

from pydantic import BaseModel, ConfigDict, model_validator
from pydantic.alias_generators import to_camel


class StrictModel(BaseModel):
    """A config model that rejects unknown fields.

    Manifests use camelCase keys (`numEnvs`), Python code the snake_case attribute (`num_envs`); both
    spellings are accepted on input. Dump with `model_dump(by_alias=True)` for the wire form.
    """

    model_config = ConfigDict(
        extra="forbid",
        alias_generator=to_camel,
        populate_by_name=True,
        validate_assignment=True,
        use_attribute_docstrings=False,
    )


def _admits(annotation: Any, kind: Any) -> bool:
    """Whether a field of this type accepts `kind` (None, or int), looking through Annotated and unions."""
    if annotation is Any or annotation is kind or (kind is None and annotation is type(None)):
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _admits(typing.get_args(annotation)[0], kind)
    if origin is Union or origin is types.UnionType:
        return any(_admits(option, kind) for option in typing.get_args(annotation))
    return False


class SpecModel(StrictModel):
    """A `StrictModel` of what users write, with the API server's strict types (see the module docstring)."""

    model_config = StrictModel.model_config | ConfigDict(strict=True, allow_inf_nan=False)

    @classmethod
    @functools.cache
    def _keys_admitting(cls, kind: Any) -> frozenset[str]:
        """Both spellings of every field whose type admits `kind` (None, or int)."""
        keys: set[str] = set()
        for name, field in cls.model_fields.items():
            if _admits(field.annotation, kind):
                keys.update({name, field.alias or name})
        return frozenset(keys)

    @model_validator(mode="before")
    @classmethod
    def _as_the_api_server_reads(cls, data: Any) -> Any:
        # The API server drops a null of a non-nullable field before it applies defaults and validates; kubectl
        # sends a YAML float with no fraction as a JSON integer (2.0 -> 2), which an integer field takes.
        if not isinstance(data, dict):
            return data
        nullable, integers = cls._keys_admitting(None), cls._keys_admitting(int)
        return {
            key: int(value) if key in integers and isinstance(value, float) and value.is_integer() else value
            for key, value in data.items()
            if value is not None or key in nullable
        }
