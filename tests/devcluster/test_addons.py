"""Add-on components (metrics-server): built and cached apart from the control plane, registered by pure
manifests, started against the running cluster (the start itself: tests/autoscaling/test_hpa.py)."""

from __future__ import annotations

import pathlib
import shutil

from devcluster import _build, _components, _gomod, _metrics_server, _nodes, _ports, _toolchain


def _go() -> str:
    return _toolchain.go_binary()


def test_an_addon_never_changes_the_control_plane_key(tmp_path, monkeypatch):
    before = _build.cache_key(_go()), _build.addon_key(_go(), "metrics-server")
    copy = tmp_path / "go"
    shutil.copytree(_gomod.GO_DIR, copy)
    monkeypatch.setattr(_gomod, "GO_DIR", copy)
    assert (_build.cache_key(_go()), _build.addon_key(_go(), "metrics-server")) == before
    gomod = copy / "metrics-server" / "go.mod"
    gomod.write_text(gomod.read_text() + "\n// bumped\n")
    assert _build.cache_key(_go()) == before[0], "the control plane is not rebuilt for an add-on"
    assert _build.addon_key(_go(), "metrics-server") != before[1]


def test_metrics_server_is_registered_through_an_external_name_on_loopback():
    ports = _ports.for_slot(3)
    service = _metrics_server.service_manifest(ports.metrics_server)
    assert service["spec"] == {"type": "ExternalName", "externalName": "127.0.0.1",
                               "ports": [{"name": "https", "port": ports.metrics_server}]}
    api = _metrics_server.api_service_manifest(ports.metrics_server)
    assert api["metadata"]["name"] == "v1beta1.metrics.k8s.io"
    port = ports.metrics_server
    assert api["spec"]["service"] == {"namespace": "kube-system", "name": "metrics-server", "port": port}
    argv = _components.metrics_server(pathlib.Path("/w"), pathlib.Path("/w/kubeconfig"), ports, pathlib.Path("/b/ms"))
    assert f"--secure-port={ports.metrics_server}" in argv and "--kubelet-use-node-status-port" in argv
    assert len(set(ports.named().values())) == len(ports.named()), "every component has a port of its own"


def test_fake_nodes_point_metrics_server_at_kwok():
    node = _nodes.node_manifest(0, gpu=False)
    path = node["metadata"]["annotations"][_nodes.RESOURCE_METRICS_PATH_ANNOTATION]
    assert path == "/metrics/nodes/kwok-node-0/metrics/resource"
    ports = _ports.for_slot(0)
    layout = _components.Layout(pathlib.Path("/w"), pathlib.Path("/b"), pathlib.Path("/s"), None, pathlib.Path("/k"))
    argv = _components.kwok(layout, ports)
    assert f"--node-port={ports.kwok}" in argv and "--node-ip=127.0.0.1" in argv
    assert all(f"--config={path}" in argv for path in _components.LOCAL_METRICS)
