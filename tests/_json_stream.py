"""Reading what `kubectl get -w -o json` wrote so far: a stream of JSON documents, the last one maybe half written."""

from __future__ import annotations

import json
from typing import Any


def decode_all(text: str) -> list[Any]:
    """The whole JSON values in `text`, in order; a value cut short at the end (still being written) is left out."""
    found, at = [], 0
    while (start := text.find("{", at)) >= 0:
        try:
            value, at = json.JSONDecoder().raw_decode(text, start)
        except json.JSONDecodeError:  # the last one half written
            break
        found.append(value)
    return found
