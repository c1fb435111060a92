"""Add-on components (metrics-server, Karpenter, KEDA, Kueue): built and cached apart from the control plane,
registered by pure manifests, started against the running cluster (the starts themselves: tests/autoscaling/
test_hpa.py, test_karpenter.py, test_keda.py and test_gang_admission.py)."""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest

from devcluster import _addon, _build, _components, _gomod, _karpenter, _keda, _kueue, _nodes, _pki, _ports, _toolchain


def _go() -> str:
    return _toolchain.go_binary()


@pytest.mark.parametrize("module", sorted({target.module for target in _build.ADDONS.values()}))
def test_an_addon_module_never_changes_the_control_plane_key(tmp_path, monkeypatch, module):
    inside = sorted(name for name, target in _build.ADDONS.items() if target.module == module)
    outside = sorted(set(_build.ADDONS) - set(inside))
    before = _build.cache_key(_go()), {name: _build.addon_key(_go(), name) for name in _build.ADDONS}
    copy = tmp_path / "go"
    shutil.copytree(_gomod.GO_DIR, copy)
    monkeypatch.setattr(_gomod, "GO_DIR", copy)
    assert (_build.cache_key(_go()), {name: _build.addon_key(_go(), name) for name in _build.ADDONS}) == before
    gomod = copy / module / "go.mod"
    gomod.write_text(gomod.read_text() + "\n// bumped\n")
    assert _build.cache_key(_go()) == before[0], "the control plane is not rebuilt for an add-on"
    assert all(_build.addon_key(_go(), name) != before[1][name] for name in inside), "its add-ons are rebuilt"
    assert [_build.addon_key(_go(), name) for name in outside] == [before[1][name] for name in outside], (
        "the other module's add-ons are not")


def test_karpenter_binary_does_not_clash_with_kwok():
    binaries = [name for target in (*_build.targets(), *_build.ADDONS.values()) for name in target.binaries]
    assert len(binaries) == len(set(binaries))
    assert _build.ADDONS["karpenter"].binaries == ("karpenter-kwok",)


def test_metrics_server_is_registered_through_an_external_name_on_loopback():
    ports = _ports.for_slot(3)
    port = ports.metrics_server
    service = _addon.external_name_service("metrics-server", "kube-system", port)
    assert service["spec"] == {"type": "ExternalName", "externalName": "127.0.0.1",
                               "ports": [{"name": "https", "port": port}]}
    api = _addon.api_service("metrics.k8s.io", "v1beta1", "metrics-server", "kube-system", port)
    assert api["metadata"]["name"] == "v1beta1.metrics.k8s.io"
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


def test_karpenter_runs_without_leader_election_on_its_own_ports():
    ports = _ports.for_slot(2)
    argv, env = _components.karpenter(pathlib.Path("/w/kubeconfig"), ports, pathlib.Path("/b/karpenter-kwok"),
                                      _components.KARPENTER_INSTANCE_TYPES)
    assert env == {"KUBECONFIG": "/w/kubeconfig", "DISABLE_LEADER_ELECTION": "true"}
    assert f"--metrics-port={ports.karpenter_metrics}" in argv
    assert f"--health-probe-port={ports.karpenter_health}" in argv
    assert f"--instance-types-file-path={_components.KARPENTER_INSTANCE_TYPES}" in argv
    named = ports.named()
    assert len(set(named.values())) == len(named) <= _ports.BLOCK_SIZE, "every component has a port of its own"
    assert max(named.values()) < _ports.BASE_PORT + 3 * _ports.BLOCK_SIZE, "the block stays within its slot"


def test_karpenter_instance_types_are_small_cpu_types_and_one_gpu_type():
    types = {t["name"]: t for t in json.loads(_components.KARPENTER_INSTANCE_TYPES.read_text())}
    gpu = [name for name, t in types.items() if _nodes.GPU_RESOURCE in t["resources"]]
    assert gpu == ["gpu-48x-4g"]
    price = {name: min(o["Price"] for o in t["offerings"]) for name, t in types.items()}
    cpus = {name: int(t["resources"]["cpu"]) for name, t in types.items()}
    cpu_only = sorted((n for n in types if n not in gpu), key=cpus.__getitem__)
    assert [price[n] for n in cpu_only] == sorted(price[n] for n in cpu_only), "bigger costs more"
    assert all(price[g] > price[n] for g in gpu for n in cpu_only if cpus[n] <= cpus[g])
    assert max(cpus[n] for n in cpu_only) > int(_nodes.CAPACITY["cpu"]), "a type bigger than the dev cluster's nodes"


def test_karpenter_crd_names_match_their_files():
    paths = _karpenter.crd_paths(pathlib.Path("/mod"))
    assert all(path.is_relative_to("/mod/kwok") for path in paths)
    names = []
    for path in paths:  # controller-gen names a CRD file <group>_<plural>.yaml
        group, plural = path.name.removesuffix(".yaml").split("_")
        names.append(f"{plural}.{group}")
    assert tuple(names) == _karpenter.CRD_NAMES


def test_module_replacements_keep_published_targets_only():
    text = """module example.com/x

go 1.26.0

// a comment
replace github.com/a/b v0.1.0 => github.com/a/b v0.1.1-0.20260629224316-835bd8d49cb4

replace (
\tgithub.com/c/d => github.com/e/d v1.2.3 // fork
\tgithub.com/f/g v1.0.0 => ./local/g
\tgithub.com/h/i => ../i
)
"""
    assert _gomod.module_replacements(text) == [
        "github.com/a/b v0.1.0 => github.com/a/b v0.1.1-0.20260629224316-835bd8d49cb4",
        "github.com/c/d => github.com/e/d v1.2.3",
    ]
    wrapper = _gomod.simple_gomod("x", "example.com/x", "v1.0.0", ["example.com/x/cmd/x"], "1.26.0",
                                  _gomod.module_replacements(text))
    assert "replace (\n\tgithub.com/a/b v0.1.0 => github.com/a/b v0.1.1-" in wrapper
    assert "./local" not in wrapper


def test_keda_builds_two_named_binaries_and_runs_on_its_own_ports():
    target = _build.ADDONS["keda"]
    assert target.binaries == ("keda-operator", "keda-adapter") and len(target.packages) == 2
    ports = _ports.for_slot(4)
    operator, adapter, env = _components.keda(pathlib.Path("/w/kubeconfig"), ports, pathlib.Path("/b"),
                                              pathlib.Path("/w/keda-certs"))
    assert operator[0] == "/b/keda-operator" and adapter[0] == "/b/keda-adapter"
    grpc = f"127.0.0.1:{ports.keda_metrics_service}"
    assert f"--metrics-service-bind-address={grpc}" in operator
    assert f"--metrics-service-address={grpc}" in adapter
    assert "--leader-elect=false" in operator and "--enable-cert-rotation=false" in operator
    assert "--cert-dir=/w/keda-certs" in operator and "--cert-dir=/w/keda-certs" in adapter
    assert f"--secure-port={ports.keda_adapter}" in adapter and f"--port={ports.keda_adapter_metrics}" in adapter
    assert env["WATCH_NAMESPACE"] == "" and env["KUBECONFIG"] == "/w/kubeconfig"
    named = ports.named()
    assert len(set(named.values())) == len(named) <= _ports.BLOCK_SIZE, "every component has a port of its own"
    assert max(named.values()) < _ports.for_slot(5).etcd_client, "the block stays within its slot"


def test_keda_adapter_is_registered_for_external_metrics_on_loopback():
    port = _ports.for_slot(0).keda_adapter
    api = _addon.api_service("external.metrics.k8s.io", "v1beta1", _keda.SERVICE, _keda.NAMESPACE, port)
    assert api["metadata"]["name"] == "v1beta1.external.metrics.k8s.io"
    assert api["spec"]["group"] == "external.metrics.k8s.io"
    assert api["spec"]["service"] == {"namespace": _keda.NAMESPACE, "name": _keda.SERVICE, "port": port}


def test_keda_crd_names_match_their_files():
    names = []
    for path in _keda.crd_paths(pathlib.Path("/mod")):  # controller-gen names a CRD file <group>_<plural>.yaml
        assert path.is_relative_to("/mod/config/crd/bases")
        group, plural = path.name.removesuffix(".yaml").split("_")
        names.append(f"{plural}.{group}")
    assert tuple(names) == _keda.CRD_NAMES


def test_mutual_tls_certificate_serves_and_authenticates_loopback(tmp_path):
    folder = _pki.mutual_tls(tmp_path / "certs", "keda")
    assert {p.name for p in folder.iterdir()} >= {"ca.crt", "tls.crt", "tls.key"}
    text = subprocess.run(["openssl", "x509", "-in", str(folder / "tls.crt"), "-noout", "-text"],
                          check=True, capture_output=True, text=True).stdout
    assert "IP Address:127.0.0.1" in text
    assert "TLS Web Server Authentication" in text and "TLS Web Client Authentication" in text
    verified = subprocess.run(["openssl", "verify", "-CAfile", str(folder / "ca.crt"), str(folder / "tls.crt")],
                              capture_output=True, text=True)
    assert verified.returncode == 0, verified.stderr


def test_kueue_crds_convert_through_its_webhook_service_on_its_port():
    port = _ports.for_slot(1).kueue_webhook
    crds = _kueue.crd_manifests(_gomod.module_dir("kueue", _kueue.MODULE), port)
    names = {crd["metadata"]["name"] for crd in crds}
    assert {"clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io", "workloads.kueue.x-k8s.io",
            "resourceflavors.kueue.x-k8s.io", "topologies.kueue.x-k8s.io"} <= names
    converted = {crd["metadata"]["name"]: crd["spec"]["conversion"] for crd in crds if "conversion" in crd["spec"]}
    # The CRDs Kueue's certificate rotation injects its CA into (pkg/util/cert): each must have a webhook.
    assert set(converted) >= {"clusterqueues.kueue.x-k8s.io", "localqueues.kueue.x-k8s.io",
                              "workloads.kueue.x-k8s.io", "cohorts.kueue.x-k8s.io"}
    for conversion in converted.values():
        assert conversion["strategy"] == "Webhook"
        assert conversion["webhook"]["clientConfig"]["service"] == {
            "namespace": "kueue-system", "name": "kueue-webhook-service", "path": "/convert", "port": port}


def test_kueue_registers_only_its_own_and_the_job_webhooks():
    port = _ports.for_slot(0).kueue_webhook
    configurations = _kueue.webhook_configurations(_gomod.module_dir("kueue", _kueue.MODULE), port)
    assert sorted(c["metadata"]["name"] for c in configurations) == [
        "kueue-mutating-webhook-configuration", "kueue-validating-webhook-configuration"]  # what Kueue patches
    webhooks = {w["name"]: w for c in configurations for w in c["webhooks"]}
    assert {"mjob.kb.io", "vjob.kb.io", "mworkload.kb.io", "vclusterqueue.kb.io"} <= set(webhooks)
    assert "mpod.kb.io" not in webhooks and "mstatefulset.kb.io" not in webhooks, "pods and evaluators untouched"
    for webhook in webhooks.values():
        service = webhook["clientConfig"]["service"]
        assert (service["name"], service["namespace"], service["port"]) == ("kueue-webhook-service", "kueue-system",
                                                                            port)
        assert service["path"].startswith(("/mutate-", "/validate-"))


def test_kueue_manages_its_certificate_and_serves_jobs_only_on_loopback():
    ports = _ports.for_slot(2)
    config = _components.kueue_configuration(ports, pathlib.Path("/w/kueue-certs"))
    assert config["webhook"] == {"host": "127.0.0.1", "port": ports.kueue_webhook, "certDir": "/w/kueue-certs"}
    assert config["health"]["healthProbeBindAddress"] == f"127.0.0.1:{ports.kueue_health}"
    assert config["internalCertManagement"]["webhookServiceName"] == _kueue.SERVICE
    assert config["integrations"]["frameworks"] == ["batch/job"] and config["leaderElection"]["leaderElect"] is False
    argv, env = _components.kueue(pathlib.Path("/w/kubeconfig"), pathlib.Path("/b/kueue"), pathlib.Path("/w/k.yaml"))
    assert argv[:2] == ["/b/kueue", "--config=/w/k.yaml"] and env == {"KUBECONFIG": "/w/kubeconfig"}
    named = ports.named()
    assert len(set(named.values())) == len(named) <= _ports.BLOCK_SIZE, "every component has a port of its own"
