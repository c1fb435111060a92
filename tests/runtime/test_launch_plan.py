"""The launch plan: one argv, environment and grace per role for pods and `rlightning run`; the runtime accepts both."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from rlightning import contract, launch
from rlightning.config import parse_manifest
from rlightning.runtime import local
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings, eval_ordinal
from rlightning_operator import _builders as builders

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "cartpole.yaml"
NS = "team-a"
POD_MASTER = "cartpole-train-0.cartpole-train.team-a.svc"


def _manifest(**spec):
    document = yaml.safe_load(EXAMPLE.read_text())
    for key, value in spec.items():
        document["spec"][key] = {**document["spec"].get(key, {}), **value}
    return parse_manifest(document)


def _site(**fields) -> launch.LaunchSite:
    local_site = {"python": "py", "master_addr": "127.0.0.1", "trainer_hosts": ("127.0.0.1",),
                  "spec_path": "/r/policygroup.yaml", "run_dir": "/r", "node_rank": None, "metrics": False,
                  "expected_evaluators": 2, "in_pod": False, "bind_host": "127.0.0.1"}  # fmt: skip
    return launch.LaunchSite(**{**local_site, **fields})


POD_TRAINER_1 = "cartpole-train-1.cartpole-train.team-a.svc"
POD = {"python": "python", "master_addr": POD_MASTER, "trainer_hosts": (POD_MASTER, POD_TRAINER_1),
       "node_rank": "$(JOB_COMPLETION_INDEX)", "metrics": True,
       "expected_evaluators": None, "in_pod": True, "bind_host": None}  # fmt: skip
TORCHRUN = ("-m", "torch.distributed.run")
LOCAL_TORCHRUN = ("-m", "rlightning.runtime.torchrun", "--start-method=fork")  # store on 127.0.0.1, forked ranks
TRAIN_TAIL = ("--max-restarts=0", "--monitor-interval=0.5", "-m", "rlightning.runtime.train")

# (spec edits, site fields, role, ordinal, argv, env entries, env_from_pod)
PLAN_CASES: dict[str, tuple] = {
    "local trainer: every rank on one node, told the fleet size": (
        {"train": {"nodes": 2, "procsPerNode": 3}}, {}, "train", None,
        ("py", *LOCAL_TORCHRUN, "--nnodes=1", "--nproc-per-node=6", "--master-addr=127.0.0.1", "--master-port=29500",
         *TRAIN_TAIL),
        {contract.ENV_EXPECTED_EVALUATORS: "2", contract.ENV_METRICS_PORT: "0", contract.ENV_ROLE: "train",
         contract.ENV_FLEET_DATA: "1", contract.ENV_BIND_HOST: "127.0.0.1", "GLOO_SOCKET_IFNAME": "lo",
         "NCCL_SOCKET_IFNAME": "lo"},
        (),
    ),
    "local trainer without evaluators and no data source: it collects its own data": (
        {"eval": {"replicas": 0}, "train": {"dataSource": None}}, {}, "train", None,
        ("py", *LOCAL_TORCHRUN, "--nnodes=1", "--nproc-per-node=1", "--master-addr=127.0.0.1", "--master-port=29500",
         *TRAIN_TAIL),
        {contract.ENV_FLEET_DATA: "0", contract.ENV_ERROR_FILE: f"/r/{contract.ERROR_FILE_NAME}"},
        (),
    ),
    "local evaluator: its ordinal in the environment, every rank's intake on this host": (
        {"train": {"procsPerNode": 2}}, {}, "eval", 1, ("py", "-m", "rlightning.runtime.eval"),
        {contract.ENV_EVAL_ORDINAL: "1", contract.ENV_ROLE: "eval", contract.ENV_RUN_DIR: "/r",
         contract.ENV_TRAJECTORY_ENDPOINTS: "127.0.0.1:29700,127.0.0.1:29701", contract.ENV_BIND_HOST: "127.0.0.1"},
        (),
    ),
    "pod trainer: node rank from the Job, reports status": (
        {"train": {"nodes": 2, "procsPerNode": 3}}, POD, "train", None,
        ("python", *TORCHRUN, "--nnodes=2", "--nproc-per-node=3", "--node-rank=$(JOB_COMPLETION_INDEX)",
         f"--master-addr={POD_MASTER}", "--master-port=29500", *TRAIN_TAIL),
        {contract.ENV_REPORT_STATUS: "1", contract.ENV_METRICS_PORT: "9400",
         contract.ENV_ERROR_FILE: contract.TERMINATION_LOG_IN_POD,
         contract.ENV_TRAIN_MASTER_ADDR: POD_MASTER, contract.ENV_BIND_HOST: None, "GLOO_SOCKET_IFNAME": None},
        (contract.ENV_NAMESPACE, contract.ENV_POD_NAME),
    ),
    "pod evaluator: ordinal from the pod name, each trainer pod's ranks' intakes": (
        {"ports": {"weightSync": 30000, "trajectories": 31000}, "train": {"nodes": 2, "procsPerNode": 2}}, POD, "eval",
        None, ("python", "-m", "rlightning.runtime.eval"),
        {contract.ENV_WEIGHT_SYNC_PORT: "30000", contract.ENV_GROUP_NAME: "cartpole",
         contract.ENV_ERROR_FILE: contract.TERMINATION_LOG_IN_POD,
         contract.ENV_TRAJECTORY_ENDPOINTS: f"{POD_MASTER}:31000,{POD_MASTER}:31001,{POD_TRAINER_1}:31000,"
                                            f"{POD_TRAINER_1}:31001"},
        (contract.ENV_NAMESPACE, contract.ENV_POD_NAME),
    ),
}


@pytest.mark.parametrize("case", PLAN_CASES)
def test_plan(case):
    edits, site, role, ordinal, argv, env, from_pod = PLAN_CASES[case]
    plan = launch.plan(_manifest(**edits), role, _site(**site), ordinal)
    assert plan.role == role and plan.argv == argv
    assert {name: plan.env.get(name) for name in env} == env
    assert plan.env_from_pod == from_pod
    ours = set(plan.env) - {launch.THREADS_ENV, *launch.SOCKET_IFNAME_ENV}  # torch's, gloo's, NCCL's: not ours
    assert list(plan.env) == sorted(plan.env) and ours | set(from_pod) <= set(launch.RUNTIME_ENV)
    absent = {contract.ENV_EXPECTED_EVALUATORS, contract.ENV_REPORT_STATUS} if role == "eval" else set()
    absent |= {contract.ENV_ERROR_FILE} if role == "eval" and not site else set()  # a local evaluator logs it
    absent |= {contract.ENV_EVAL_ORDINAL} if ordinal is None else set()
    assert not absent & set(plan.env)


@pytest.mark.parametrize(("timeout", "grace"), [(None, 75), (1, 16), (0.5, 16), (12.2, 28), (600, 615)])
def test_grace_covers_a_clean_leave_for_both_roles(timeout, grace):
    manifest = _manifest() if timeout is None else _manifest(weightSync={"timeoutSeconds": timeout})
    plans = [launch.plan(manifest, "train", _site()), launch.plan(manifest, "eval", _site(), 0)]
    assert [plan.grace_seconds for plan in plans] == [grace, grace]


@pytest.mark.parametrize(
    ("role", "site", "ordinal", "error"),
    [
        ("trainer", {}, None, "'trainer' is not a valid PolicyRole"),
        ("train", {}, 0, "ordinal: only an evaluator has one"),
        ("eval", {}, -1, "ordinal: .* >= 0"),
        ("eval", {}, None, "ordinal: an evaluator outside a pod needs one"),
    ],
)
def test_plan_rejects(role, site, ordinal, error):
    with pytest.raises(ValueError, match=error):
        launch.plan(_manifest(), role, _site(**site), ordinal)


def _pod_environ(container: dict, pod_name: str) -> dict[str, str]:
    """A container's env as the kubelet sets it: values, and downward-API fields of this pod."""
    fields = {"metadata.namespace": NS, "metadata.name": pod_name}
    return {
        item["name"]: item["value"] if "value" in item else fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        for item in container["env"]
    }


def test_the_pods_environment_gives_valid_settings_for_each_role():
    children = {child["kind"]: child for child in builders.build_children(_manifest(), NS)}
    environs = {
        "train": _pod_environ(children["Job"]["spec"]["template"]["spec"]["containers"][0], "cartpole-train-0-x7k2p"),
        "eval": _pod_environ(children["StatefulSet"]["spec"]["template"]["spec"]["containers"][0], "cartpole-eval-3"),
    }
    for role, environ in environs.items():
        settings = ProcessSettings.from_env(environ)
        settings.require_role(contract.PolicyRole(role))
        assert (settings.role, settings.group_name, settings.namespace) == (role, "cartpole", NS)
        assert (settings.master_addr, settings.weight_sync_port, settings.metrics_port) == (POD_MASTER, 29600, 9400)
        assert settings.spec_path == Path(contract.SPEC_MOUNT_DIR) / contract.SPEC_FILE_NAME
        assert settings.run_dir == Path(contract.DEFAULT_RUN_DIR_IN_POD)
        assert settings.report_status is (role == "train") and settings.expected_evaluators is None
        assert settings.bind_host is None  # a pod's ports bind every interface: its peers are other pods
        intakes = (f"{POD_MASTER}:29700",)  # the example: 1 trainer pod, 1 rank
        assert settings.trajectory_endpoints == (intakes if role == "eval" else ())
    assert eval_ordinal(environs["eval"]) == 3


def test_the_local_environment_gives_valid_settings_for_each_role(tmp_path, monkeypatch):
    # A launcher started from inside a pod (or a shell that ran one by hand) must not leak its own settings.
    inherited = {contract.ENV_NAMESPACE: "x", contract.ENV_REPORT_STATUS: "1", contract.ENV_POD_NAME: "p-9"}
    for name, value in inherited.items():
        monkeypatch.setenv(name, value)
    run = local.LocalRun(_manifest(eval={"replicas": 3}), "", RunDir(tmp_path / "run"))
    *evals, trainer = run.children()
    assert trainer.command[:4] == [sys.executable, *LOCAL_TORCHRUN] and evals[0].command[0] == sys.executable
    for ordinal, child in enumerate([*evals, trainer]):
        settings = ProcessSettings.from_env(child.env)
        role = "train" if child is trainer else "eval"
        settings.require_role(contract.PolicyRole(role))
        assert (settings.role, settings.group_name, settings.namespace) == (role, "cartpole", None)
        assert (settings.master_addr, settings.weight_sync_port, settings.metrics_port) == ("127.0.0.1", 29600, 0)
        assert settings.spec_path == RunDir(tmp_path / "run").spec_path.resolve()
        assert settings.report_status is False and settings.bind_host == "127.0.0.1"  # every port on loopback
        assert settings.expected_evaluators == (3 if role == "train" else None)
        if role == "eval":
            assert eval_ordinal(child.env) == ordinal
        assert child.grace_seconds == 75 and re.fullmatch(r"(eval-\d|trainer)", child.name)


FORK_PLAN = """
import json, sys, threading
from pathlib import Path
import yaml
from rlightning.config import parse_manifest
from rlightning.runtime import local
from rlightning.runtime.rundir import RunDir
manifest, run_dir = parse_manifest(yaml.safe_load(Path(sys.argv[1]).read_text())), RunDir(Path(sys.argv[2]))
plans = {"same": local.LocalRun(manifest, "", run_dir, fork=True),
         "other": local.LocalRun(manifest, "", run_dir, python="/opt/other/python", fork=True),
         "embedded": local.LocalRun(manifest, "", run_dir)}
forks = {name: [child.fork for child in plan.children()] for name, plan in plans.items()}
forks["threads"] = threading.active_count()
release = threading.Event()
other_thread = threading.Thread(target=release.wait, daemon=True)
other_thread.start()  # as a library's or an embedding's thread: a fork would copy none of its locks' owners
forks["threaded"] = [child.fork for child in plans["same"].children()]
release.set()
print(json.dumps(forks))
"""


@pytest.mark.skipif(not hasattr(os, "pidfd_open"), reason="forks with a pidfd: Linux only")
def test_local_children_fork_the_launcher_only_when_asked_and_they_run_its_interpreter(tmp_path):
    # A fork shares the launcher's imports (torch's agent and the evaluators); another interpreter needs an exec,
    # and a process with another thread (an embedding's, a library's) may hold locks a fork would leave held.
    # Planned in a fresh interpreter of one thread, as `rlightning run`'s: a test runner's worker may have more.
    proc = subprocess.run([sys.executable, "-c", FORK_PLAN, str(EXAMPLE), str(tmp_path / "run")],
                          capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    forks = json.loads(proc.stdout)
    assert forks.pop("threads") == 1
    assert forks["same"] == [True] * len(forks["same"]) and len(forks["same"]) == 3  # 2 evaluators, the trainer
    assert forks["other"] == [False] * len(forks["other"]) and len(forks["other"]) == 3
    assert forks["embedded"] == [False] * len(forks["embedded"]) and len(forks["embedded"]) == 3
    assert forks["threaded"] == [False] * 3


@pytest.mark.parametrize(
    ("role", "procs", "resources", "threads"),
    [
        ("train", 2, {"requests": {"cpu": "2"}}, "1"),
        ("train", 1, {"requests": {"cpu": "2"}}, "2"),  # a lone rank gets the pod's CPU, not the node's cores
        ("train", 2, {"requests": {"cpu": "3"}, "limits": {"cpu": "8"}}, "4"),  # the limit is what it may use
        ("train", 1, {"requests": {"cpu": "250m"}}, "1"),
        ("train", 2, {}, "1"),  # torchrun's own choice for several ranks, made explicit
        ("train", 1, {}, None),  # no CPU figure: torch's default
        ("eval", 2, {"requests": {"cpu": "1500m"}}, "1"),
        ("eval", 2, {"limits": {"cpu": "4"}}, "4"),
    ],
)
def test_pod_processes_use_their_pods_cpu(role, procs, resources, threads):
    manifest = _manifest(train={"procsPerNode": procs, "pod": {"resources": resources}},
                         eval={"pod": {"resources": resources}})  # fmt: skip
    pod_plan = launch.plan(manifest, role, _site(**POD))
    assert pod_plan.env.get(launch.THREADS_ENV) == threads
    local_plan = launch.plan(manifest, role, _site(), ordinal=0 if role == "eval" else None)
    assert launch.THREADS_ENV not in local_plan.env  # local children share the machine: the launcher sets 1


@pytest.mark.parametrize(
    ("data_source", "replicas", "fleet"),
    [(None, 2, True), (None, 0, False), ("fleet", 0, True), ("trainers", 2, False)],
)
def test_the_data_source_follows_the_spec_else_the_fleet_size(data_source, replicas, fleet):
    manifest = _manifest(train={"dataSource": data_source}, eval={"replicas": replicas})
    assert launch.fleet_collects(manifest.spec) is fleet
    for role, ordinal in (("train", None), ("eval", 0)):
        assert launch.plan(manifest, role, _site(), ordinal).env[contract.ENV_FLEET_DATA] == ("1" if fleet else "0")


def _probe_exit(check: launch.Probe, path: Path) -> int:
    code = check.argv[2].replace(repr(contract.HEALTH_FILE_IN_POD), repr(str(path)))
    return subprocess.run([sys.executable, "-c", code], check=False, timeout=60).returncode


def test_pods_probe_their_processes_through_the_health_file(tmp_path):
    manifest = _manifest(weightSync={"timeoutSeconds": 10})
    pod = {"python": "python", "master_addr": POD_MASTER, "trainer_hosts": (POD_MASTER,), "spec_path": "/s",
           "run_dir": "/r", "node_rank": "0", "metrics": True, "expected_evaluators": None, "in_pod": True}  # fmt: skip
    ready = launch.plan(manifest, "eval", launch.LaunchSite(**pod)).probe
    alive = launch.plan(manifest, "train", launch.LaunchSite(**pod)).probe
    assert ready is not None and ready.kind == "readiness" and alive is not None and alive.kind == "liveness"
    assert launch.plan(manifest, "eval", _site(), 0).probe is None  # no pods, no probes
    assert launch.plan(manifest, "eval", launch.LaunchSite(**pod)).env[contract.ENV_HEALTH_FILE] == (
        contract.HEALTH_FILE_IN_POD
    )
    health = tmp_path / "health"
    # Before any weights: not ready; a trainer that has not started its loop yet: alive.
    assert (_probe_exit(ready, health), _probe_exit(alive, health)) == (1, 0)
    health.touch()
    assert (_probe_exit(ready, health), _probe_exit(alive, health)) == (0, 0)
    stale = 3 * 10 + launch.LIVENESS_MARGIN_SECONDS + 5  # seconds since the loop last moved
    os.utime(health, (time.time() - stale, time.time() - stale))
    assert _probe_exit(alive, health) == 1
