"""The real node's pure pieces: its configuration builders, the OCI image archives and the host-state diff."""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import os
import pathlib
import shutil
import subprocess
import tarfile
import tomllib

import pytest

from devcluster import _hoststate, _images, _nodeconfig, _realnode

LAYOUT = _nodeconfig.NodeLayout(pathlib.Path("/tmp/devcluster-x/realnode"))


def _members(archive: bytes) -> dict[str, bytes]:
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        return {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.isfile()}


def test_oci_archive_names_the_image_and_its_blobs_match_their_digests():
    files = _members(_images.runtime_archive("rlightning.local/runtime:dev", ["PYTHONPATH=/repo"]))
    index = json.loads(files["index.json"])
    (descriptor,) = index["manifests"]
    assert descriptor["annotations"]["io.containerd.image.name"] == "rlightning.local/runtime:dev"
    for name, data in files.items():
        if name.startswith("blobs/sha256/"):
            assert hashlib.sha256(data).hexdigest() == name.rsplit("/", 1)[1]
    manifest = json.loads(files["blobs/sha256/" + descriptor["digest"].split(":")[1]])
    config = json.loads(files["blobs/sha256/" + manifest["config"]["digest"].split(":")[1]])
    assert config["config"]["Env"] == ["PYTHONPATH=/repo"]
    assert config["config"]["Entrypoint"] == ["rlightning-operator"]  # as operator/Dockerfile's image
    assert config["rootfs"]["diff_ids"] == [manifest["layers"][0]["digest"]]


def test_runtime_layer_has_a_sticky_tmp_and_merged_usr_links():
    with tarfile.open(fileobj=io.BytesIO(_images.runtime_layer())) as tar:
        members = {m.name: m for m in tar.getmembers()}
    assert members["tmp"].isdir() and members["tmp"].mode == 0o1777
    assert members["bin"].issym() and members["bin"].linkname == "usr/bin"
    passwd = _members(_images.runtime_layer())["etc/passwd"].decode()
    assert "rlightning:x:10001:10001:" in passwd  # the chart's runAsUser, as in operator/Dockerfile


def test_containerd_config_keeps_state_under_the_node_folder_and_restricts_oom_score_adj():
    config = tomllib.loads(_nodeconfig.containerd_config(LAYOUT))
    cri = config["plugins"]["io.containerd.grpc.v1.cri"]
    assert cri["restrict_oom_score_adj"] is True and cri["netns_mounts_under_state_dir"] is True
    assert cri["sandbox_image"] == _nodeconfig.PAUSE_IMAGE
    runc = cri["containerd"]["runtimes"]["runc"]
    assert runc["options"]["SystemdCgroup"] is False
    for path in (config["root"], config["state"], config["grpc"]["address"], runc["options"]["Root"]):
        assert path.startswith(str(LAYOUT.root) + "/")


def test_kubelet_config_fits_a_cgroup_v1_machine_without_systemd():
    config = _nodeconfig.kubelet_config(LAYOUT, pathlib.Path("/ca.crt"))
    assert config["cgroupDriver"] == "cgroupfs" and config["failCgroupV1"] is False
    assert config["clusterDNS"] == [_nodeconfig.BRIDGE_IP]
    assert config["podLogsDir"].startswith(str(LAYOUT.root))
    assert config["authentication"]["anonymous"]["enabled"] is False
    argv = _nodeconfig.kubelet(LAYOUT, pathlib.Path("/bin"))
    assert f"--node-labels={_nodeconfig.NODE_LABEL}=true,type=real" in argv


def test_base_runtime_spec_adds_read_only_binds_after_the_defaults():
    bind = _nodeconfig.Bind(pathlib.Path("/w/repo"), _nodeconfig.CONTAINER_SOURCE)
    spec = _nodeconfig.base_runtime_spec({"mounts": [{"destination": "/proc"}]}, [bind])
    assert spec["mounts"][0] == {"destination": "/proc"}
    assert spec["mounts"][1] == {
        "destination": "/opt/rlightning/src", "type": "bind", "source": "/w/repo", "options": ["rbind", "ro"]
    }


def test_read_only_binds_hold_python_and_this_checkout_without_nesting():
    binds = _realnode.read_only_binds()
    sources = [bind.source for bind in binds]
    assert pathlib.Path("/usr") in sources and _realnode.repository_root() in sources
    same_path = [bind.source for bind in binds if str(bind.source) == str(bind.destination)]
    assert all(not any(a != b and b in a.parents for b in same_path) for a in same_path)


def test_host_state_difference_names_what_changed():
    before = _hoststate.snapshot()
    assert _hoststate.difference(before, before) == []
    after = dataclasses.replace(before, links=before.links | {"no-such-link0"}, mounts=before.mounts - {"/"})
    assert _hoststate.difference(before, after) == ["links: added no-such-link0", "mounts: removed /"]


def test_sysctls_a_cni_plugin_changed_are_written_back_and_absent_ones_left_alone(tmp_path):
    for name, value in zip(_hoststate.SYSCTLS, ("0", "0", "-"), strict=True):
        if value != "-":
            (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
            (tmp_path / name).write_text(value + "\n")
    before = _hoststate._sysctls(tmp_path)
    assert before[2] == (_hoststate.SYSCTLS[2], "-")
    (tmp_path / "net/ipv4/ip_forward").write_text("1\n")  # what the bridge plugin does at the first pod
    assert _hoststate.restore_sysctls(before, tmp_path) == ["net/ipv4/ip_forward"]
    assert _hoststate._sysctls(tmp_path) == before
    assert _hoststate.restore_sysctls(before, tmp_path) == []


@pytest.mark.skipif(os.geteuid() != 0 or shutil.which("ip") is None, reason="ip netns needs root and iproute2")
def test_a_named_network_namespace_of_another_user_is_not_the_nodes_host_state():
    name = f"rlhoststate{os.getpid()}"
    before = _hoststate.snapshot()
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        during = _hoststate.snapshot()
        assert f"/run/netns/{name}" in _hoststate.mount_points()
    finally:
        subprocess.run(["ip", "netns", "del", name], check=True)
    assert _hoststate.difference(before, during) == []
