"""Benchmark of weight sync to capped evaluator pods on the real node: publish seconds at 1 and N evaluators.

A PolicyGroup whose trainer and evaluator pods carry the bandwidth annotations `kubernetes.io/ingress-bandwidth` and
`kubernetes.io/egress-bandwidth` (`--rate-mbit` each, put on the pods as a user would, through `spec.train.template`
and `spec.eval.template`) runs on devcluster's real node, whose CNI chains the `bandwidth` plugin
(devcluster/_nodeconfig.py). The policy is PPO whose actor and critic have `--layers` hidden layers of `--hidden`
units (19 of 512: 9.5M float32 parameters, 38 MB, in weights of 1 MiB, so with `--bucket-bytes` 1 MiB every transfer
is at most 1 MiB and pipelines through the tree as in benchmarks/weight_sync.py; a tensor larger than the bucket is
one transfer of up to 32 MiB, which a relay receives whole before forwarding: `--layers 2 --hidden 2236` has two of
20 MB); the trainer publishes after every update, down the relay trees (`weightSync.relayTrees`, `--trees`: one, or
two that split the transfers) of `weightSync.relayFanout` (one or more of `--fanouts`), and writes each
publish's seconds (`sync_seconds`) and the evaluators it reached (`evaluators`) to its metrics.jsonl, on a local
volume (`spec.train.checkpoint.persistentVolumeClaim`) that this script reads from the host.

The burst: containerd passes the plugin every annotated rate with a burst of 2^32 - 1 bits (`toCNIBandWidth` in its
CRI plugin), which the plugin's tbf holds as about 256 MiB (261,993,004 bytes seen), so a pod moves its first
~256 MiB at line rate and its bucket refills at the rate while it idles: a trainer that publishes 40 MB and then
trains would see its publishes shortened by its idle time, differently for each pod. The CNI configuration cannot
set a smaller burst for annotated pods: the plugin uses a static `ingressBurst`/`egressBurst` only with static rates,
for every pod, in place of the annotations (containernetworking/plugins, plugins/meta/bandwidth, `getBandwidth`). So
this script changes every tbf qdisc at the annotated rate on the host (the host end of a pod's veth: what the pod
receives; its ifb device: what it sends) to the burst of benchmarks/weight_sync.py's capped links
(`tests._netns.tbf_burst_bytes`: 16 KiB at 100M), keeping the plugin's rate and queue, as soon as it appears. A
user's cluster keeps containerd's burst. Publishes count from the first row written after all of the group's
qdiscs were changed, less `--warmup` (the one that may have begun before the change); the median of the next
`--publishes` is reported, and its ratio to the first evaluator count's (measured in the same run), with `link s`:
the model's bytes at the rate.

Needs root (the real node). Starts its own control plane (the port block of `RLIGHTNING_DEVCLUSTER_SLOT`), the real
node and the operator, and stops them, undoing the host changes, on exit (also on Ctrl-C and SIGTERM). A fleet of
one receiver is the same tree at every fan-out, so 1 evaluator is measured once, at the first fan-out.

Usage:
    python benchmarks/capped_pods.py                                  # 1 and 8 evaluators, fan-out 2, 100M
    python benchmarks/capped_pods.py --evaluators 1,8 --fanouts 2,1 --json rows.json
    python benchmarks/capped_pods.py --layers 2 --hidden 2236                # two 20 MB weight matrices
    python benchmarks/capped_pods.py --trees 2                               # two relay trees

`--json FILE` rows: fanout, trees, evaluators, seconds (median), all_seconds (the publishes taken), model_bytes,
link_seconds, rate_bps, bucket_bytes, hidden_sizes, sync_failures (during the run), loadavg (1 minute, when the row
finished). `--record` appends the rows' medians to docs/measurements.md as one row (`figures`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.append(str(REPO))  # the repository root, for tests.*

import devcluster  # noqa: E402
from benchmarks import _record  # noqa: E402
from rlightning.config import WeightSyncConfig  # noqa: E402
from tests import _netns  # noqa: E402
from tests.operator.operator_cluster import OperatorProcess, apply, get_json, install_crd  # noqa: E402
from tests.realpods import realpods_helpers  # noqa: E402

CLAIM = "capped-run"
"""The trainer's run directory (checkpoint claim) of every case; a fresh local volume each."""
CASE_SECONDS = 900.0
"""Bound for one case from apply to its last publish (pods start in about a minute on 2 busy cores)."""
POLL_SECONDS = 0.5
"""Between looks at the qdiscs and metrics.jsonl: well under one capped publish (3.2 s for 40 MB at 100M)."""
ROLLOUT_STEPS = 16
"""Steps of one evaluator batch (of one env copy): a few forward passes of the MLP per publish and evaluator."""
BANDWIDTH_ANNOTATIONS = ("kubernetes.io/ingress-bandwidth", "kubernetes.io/egress-bandwidth")


def manifest(name: str, evaluators: int, fanout: int, args: argparse.Namespace) -> dict:
    """The benchmark's PolicyGroup: examples/cartpole.yaml on the real node with capped pods and a large MLP.

    Args:
        name (str): metadata.name.
        evaluators (int): spec.eval.replicas.
        fanout (int): spec.weightSync.relayFanout.
        args (argparse.Namespace): The command line (hidden, layers, rate_mbit, bucket_bytes, trees).

    Returns:
        dict: The manifest. One trainer rank that learns from one batch of every evaluator per update, one update
        epoch of one minibatch (training is not what is timed); small batches of one env copy and no evaluation
        episodes, so the evaluators' forward passes of the large MLP leave the CPUs to the relays; a step budget it
        never reaches (the case ends by deleting the group).
    """
    capped = {"metadata": {"annotations": {key: f"{args.rate_mbit}M" for key in BANDWIDTH_ANNOTATIONS}}}
    return realpods_helpers.real_cartpole(name, **{
        "spec.policy.policyKwargs.hiddenSizes": [args.hidden] * args.layers,
        "spec.policy.policyKwargs.updateEpochs": 1,
        "spec.env.numEnvs": 1,
        "spec.train.procsPerNode": 1,
        "spec.train.rolloutSteps": ROLLOUT_STEPS,
        "spec.train.batchesPerUpdate": evaluators,
        "spec.train.totalEnvSteps": 10**9,
        "spec.train.targetEvalReturn": None,
        "spec.train.checkpoint": {"persistentVolumeClaim": CLAIM, "intervalIterations": 10**6},
        "spec.train.template": capped,
        "spec.eval.replicas": evaluators,
        "spec.eval.evaluationIntervalSeconds": 3600,
        "spec.eval.template": capped,
        "spec.weightSync.relayFanout": fanout,
        "spec.weightSync.relayTrees": args.trees,
        "spec.weightSync.bucketSizeBytes": args.bucket_bytes,
    })  # fmt: skip


def capped_qdiscs(rate_bps: int) -> list[dict]:
    """The host's tbf qdiscs at `rate_bps` (`tc -j qdisc show`: rate in bytes/s, burst in bytes)."""
    shown = subprocess.run(["tc", "-j", "qdisc", "show"], check=True, capture_output=True, text=True).stdout
    return [q for q in json.loads(shown) if q["kind"] == "tbf" and q["options"]["rate"] * 8 == rate_bps]


def tune_bursts(rate_bps: int, burst: int) -> tuple[int, int]:
    """Give every tbf qdisc at `rate_bps` on the host the burst `burst` (bytes), keeping its rate and queue.

    The queue (tbf's limit: the bytes that may wait) stays the plugin's, rate x 25 ms + its burst: the egress qdisc
    sits on an ifb device behind the pod's veth, where the pod's TCP sees no backpressure, so a short queue there drops
    whole bursts of segments (10% of a relay's packets in a trial with a queue of 20 ms) and stalls its streams.

    Args:
        rate_bps (int): The annotated rate, bits per second.
        burst (int): The bucket, bytes (tc stores it in timer ticks: it reads back a few bytes off).

    Returns:
        tuple[int, int]: The qdiscs at that rate, and how many of them now hold about `burst` (a pod that went away
        meanwhile is left out the next time).
    """
    for qdisc in capped_qdiscs(rate_bps):
        options = qdisc["options"]
        if options["burst"] > 2 * burst:
            # tc shows the queue as the latency it adds past the burst: lat (us) = (limit - burst) / rate.
            limit = options["lat"] * options["rate"] // 10**6 + options["burst"]
            subprocess.run(
                ["tc", "qdisc", "change", "dev", qdisc["dev"], "root", "tbf", "rate", f"{rate_bps}bit",
                 "burst", str(burst), "limit", str(limit)],
                check=False, capture_output=True,
            )  # fmt: skip
    after = capped_qdiscs(rate_bps)
    return len(after), sum(q["options"]["burst"] <= 2 * burst for q in after)


def metrics_rows(run_dir: Path) -> list[dict]:
    """The rows of the trainer's metrics.jsonl so far (a line still being written is left out)."""
    path = run_dir / "metrics.jsonl"
    rows = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return rows


def measure(
    cluster: devcluster.Cluster, namespace: str, run_dir: Path, evaluators: int, fanout: int, args: argparse.Namespace
) -> dict:
    """Apply one case, take its publishes once every pod's qdiscs are changed, and return its row."""
    rate_bps, burst = args.rate_mbit * 10**6, _netns.tbf_burst_bytes(args.rate_mbit * 10**6)
    name = f"capped-t{args.trees}-f{fanout}-e{evaluators}"
    apply(cluster, namespace, manifest(name, evaluators, fanout, args))
    pods = 1 + evaluators
    first_row: int | None = None  # rows written before every pod was capped as measured are not counted
    deadline = time.monotonic() + CASE_SECONDS
    while True:
        found, tuned = tune_bursts(rate_bps, burst)
        rows = metrics_rows(run_dir)
        if first_row is None and found == tuned == 2 * pods:
            first_row = len(rows)
        counted = rows[len(rows) if first_row is None else first_row :]
        taken = [r for r in counted if len(r["evaluators"]) == evaluators]
        if len(taken) >= args.warmup + args.publishes:
            break
        phase = (get_json(cluster, "pg", name, "-n", namespace).get("status") or {}).get("phase", "")
        if phase in {"Failed", "Invalid", "Succeeded"} or time.monotonic() > deadline:
            raise SystemExit(f"{name}: {phase or 'no phase'} after {len(rows)} rows, {len(taken)} with the whole "
                             f"fleet; {tuned} of {found} qdiscs at the rate changed (want {2 * pods})")
        time.sleep(POLL_SECONDS)
    timed = taken[args.warmup : args.warmup + args.publishes]
    seconds = [r["sync_seconds"] for r in timed]
    return {
        "fanout": fanout,
        "trees": args.trees,
        "evaluators": evaluators,
        "seconds": statistics.median(seconds),
        "all_seconds": seconds,
        "model_bytes": timed[-1]["sync_bytes"],
        "link_seconds": timed[-1]["sync_bytes"] * 8 / rate_bps,
        "rate_bps": rate_bps,
        "bucket_bytes": args.bucket_bytes,
        "hidden_sizes": [args.hidden] * args.layers,
        "sync_failures": rows[-1]["sync_failures"],
        "loadavg": round(os.getloadavg()[0], 2),
    }


def print_row(row: dict, base: dict) -> None:
    """Print one row: publish seconds (median), its ratio to `base`'s and to the link's time for the model."""
    ratio = row["seconds"] / base["seconds"]
    taken = ", ".join(f"{s:.2f}" for s in row["all_seconds"])
    print(f"{row['fanout']:>6} {row['evaluators']:>10} {row['seconds']:>10.3f} {ratio:>6.2f} "
          f"{row['link_seconds']:>7.2f} {row['seconds'] / row['link_seconds']:>7.2f} {row['sync_failures']:>8} "
          f"{row['loadavg']:>5.1f}   {taken}", flush=True)  # fmt: skip


def figures(rows: list[dict]) -> str:
    """The rows as one line for docs/measurements.md: each case's median publish and its ratio to the first row's.

    Args:
        rows (list[dict]): `run_cases`' rows, the first the ratios' base.

    Returns:
        str: e.g. ``38.0 MB at 100 Mbit/s, 1 tree(s): fan-out 2 x1 3.176 s (1.05 of the link), fan-out 2 x8 4.655 s
        (1.47x); 0 sync failures``.
    """
    first = rows[0]
    cells = [f"fan-out {r['fanout']} x{r['evaluators']} {r['seconds']:.3f} s"
             + (f" ({r['seconds'] / first['seconds']:.2f}x)" if r is not first
                else f" ({r['seconds'] / r['link_seconds']:.2f} of the link)") for r in rows]
    return (f"{first['model_bytes'] / 1e6:.1f} MB at {first['rate_bps'] / 1e6:g} Mbit/s, {first['trees']} tree(s): "
            f"{', '.join(cells)}; {sum(r['sync_failures'] for r in rows)} sync failures")


def parse_args() -> argparse.Namespace:
    """The command line (see the module docstring); a bad value, or no root, exits 2 with argparse's message."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--evaluators", default="1,8", help="evaluator counts; the first is the ratios' base")
    parser.add_argument("--fanouts", default="2", help="weightSync.relayFanout values, e.g. 2,1")
    parser.add_argument(
        "--trees", type=int, choices=(1, 2), default=WeightSyncConfig().relay_trees, help="weightSync.relayTrees"
    )
    parser.add_argument("--rate-mbit", type=int, default=100, help="both annotations, Mbit/s (quantity NNNM)")
    parser.add_argument("--hidden", type=int, default=512, help="units of each hidden layer of the two MLPs")
    parser.add_argument("--layers", type=int, default=19, help="hidden layers of each MLP")
    parser.add_argument("--bucket-bytes", type=int, default=1 << 20, help="weightSync.bucketSizeBytes")
    parser.add_argument("--warmup", type=int, default=1, help="publishes left out after the qdiscs are changed")
    parser.add_argument("--publishes", type=int, default=3, help="publishes timed (the median is reported)")
    parser.add_argument("--json", type=Path, default=None, help="write the rows as a JSON list to this file")
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    args = parser.parse_args()
    try:
        args.counts = [int(n) for n in args.evaluators.split(",")]
        args.fanout_list = [int(k) for k in args.fanouts.split(",")]
    except ValueError:
        parser.error("--evaluators and --fanouts take comma-separated integers, e.g. 1,8")
    if min(args.counts) < 1 or min(args.fanout_list) < 1:
        parser.error("evaluator counts and fan-outs must be at least 1")
    if min(args.rate_mbit, args.hidden, args.layers, args.publishes) < 1 or args.warmup < 0 or args.bucket_bytes < 1024:
        parser.error("--rate-mbit, --hidden, --layers and --publishes must be >= 1, --warmup >= 0, "
                     "--bucket-bytes >= 1024")
    if os.geteuid() != 0:
        parser.error("needs root: it starts the real node (containerd, kubelet) and changes its tbf qdiscs")
    return args


def run_cases(
    cluster: devcluster.Cluster, node: devcluster.RealNode, args: argparse.Namespace, log_dir: Path
) -> list[dict]:
    """Serve a fresh namespace with the operator and measure every case in it, printing each row; remove it after."""
    cases = [(k, n) for n in args.counts for k in (args.fanout_list[:1] if n == 1 else args.fanout_list)]
    namespace = f"bench-{uuid.uuid4().hex[:8]}"
    install_crd(cluster)
    cluster.kubectl("create", "namespace", namespace)
    operator = OperatorProcess(cluster, namespace, log_dir / "operator.log")
    rows: list[dict] = []
    try:
        operator.start()
        burst = _netns.tbf_burst_bytes(args.rate_mbit * 10**6)
        print(f"{args.rate_mbit}M both ways on every pod, tbf burst {burst} B, {args.layers} hidden layers of "
              f"{args.hidden}, {args.bucket_bytes} B buckets, {args.trees} relay tree(s); "
              f"median of {args.publishes} publishes after {args.warmup}, load average {os.getloadavg()[0]:.1f}")
        print(f"{'fanout':>6} {'evaluators':>10} {'publish s':>10} {'x base':>6} {'link s':>7} {'x link':>7} "
              f"{'failures':>8} {'load':>5}   publishes s")  # fmt: skip
        for fanout, count in cases:
            with realpods_helpers.local_claim(cluster, node, namespace, CLAIM) as run_dir:
                rows.append(measure(cluster, namespace, run_dir, count, fanout, args))
            print_row(rows[-1], rows[0])
    finally:
        operator.stop()
        cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=120s", check=False)
    return rows


def main() -> int:
    """Run the benchmark: one PolicyGroup per (fan-out, evaluator count); 0 once every row is printed."""
    args = parse_args()
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # clean up as on Ctrl-C
    cluster = devcluster.launch()
    try:
        node = devcluster.RealNode(cluster).start()
        try:
            with tempfile.TemporaryDirectory(prefix="capped-pods-") as tmp:
                rows = run_cases(cluster, node, args, Path(tmp))
        finally:
            node.stop()
    finally:
        cluster.stop()
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=2))
    if args.record:
        print(f"recorded: {_record.append_row(figures(rows))}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
