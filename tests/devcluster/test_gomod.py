"""The committed wrapper go.mod files match what the generator derives from the pinned upstream releases."""

from __future__ import annotations

import re

import pytest

import devcluster
from devcluster import _gomod

pytestmark = pytest.mark.cluster  # needs the Go toolchain and the module proxy (or a warm module cache)


def _directive_block(text: str, name: str) -> list[str]:
    match = re.search(rf"^{name} \((.*?)^\)", text, re.MULTILINE | re.DOTALL)
    return sorted(line.strip() for line in match.group(1).splitlines() if line.strip()) if match else []


def test_kubernetes_wrapper_replaces_every_staging_module():
    upstream = _gomod.upstream_gomod("k8s.io/kubernetes", devcluster.KUBERNETES)
    committed = (_gomod.GO_DIR / "kubernetes" / "go.mod").read_text()
    staging = _gomod.staging_replacements(upstream)
    assert "k8s.io/client-go" in staging and "k8s.io/api" in staging
    tag = "v0." + ".".join(devcluster.KUBERNETES.lstrip("v").split(".")[1:])
    assert _directive_block(committed, "replace") == sorted(f"{m} => {m} {tag}" for m in staging)
    assert "godebug default=go1.24" in committed
    assert f"k8s.io/kubernetes {devcluster.KUBERNETES}" in committed


def test_every_wrapper_is_committed_with_its_go_sum():
    assert sorted(path.name for path in _gomod.GO_DIR.iterdir() if path.is_dir()) == sorted(_gomod.WRAPPERS)
    for name in _gomod.WRAPPERS:
        assert (_gomod.GO_DIR / name / "go.sum").stat().st_size > 0, name


def test_the_shared_addon_wrapper_requires_each_release_and_repeats_keda_s_module_replaces():
    upstream = _gomod.upstream_gomod("github.com/kedacore/keda/v2", devcluster.KEDA)
    replaces = _gomod.module_replacements(upstream)
    assert replaces, "KEDA's go.mod has a replace of a published module; the wrapper must repeat it"
    committed = (_gomod.GO_DIR / _gomod.SHARED_ADDONS / "go.mod").read_text()
    assert _gomod.module_replacements(committed) == replaces  # go mod tidy may fold a one-line block
    for required in (f"github.com/kedacore/keda/v2 {devcluster.KEDA}", f"sigs.k8s.io/karpenter {devcluster.KARPENTER}",
                     f"sigs.k8s.io/metrics-server {devcluster.METRICS_SERVER}"):
        assert required in committed
