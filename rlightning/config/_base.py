"""The base of every config model: strict, camelCase on the wire, snake_case in Python."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
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
