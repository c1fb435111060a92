"""The bases of every config model: closed (no unknown fields), camelCase on the wire, snake_case in Python.

`SpecModel`, the base of everything a user writes (a PolicyGroup's metadata and spec), is also strict about
types, as the API server is about the CRD's schema: an integer field takes only an integer (not `"4"`, not
`true`), a string field only a string, a boolean field only a boolean, a number field an integer or a float
(the CRD's `type: number` takes both), and no float is infinite or NaN (JSON has no such number). A null
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


def _nullable(annotation: Any) -> bool:
    """Whether a field of this type accepts None."""
    if annotation is None or annotation is type(None) or annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin is Annotated:
        return _nullable(typing.get_args(annotation)[0])
    if origin is Union or origin is types.UnionType:
        return any(_nullable(option) for option in typing.get_args(annotation))
    return False


class SpecModel(StrictModel):
    """A `StrictModel` of what users write, with the API server's strict types (see the module docstring)."""

    model_config = StrictModel.model_config | ConfigDict(strict=True, allow_inf_nan=False)

    @classmethod
    @functools.cache
    def _non_nullable_keys(cls) -> frozenset[str]:
        keys: set[str] = set()
        for name, field in cls.model_fields.items():
            if not _nullable(field.annotation):
                keys.update({name, field.alias or name})
        return frozenset(keys)

    @model_validator(mode="before")
    @classmethod
    def _prune_nulls(cls, data: Any) -> Any:
        # The API server drops a null of a non-nullable field before it applies defaults and validates.
        if not isinstance(data, dict):
            return data
        keys = cls._non_nullable_keys()
        return {key: value for key, value in data.items() if value is not None or key not in keys}
