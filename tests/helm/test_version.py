"""One version: `rlightning.contract.VERSION`. The package (its `__version__` and pyproject.toml's dynamic
version), the default image's tag, the chart's version and appVersion (the operator image's default tag) and the
image tags that README.md and the Dockerfiles tell users to build must all be it. No cluster needed."""

from __future__ import annotations

import re
import tomllib

import pytest
import yaml
from helm_chart import CHART, REPO

import rlightning
from rlightning import contract

IMAGE_TAG = re.compile(r"(?:/rlightning:|image\.tag=)([0-9][\w.-]*)")
"""A tag of the rlightning image (`.../rlightning:0.1.0`, `-cu128` variants too) or the chart's `image.tag`."""

DOCUMENTS = ("README.md", "operator/Dockerfile", "examples/custom_policy/Dockerfile")


def test_the_package_reads_the_one_version():
    assert rlightning.__version__ == contract.VERSION
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert "version" not in pyproject["project"] and "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "rlightning.contract.VERSION"}


def test_the_default_image_is_tagged_with_it():
    assert contract.DEFAULT_IMAGE.rsplit(":", 1)[1] == contract.VERSION


def test_the_chart_releases_it():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert (chart["version"], chart["appVersion"]) == (contract.VERSION, contract.VERSION)


@pytest.mark.parametrize("document", DOCUMENTS)
def test_the_documented_image_tags_are_it(document):
    tags = IMAGE_TAG.findall((REPO / document).read_text())
    assert tags, f"{document} names no rlightning image tag"
    assert {tag.split("-")[0] for tag in tags} == {contract.VERSION}, f"{document}: {tags}"
