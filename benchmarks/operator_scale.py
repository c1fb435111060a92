"""Operator at scale against the devcluster harness: time to Running, API requests, memory.

Scenarios (each in a fresh namespace, one operator process serving it):

- `wide`: 1 PolicyGroup x 1000 evaluators;
- `many`: 100 PolicyGroups x 10 evaluators;
- `thousand`: 1000 PolicyGroups x 10 evaluators (11,000 pods; kwok nodes are added to hold them); not in `all`.

Figures per scenario: seconds from the first `kubectl apply` until every pod is Running and every PolicyGroup
says Ready=True (`timed_out` after 1,800 s of waiting, with `ready_groups` saying how many did); the reconciler's
API requests until then (`rlightning_operator_api_requests_total`; kopf's own watch and bookkeeping requests are
not counted), by kind; the operator's CPU seconds until then (user + system, its imports included); the
operator's peak RSS (VmHWM); and the reconciler's requests per minute at steady state (once no reconcile happened
for 10 s, measured over `--steady-seconds`), also by verb and kind, with the passes a minute by trigger
(`recheck`: a condition that turns with time, such as TrainingProgressing of kwok's trainers, which never
report). The baseline (`baseline_seconds`, unless `--no-baseline`): the same children (built by the operator's
builders) created directly by this script with the operator's number of threads, no operator, in a namespace of
their own, until every pod is Running and every StatefulSet and Job counts its pods ready in its status (what a
PolicyGroup's Ready reads; `baseline_pods_running_seconds`: until the pods alone); the operator's share of the wall
time is the ratio.

Usage:
    python benchmarks/operator_scale.py [--scenario wide|many|thousand|all] [--steady-seconds 60]
        [--no-baseline] [--kubeconfig FILE]   # a running cluster (default: start one with devcluster.launch())
        [--record]                            # append the figures to docs/measurements.md (`figures`)
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import math
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for tests.operator.operator_cluster

import kubernetes  # noqa: E402
import yaml  # noqa: E402

import devcluster  # noqa: E402
from benchmarks import _record  # noqa: E402
from devcluster import _nodes  # noqa: E402
from rlightning.config import parse_manifest  # noqa: E402
from rlightning_operator import _builders as builders  # noqa: E402
from rlightning_operator import _kube as kube  # noqa: E402
from rlightning_operator import _settings  # noqa: E402
from tests.operator.operator_cluster import CRD_FILE, OperatorProcess, small, wait_for  # noqa: E402

SCENARIOS = {"wide": (1, 1000), "many": (100, 10), "thousand": (1000, 10)}
"""name -> (PolicyGroups, evaluators each)."""
ALL = ("wide", "many")
"""What `--scenario all` runs (`thousand` takes long: ask for it by name)."""
READY_TIMEOUT_SECONDS = 1800.0


class _GivenCluster:
    """The part of devcluster.Cluster that OperatorProcess uses, for a cluster given by a kubeconfig."""

    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = Path(kubeconfig)


def _install_crd(kubeconfig: Path) -> None:
    """Create or replace the PolicyGroup CRD from crds/ and wait until it is Established."""
    api = kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    extensions = kubernetes.client.ApiextensionsV1Api(api)
    body = yaml.safe_load(CRD_FILE.read_text())
    try:
        extensions.create_custom_resource_definition(body)
    except kubernetes.client.ApiException as error:
        if error.status != 409:
            raise
        current = extensions.read_custom_resource_definition(body["metadata"]["name"])
        body["metadata"]["resourceVersion"] = current.metadata.resource_version
        extensions.replace_custom_resource_definition(body["metadata"]["name"], body)

    def established() -> bool:
        crd = extensions.read_custom_resource_definition(body["metadata"]["name"])
        return any(c.type == "Established" and c.status == "True" for c in crd.status.conditions or [])

    wait_for("the CRD to be Established", established, timeout=60)
    api.close()


def _rss_peak_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _cpu_seconds(pid: int) -> float:
    """CPU time (user + system, seconds) process `pid` used so far (/proc/PID/stat, proc(5))."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _running(api: kubernetes.client.ApiClient, namespace: str, pods: int) -> bool:
    """At least `pods` pods of the namespace are Running and not being deleted."""
    core = kubernetes.client.CoreV1Api(api)
    listed_pods = json.loads(core.list_namespaced_pod(namespace, _preload_content=False).data)["items"]
    running = sum(1 for p in listed_pods
                  if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp"))
    return running >= pods


def _ready_groups(api: kubernetes.client.ApiClient, namespace: str) -> int:
    """How many PolicyGroups of the namespace say Ready=True."""
    custom = kubernetes.client.CustomObjectsApi(api)
    listed = custom.list_namespaced_custom_object("rlightning.io", "v1alpha1", namespace, "policygroups")["items"]
    return sum(1 for g in listed for c in (g.get("status") or {}).get("conditions") or []
               if c["type"] == "Ready" and c["status"] == "True")


def _all_ready(api: kubernetes.client.ApiClient, namespace: str, groups: int, pods: int) -> bool:
    """Every PolicyGroup says Ready=True and `pods` pods are Running (PolicyGroups first: the cheaper list)."""
    return _ready_groups(api, namespace) >= groups and _running(api, namespace, pods)


def _ensure_nodes(api: kubernetes.client.ApiClient, pods: int) -> None:
    """Add kwok nodes (devcluster's manifests, no GPUs) until they hold `pods` with one node to spare."""
    core = kubernetes.client.CoreV1Api(api)
    per_node = int(_nodes.CAPACITY["pods"])
    existing = {node.metadata.name for node in core.list_node().items}
    for index in range(_nodes.NODE_COUNT, math.ceil(pods / per_node) + 1):
        if _nodes.node_name(index) not in existing:
            core.create_node(_nodes.node_manifest(index, gpu=False))


def _group_body(index: int, evaluators: int) -> dict:
    return small(f"pg-{index:03d}", replicas=evaluators, **{"spec.eval.maxReplicas": max(1000, evaluators)})


def _workloads_ready(api: kubernetes.client.ApiClient, namespace: str) -> bool:
    """Every StatefulSet and Job of the namespace counts all its pods ready in its own status (`readyReplicas`,
    `ready`): what a PolicyGroup's Ready reads, which the controller manager writes after the pods are ready.
    """
    sets = json.loads(kubernetes.client.AppsV1Api(api).list_namespaced_stateful_set(
        namespace, _preload_content=False).data)["items"]
    jobs = json.loads(kubernetes.client.BatchV1Api(api).list_namespaced_job(
        namespace, _preload_content=False).data)["items"]
    return all(int((s.get("status") or {}).get("readyReplicas") or 0) >= s["spec"]["replicas"] for s in sets) and \
        all(int((j.get("status") or {}).get("ready") or 0) >= int(j["spec"].get("parallelism") or 1) for j in jobs)


def run_baseline(cluster: _GivenCluster | devcluster.Cluster, name: str) -> tuple[float, float]:
    """Seconds to create the scenario's children directly (no operator) until every pod is Running, and until
    every StatefulSet and Job also counts its pods ready (`_workloads_ready`), the state a PolicyGroup's Ready
    reads.

    The children are what the operator builds for each PolicyGroup, without owner references, created with as
    many threads as the operator has workers; the namespace is deleted afterwards.
    """
    groups, evaluators = SCENARIOS[name]
    namespace = f"base-{name}-{uuid.uuid4().hex[:6]}"
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    workers = _settings.OperatorSettings.model_fields["workers"].default
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)
    client = kube.KubeClient(kube.load_api_client(pool_size=workers))

    def create(index: int) -> None:
        manifest = parse_manifest(_group_body(index, evaluators))
        for child in builders.build_children(manifest, namespace):
            client.create(child)
    try:
        started = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            list(pool.map(create, range(groups)))
        wait_for(f"{groups * (evaluators + 1)} pods Running without the operator",
                 lambda: _running(api, namespace, groups * (evaluators + 1)), timeout=READY_TIMEOUT_SECONDS,
                 interval=1.0)
        running = time.monotonic() - started
        wait_for("every StatefulSet and Job to count its pods ready", lambda: _workloads_ready(api, namespace),
                 timeout=READY_TIMEOUT_SECONDS, interval=1.0)
        return running, time.monotonic() - started
    finally:
        core = kubernetes.client.CoreV1Api(api)
        core.delete_namespace(namespace)

        def gone() -> bool:
            try:
                core.read_namespace(namespace)
            except kubernetes.client.ApiException as error:
                return error.status == 404
            return False
        wait_for("the baseline's namespace to be gone", gone, timeout=READY_TIMEOUT_SECONDS, interval=1.0)
        api.close()


def _settle(operator: OperatorProcess, quiet_seconds: float = 10.0, timeout: float = 180.0) -> float:
    """Seconds until the reconcile counter stops moving for `quiet_seconds` (child status churn after Ready)."""
    started = time.monotonic()
    last, last_change = operator.counter("rlightning_operator_reconciles_total"), time.monotonic()
    while time.monotonic() - last_change < quiet_seconds and time.monotonic() - started < timeout:
        time.sleep(1.0)
        now = operator.counter("rlightning_operator_reconciles_total")
        if now != last:
            last, last_change = now, time.monotonic()
    return time.monotonic() - started - quiet_seconds


def _by_labels(operator: OperatorProcess, name: str, labels: tuple[str, ...]) -> dict[str, int]:
    """A counter's samples summed by `labels`, "a/b" -> total, largest first (where the requests went)."""
    totals: dict[str, int] = {}
    for sample, value in operator.metrics().items():
        if sample.startswith(name + "{"):
            found = dict(part.split("=", 1) for part in sample[len(name) + 1:-1].split(","))
            key = "/".join(found.get(label, "").strip('"') for label in labels)
            totals[key] = totals.get(key, 0) + int(value)
    return dict(sorted(totals.items(), key=lambda item: -item[1]))


def _per_minute(before: dict[str, int], after: dict[str, int], seconds: float) -> dict[str, float]:
    """Per-minute rates of the keys of `_by_labels` that moved between two readings `seconds` apart."""
    return {key: round((value - before.get(key, 0)) * 60 / seconds, 1)
            for key, value in after.items() if value != before.get(key, 0)}


def run_scenario(cluster: _GivenCluster | devcluster.Cluster, name: str, steady_seconds: float, log_dir: Path) -> dict:
    """Run one scenario; returns its figures."""
    groups, evaluators = SCENARIOS[name]
    namespace = f"bench-{name}-{uuid.uuid4().hex[:6]}"
    api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
    kubernetes.client.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
    operator = OperatorProcess(cluster, namespace, log_dir / f"operator-{name}.log").start()
    assert operator.process is not None, "started"
    custom = kubernetes.client.CustomObjectsApi(api)
    try:
        started = time.monotonic()
        for index in range(groups):
            custom.create_namespaced_custom_object("rlightning.io", "v1alpha1", namespace, "policygroups",
                                                   _group_body(index, evaluators))
        try:
            wait_for(f"{groups} PolicyGroups Ready with {groups * (evaluators + 1)} pods Running",
                     lambda: _all_ready(api, namespace, groups, groups * (evaluators + 1)),
                     timeout=READY_TIMEOUT_SECONDS, interval=1.0)
            timed_out = False
        except AssertionError:  # the figures so far still say where the time went
            timed_out = True
        seconds = time.monotonic() - started
        cpu_to_ready = _cpu_seconds(operator.process.pid)
        requests_to_ready = operator.counter("rlightning_operator_api_requests_total")
        reconciles = operator.counter("rlightning_operator_reconciles_total")
        settle = _settle(operator)
        before = operator.counter("rlightning_operator_api_requests_total")
        requests_before = _by_labels(operator, "rlightning_operator_api_requests_total", ("verb", "kind"))
        reconciles_before = _by_labels(operator, "rlightning_operator_reconciles_total", ("trigger",))
        time.sleep(steady_seconds)
        steady = (operator.counter("rlightning_operator_api_requests_total") - before) * 60 / steady_seconds
        return {
            "scenario": name,
            "policy_groups": groups,
            "evaluators_each": evaluators,
            "pods": groups * (evaluators + 1),
            "seconds_to_running_and_ready": round(seconds, 1),
            "timed_out": timed_out,
            "ready_groups": _ready_groups(api, namespace),
            "api_requests_to_ready": int(requests_to_ready),
            "reconciles_to_ready": int(reconciles),
            "settle_seconds_after_ready": round(settle, 1),
            "peak_rss_mib": round(_rss_peak_mib(operator.process.pid), 1),
            "operator_cpu_seconds_to_ready": round(cpu_to_ready, 1),
            "steady_requests_per_minute": round(steady, 1),
            "steady_requests_per_minute_by_kind": _per_minute(
                requests_before, _by_labels(operator, "rlightning_operator_api_requests_total", ("verb", "kind")),
                steady_seconds),
            "steady_reconciles_per_minute": _per_minute(
                reconciles_before, _by_labels(operator, "rlightning_operator_reconciles_total", ("trigger",)),
                steady_seconds),
            "errors": int(operator.counter("rlightning_operator_reconcile_errors_total")),
            "api_requests_by_kind": _by_labels(operator, "rlightning_operator_api_requests_total", ("verb", "kind")),
            "watch_events": _by_labels(operator, "rlightning_operator_watch_events_total", ("kind", "outcome")),
            "reconciles": _by_labels(operator, "rlightning_operator_reconciles_total", ("trigger",)),
        }
    finally:
        operator.stop()
        kubernetes.client.CoreV1Api(api).delete_namespace(namespace)
        api.close()


def figures(results: list[dict]) -> str:
    """The scenarios' figures as one line for docs/measurements.md.

    Args:
        results (list[dict]): `run_scenario`'s results, each with its baseline.

    Returns:
        str: e.g. ``thousand: 11000 pods Running and Ready in 740.7 s (0.91x the baseline's 815.5 s), 17316 API
        requests (17.3 a group), operator CPU 72.5 s, peak RSS 107.0 MiB, 12.0 requests/min steady``.
    """
    cells = []
    for r in results:
        ready = f"{r['seconds_to_running_and_ready']} s" + (
            f" (TIMED OUT, {r['ready_groups']} of {r['policy_groups']} groups Ready)" if r["timed_out"] else "")
        if r["baseline_seconds"]:
            ready += (f" ({r['seconds_to_running_and_ready'] / r['baseline_seconds']:.2f}x the baseline's "
                      f"{r['baseline_seconds']} s)")
        cells.append(f"{r['scenario']}: {r['pods']} pods Running and Ready in {ready}, {r['api_requests_to_ready']} "
                     f"API requests ({r['api_requests_to_ready'] / r['policy_groups']:.1f} a group), operator CPU "
                     f"{r['operator_cpu_seconds_to_ready']} s, peak RSS {r['peak_rss_mib']} MiB, "
                     f"{r['steady_requests_per_minute']} requests/min steady")
    return "; ".join(cells)


def main(argv: list[str] | None = None) -> int:
    """Run the chosen scenarios and print one JSON line per scenario, then a table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenario", choices=[*SCENARIOS, "all"], default="all")
    parser.add_argument("--steady-seconds", type=float, default=60.0)
    parser.add_argument("--baseline", action=argparse.BooleanOptionalAction, default=True,
                        help="time the same children created without the operator first (baseline_seconds)")
    parser.add_argument("--kubeconfig", help="use this running cluster instead of starting one")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    args = parser.parse_args(argv)
    names = list(ALL) if args.scenario == "all" else [args.scenario]
    log_dir = Path(tempfile.mkdtemp(prefix="rlightning-operator-bench-"))
    if args.kubeconfig:
        cluster: _GivenCluster | devcluster.Cluster = _GivenCluster(args.kubeconfig)
        owned = None
    else:
        cluster = owned = devcluster.launch()
    try:
        _install_crd(cluster.kubeconfig)
        results = []
        for name in names:
            groups, evaluators = SCENARIOS[name]
            api = kubernetes.config.new_client_from_config(config_file=str(cluster.kubeconfig))
            _ensure_nodes(api, groups * (evaluators + 1))
            api.close()
            running, baseline = run_baseline(cluster, name) if args.baseline else (None, None)
            if baseline is not None:
                print(f"{name}: baseline {baseline:.1f} s ({running:.1f} s to pods Running)", file=sys.stderr,
                      flush=True)
            result = run_scenario(cluster, name, args.steady_seconds, log_dir)
            result["baseline_seconds"] = None if baseline is None else round(baseline, 1)
            result["baseline_pods_running_seconds"] = None if running is None else round(running, 1)
            print(json.dumps(result), flush=True)
            results.append(result)
    finally:
        if owned is not None:
            owned.stop()
    print(yaml.safe_dump(results, sort_keys=False))
    print(f"operator logs: {log_dir}")
    if args.record:
        print(f"recorded: {_record.append_row(figures(results))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
