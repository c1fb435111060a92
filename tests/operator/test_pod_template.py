"""Pod templates, /dev/shm, NCCL settings and GPUs in the built children (pure builders, no cluster)."""

from __future__ import annotations

from rlightning import contract, launch
from rlightning.config import parse_manifest
from rlightning_operator import build_children

from operator_manifests import edited, example, example_document  # noqa: F401 (fixture)

NS = "team-a"
GPU = "nvidia.com/gpu"
TRAIN_TEMPLATE = {
    "metadata": {"labels": {"team": "rl"}, "annotations": {"example.com/cost-center": "42"}},
    "spec": {
        "imagePullSecrets": [{"name": "registry"}],
        "serviceAccountName": "s3-reader",
        "securityContext": {"fsGroup": 1000},
        "volumes": [{"name": "assets", "configMap": {"name": "sim-assets"}}],
        "initContainers": [{"name": "fetch", "image": "busybox", "command": ["true"]}],
        "containers": [
            {
                "name": "train",
                "env": [{"name": "DATASET", "value": "/data"}],
                "envFrom": [{"secretRef": {"name": "s3-credentials"}}],
                "volumeMounts": [{"name": "assets", "mountPath": "/assets", "readOnly": True}],
                "securityContext": {"runAsNonRoot": True},
                "workingDir": "/data",
            },
            {"name": "log-shipper", "image": "fluent-bit", "volumeMounts": [{"name": "run", "mountPath": "/logs"}]},
        ],
    },
}


def _children(**paths):
    children = build_children(parse_manifest(edited(example_document(), **paths)), NS)
    return {child["kind"]: child for child in children if child["kind"] in ("Job", "StatefulSet", "RoleBinding")}


def _pod(workload):
    return workload["spec"]["template"]


def _runtime(workload, role):
    return next(c for c in _pod(workload)["spec"]["containers"] if c["name"] == role)


def test_the_templates_fields_arrive_in_the_job_beside_the_operators():
    children = _children(**{"spec.train.template": TRAIN_TEMPLATE})
    job, sts = children["Job"], children["StatefulSet"]
    metadata, pod = _pod(job)["metadata"], _pod(job)["spec"]
    assert metadata["labels"]["team"] == "rl" and metadata["labels"][contract.LABEL_ROLE] == "train"
    assert metadata["annotations"]["example.com/cost-center"] == "42"
    assert metadata["annotations"][contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT] == "true"
    assert pod["imagePullSecrets"] == [{"name": "registry"}] and pod["securityContext"] == {"fsGroup": 1000}
    assert pod["serviceAccountName"] == "s3-reader"
    assert [v["name"] for v in pod["volumes"]] == ["run", "spec", "dshm", "assets"]
    assert [c["name"] for c in pod["initContainers"]] == [contract.VALIDATE_CONTAINER, "fetch"]
    assert [c["name"] for c in pod["containers"]] == ["train", "log-shipper"]
    runtime = _runtime(job, "train")
    env = [e["name"] for e in runtime["env"]]
    assert env[-1] == "DATASET" and contract.ENV_ROLE in env  # the user's after the launch plan's
    assert runtime["envFrom"] == [{"secretRef": {"name": "s3-credentials"}}]
    assert runtime["volumeMounts"][-1] == {"name": "assets", "mountPath": "/assets", "readOnly": True}
    assert runtime["securityContext"] == {"runAsNonRoot": True} and runtime["workingDir"] == "/data"
    assert runtime["command"][2] == launch.TORCHRUN_MODULE and runtime["image"] == contract.DEFAULT_IMAGE
    # The trainers' template is theirs alone; the user's ServiceAccount may still write the status.
    assert "imagePullSecrets" not in _pod(sts)["spec"] and "team" not in _pod(sts)["metadata"]["labels"]
    subjects = [s["name"] for s in children["RoleBinding"]["subjects"]]
    assert subjects == ["cartpole-runtime", "s3-reader"]


def test_a_template_is_part_of_its_roles_hash_only():
    before, after = _children(), _children(**{"spec.train.template": TRAIN_TEMPLATE})
    hashes = [
        {kind: child["metadata"]["annotations"][contract.ANNOTATION_SPEC_HASH] for kind, child in c.items()
         if kind != "RoleBinding"}
        for c in (before, after)
    ]
    assert hashes[0]["Job"] != hashes[1]["Job"] and hashes[0]["StatefulSet"] == hashes[1]["StatefulSet"]


def test_the_shorthand_schedules_a_templated_pod():
    template = {"spec": {"runtimeClassName": "nvidia"}}
    sts = _children(**{"spec.eval.template": template, "spec.eval.pod.nodeSelector": {"pool": "eval"}})["StatefulSet"]
    pod = _pod(sts)["spec"]
    assert pod["runtimeClassName"] == "nvidia" and pod["nodeSelector"] == {"pool": "eval"}


def test_an_evaluator_template_may_use_what_only_trainers_own():
    # The autoscalers' annotations are the trainers' alone; an evaluator may carry them, and a sidecar is free.
    template = {"metadata": {"annotations": {contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT: "true"}},
                "spec": {"containers": [{"name": "train", "image": "x", "command": ["y"]}]}}
    sts = _children(**{"spec.eval.template": template})["StatefulSet"]
    assert _pod(sts)["metadata"]["annotations"][contract.ANNOTATION_KARPENTER_DO_NOT_DISRUPT] == "true"


def test_every_pod_gets_a_memory_backed_dev_shm():
    sized = _children(**{"spec.eval.pod.shmSize": "8Gi"})
    for kind, role, size in (("Job", "train", "1Gi"), ("StatefulSet", "eval", "8Gi")):
        pod = _pod(sized[kind])["spec"]
        volume = next(v for v in pod["volumes"] if v["name"] == contract.SHM_VOLUME)
        assert volume["emptyDir"] == {"medium": "Memory", "sizeLimit": size}
        mounts = {m["name"]: m["mountPath"] for m in _runtime(sized[kind], role)["volumeMounts"]}
        assert mounts[contract.SHM_VOLUME] == "/dev/shm"


def test_nccl_settings_reach_both_roles_and_a_local_run_keeps_loopback():
    nccl = {"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": "eth0"}
    children = _children(**{"spec.nccl": nccl})
    for kind, role in (("Job", "train"), ("StatefulSet", "eval")):
        env = {e["name"]: e.get("value") for e in _runtime(children[kind], role)["env"]}
        assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_SOCKET_IFNAME"] == "eth0"
    manifest = parse_manifest(edited(example_document(), **{"spec.nccl": nccl}))
    site = launch.LaunchSite(python="python", master_addr="127.0.0.1", trainer_hosts=("127.0.0.1",), spec_path="s",
                             run_dir="r", node_rank=None, metrics=False, expected_evaluators=1, in_pod=False,
                             bind_host=contract.LOOPBACK_HOST)
    env = launch.plan(manifest, "train", site).env
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_SOCKET_IFNAME"] == launch.LOOPBACK_INTERFACE


def test_a_gpu_trainer_runs_one_rank_per_gpu():
    job = _children(**{"spec.train.procsPerNode": 4, "spec.train.pod.resources": {"limits": {GPU: "4"}}})["Job"]
    runtime = _runtime(job, "train")
    assert "--nproc-per-node=4" in runtime["command"] and runtime["resources"]["limits"][GPU] == "4"
