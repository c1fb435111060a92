"""Helpers for the operator's tests (not a conftest: tests/operator must not be a package named `operator`)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from rlightning.config import parse_manifest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml"


def example_document() -> dict:
    """examples/cartpole.yaml as a dict."""
    return yaml.safe_load(EXAMPLE.read_text())


def edited(document: dict, **paths) -> dict:
    """A deep copy of `document` with dotted paths set, e.g. edited(doc, **{"spec.eval.replicas": 3})."""
    result = copy.deepcopy(document)
    for path, value in paths.items():
        node = result
        *parents, last = path.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[last] = value
    return result


@pytest.fixture
def example():
    """The example PolicyGroup, validated."""
    return parse_manifest(example_document())
