"""The chart ships the generated CRD, byte for byte (needs no cluster)."""

from __future__ import annotations

from helm_chart import CHART, REPO


def test_chart_ships_the_generated_crd():
    shipped = CHART / "crds" / "policygroups.rlightning.io.yaml"
    generated = REPO / "crds" / "policygroups.rlightning.io.yaml"
    assert shipped.read_bytes() == generated.read_bytes(), "run `make crd` to copy the regenerated CRD"
