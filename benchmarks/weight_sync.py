"""Benchmark of weight sync: relayed bucketed publish vs naive per-tensor broadcast vs plain TCP streams.

For each model size (float32 parameters) and receiver count, on this machine over 127.0.0.1:
  (a) `WeightSender.publish` (bucketed, relayed along the tree of `--fanout`, acknowledged);
  (b) a naive broadcast of one tensor at a time over one gloo group of the sender and every receiver (what
      many RL stacks do);
  (c) a plain TCP stream of the same bytes from the sender to every receiver (one socket each, concurrently);
plus, for (a), the bytes the sender process put on the wire in one publish (counted: the `bytes_acked` of its
TCP sockets, from `ss -tinp`, before and after), and the peak tensor storage the sender (publish) and a receiver
(from one version's return to the next's) held above what they held before (counted by torch's profiler,
`tests/weights/wsync_helpers.py`).

Then it fits one hop, t = a + bytes / bw, to the 1-receiver publishes of the sizes measured (least squares,
as torchtitan's transport benchmark does) and projects a publish to 100 and 1,000 evaluators in one relay
tree: every relay sends `fanout` copies and the pipeline fills over the tree's depth in transfers of at most
32 MiB, t(n) = depth * a + fanout * (bytes + (depth - 1) * transfer) / bw, for machines whose evaluators each
have their own cores and network (here all processes share the CPUs: read the curve's shape, not its level).

Usage:
    python benchmarks/weight_sync.py                                   # 1M,10M x 1,2,4,8,16 receivers
    python benchmarks/weight_sync.py --sizes 10M,100M --receivers 1,8 --json rows.json
    python benchmarks/weight_sync.py --sizes 100M --receivers 1,4 --in-place    # receivers as bufferStrategy none

`--json FILE` writes one object per row: params, receivers, bucketed_seconds, naive_seconds, tcp_seconds,
model_bytes, sender_egress_bytes, sender_peak_extra_bytes, receiver_peak_extra_bytes. GB/s is payload bytes
per receiver per second (1 GB = 1e9 bytes). The naive and TCP parts use benchmark-only keys on the sender's store.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightSender
from rlightning.weights._buckets import TRANSFER_MAX_BYTES, BucketLayout
from rlightning.weights._topology import relay_tree
from rlightning.weights._transport import BroadcastGroup

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for tests._ports
from tests._ports import BENCH_WEIGHT_SYNC
from tests.weights.wsync_helpers import peak_tensor_bytes

HOST = "127.0.0.1"
TENSOR_NUMEL = 262_144  # 1 MB float32 tensors, plus a 1024-element bias after each
NAIVE_KEY, TCP_KEY, PROFILE_KEY = "bench/naive", "bench/tcp", "bench/profile"
ROUND_ACK, PEAK = "bench/ack/{kind}/{round}/{ordinal}", "bench/peak/{ordinal}"
JSON_KEYS = (
    "params", "receivers", "bucketed_seconds", "naive_seconds", "tcp_seconds", "model_bytes",
    "sender_egress_bytes", "sender_peak_extra_bytes", "receiver_peak_extra_bytes",
)


def parse_size(text: str) -> int:
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6, "G": 10**9}.get(text[-1], 1)
    return int(float(text.rstrip("KMG")) * scale)


def make_state(numel: int) -> dict[str, torch.Tensor]:
    """About `numel` float32 parameters: 1 MB weights with small biases, like a stack of layers."""
    state: dict[str, torch.Tensor] = {}
    i = 0
    left = numel
    while left > 0:
        n = min(TENSOR_NUMEL, left)
        state[f"layer{i}.weight"] = torch.randn(n)
        left -= n
        if left > 0:
            b = min(1024, left)
            state[f"layer{i}.bias"] = torch.randn(b)
            left -= b
        i += 1
    return state


def tcp_bytes_acked(pid: int) -> int:
    """Bytes acknowledged by the peers of every TCP socket process `pid` holds now (`ss -tinp`)."""
    out = subprocess.run(["ss", "-tinpH"], capture_output=True, text=True, check=True).stdout
    total, mine = 0, False
    for line in out.splitlines():
        if not line.startswith(("\t", " ")):  # a socket line; its details follow on the next line
            mine = f"pid={pid}," in line
        elif mine:
            found = re.search(r"bytes_acked:(\d+)", line)
            total += int(found.group(1)) if found else 0
    return total


def config(args: argparse.Namespace, receivers: int) -> WeightSyncConfig:
    return WeightSyncConfig(
        backend="gloo", bucket_size_bytes=args.bucket_bytes, group_size=args.group_size or max(receivers, 1),
        relay_fanout=args.fanout, timeout_seconds=args.timeout,
    )


# -- receiver process ---------------------------------------------------------------------------------
class InPlace:
    """The weights received first, as a policy's own tensors that later versions are received into (`--in-place`:
    what an evaluator with `bufferStrategy: none` does; nothing rolls out here, so nothing pauses).
    """

    def __init__(self, tensors: Mapping[str, torch.Tensor]) -> None:
        self.tensors = tensors

    def receive_targets(self) -> Mapping[str, torch.Tensor]:
        return self.tensors

    def begin_weight_receive(self, timeout: float) -> bool:
        return True

    def end_weight_receive(self, version: int | None) -> None:
        if version is None:
            raise SystemExit("a receive in place stopped part way")


def run_receiver(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    receiver = WeightReceiver(config(args, args.n), HOST, args.port, args.ordinal)
    state: Mapping[str, torch.Tensor] = {}
    done = set()

    def into() -> InPlace | None:
        return InPlace(state) if args.in_place and state else None

    while not receiver.sender_closed:
        store = receiver._store  # benchmark only: its keys share the sender's store
        if (
            store is not None and "profile" not in done and store.check([PROFILE_KEY])
            and receiver.version == int(store.get(PROFILE_KEY)) - 1
        ):  # from the last version's return to the next's: the page-in of the next buckets included
            done.add("profile")
            received: list = []

            def until_next(out: list = received) -> None:
                while not out[-1:] and not receiver.sender_closed:
                    got = receiver.receive(timeout=0.2, into=into())
                    if got is not None:
                        out.append(got)

            peak = peak_tensor_bytes(until_next)
            store.set(PEAK.format(ordinal=args.ordinal), str(peak))
            got = received[0] if received else None
        else:
            got = receiver.receive(timeout=0.2, into=into())
        if got is not None:
            state = got[1]
        store = receiver._store
        if store is None or receiver.sender_closed:
            continue
        if "naive" not in done and store.check([NAIVE_KEY]):
            done.add("naive")
            rank, size = args.ordinal + 1, args.n + 1
            group = BroadcastGroup(store.clone(), NAIVE_KEY + "/pg/", rank, size, args.timeout, "gloo", HOST)
            for r in range(int(store.get(NAIVE_KEY))):
                for t in state.values():
                    group.wait_work(group.broadcast(torch.empty_like(t)))
                store.set(ROUND_ACK.format(kind="naive", round=r, ordinal=args.ordinal), "1")
            group.close()
        if "tcp" not in done and store.check([TCP_KEY]):
            done.add("tcp")
            rounds, nbytes, tcp_port = json.loads(store.get(TCP_KEY))
            buf = torch.empty(nbytes, dtype=torch.uint8)
            view = buf.numpy().data
            with socket.create_connection((HOST, tcp_port)) as conn:
                for _ in range(rounds):
                    got_bytes = 0
                    while got_bytes < nbytes:
                        got_bytes += conn.recv_into(view[got_bytes:], nbytes - got_bytes)
                    conn.sendall(b"k")
    receiver.close()


# -- sender side ----------------------------------------------------------------------------------------
def wait_acks(store: torch.distributed.Store, kind: str, rnd: int, n: int, timeout: float) -> None:
    keys = [ROUND_ACK.format(kind=kind, round=rnd, ordinal=o) for o in range(n)]
    store.wait(keys, datetime.timedelta(seconds=timeout))


def run_case(numel: int, n: int, port: int, args: argparse.Namespace) -> dict:
    state = make_state(numel)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    cmd = [sys.executable, __file__, "--role", "receiver", "--port", str(port), "--n", str(n), "--bucket-bytes",
           str(args.bucket_bytes), "--timeout", str(args.timeout), "--group-size", str(args.group_size),
           "--fanout", str(args.fanout), *(["--in-place"] if args.in_place else [])]
    procs = [subprocess.Popen([*cmd, "--ordinal", str(o)]) for o in range(n)]
    sender = WeightSender(config(args, n), HOST, port)
    row: dict = {"params": numel, "receivers": n, "model_bytes": nbytes}
    try:
        deadline = time.monotonic() + 300
        while len(sender.members) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("receivers did not register")
            time.sleep(0.1)
        sender.publish(state)  # first publish: forms the trees, allocates the staging buffers
        times, egress = [], []
        store = sender._store  # benchmark only
        for i in range(args.syncs):
            if i == args.syncs - 1:  # receivers profile from the return of this version to the next
                store.set(PROFILE_KEY, str(sender.version + 2))
            time.sleep(args.gap)
            before = tcp_bytes_acked(os.getpid())
            t0 = time.perf_counter()
            sender.publish(state)
            times.append(time.perf_counter() - t0)
            time.sleep(0.05)  # the last bytes' acknowledgements
            egress.append(tcp_bytes_acked(os.getpid()) - before)
        row["bucketed_seconds"] = min(times)
        row["bucketed_all_seconds"] = times
        row["sender_egress_bytes"] = max(egress)
        time.sleep(args.gap)
        row["sender_peak_extra_bytes"] = peak_tensor_bytes(lambda: sender.publish(state))
        peaks = [PEAK.format(ordinal=o) for o in range(n)]
        store.wait(peaks, datetime.timedelta(seconds=args.timeout))
        row["receiver_peak_extra_bytes"] = max(int(store.get(key)) for key in peaks)
        layout = BucketLayout.from_state(state, args.bucket_bytes)
        row["buckets"] = len(layout.buckets)
        order = [slot.name for bucket in layout.buckets for slot in bucket.slots]  # the receivers' order

        # (b) naive: one tensor at a time over one gloo group of everyone
        store.set(NAIVE_KEY, str(args.syncs))
        group = BroadcastGroup(store.clone(), NAIVE_KEY + "/pg/", 0, n + 1, args.timeout, "gloo", HOST)
        times = []
        for r in range(args.syncs):
            time.sleep(args.gap)
            t0 = time.perf_counter()
            for name in order:
                group.wait_work(group.broadcast(state[name]))
            wait_acks(store, "naive", r, n, args.timeout)
            times.append(time.perf_counter() - t0)
        group.close()
        row["naive_seconds"] = min(times)

        # (c) plain TCP: the same bytes (a contiguous copy, as a stream sends them) to every receiver concurrently
        flat = torch.cat([t.reshape(-1) for t in state.values()]).view(torch.uint8)
        payload = flat.numpy().data
        with socket.create_server((HOST, port + 1)) as server:
            store.set(TCP_KEY, json.dumps([args.syncs, nbytes, port + 1]))
            conns = [server.accept()[0] for _ in range(n)]
            times = []
            for _ in range(args.syncs):
                time.sleep(args.gap)
                t0 = time.perf_counter()
                threads = [threading.Thread(target=c.sendall, args=(payload,)) for c in conns]
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
                for c in conns:
                    assert c.recv(1) == b"k"
                times.append(time.perf_counter() - t0)
            for c in conns:
                c.close()
        row["tcp_seconds"] = min(times)
    finally:
        sender.close()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return row


def print_header(args: argparse.Namespace) -> None:
    receive = "in place" if args.in_place else "staged"
    print(f"bucket bound {args.bucket_bytes / 2**20:.0f} MiB, relay fan-out {args.fanout}, receivers {receive}; "
          f"seconds per sync (best "
          f"of {args.syncs}); GB/s per receiver; egress: sender bytes sent / model bytes; peaks in MiB")
    head = (
        f"{'params':>7} {'recv':>4} {'MB':>6} | {'bucketed s':>10} {'GB/s':>6} | {'naive s':>8} | {'tcp s':>7} | "
        f"{'bkt/tcp':>7} {'bkt/naive':>9} | {'egress':>6} | {'snd peak':>8} {'rcv peak':>8}"
    )
    print(head)
    print("-" * len(head), flush=True)


def print_row(r: dict) -> None:
    mib = 2**20
    cells = [
        f"{r['params'] / 1e6:>6g}M {r['receivers']:>4} {r['model_bytes'] / mib:>6.0f}",
        f"{r['bucketed_seconds']:>10.4f} {r['model_bytes'] / r['bucketed_seconds'] / 1e9:>6.2f}",
        f"{r['naive_seconds']:>8.4f}",
        f"{r['tcp_seconds']:>7.4f}",
        f"{r['tcp_seconds'] / r['bucketed_seconds']:>7.2f} {r['naive_seconds'] / r['bucketed_seconds']:>9.2f}",
        f"{r['sender_egress_bytes'] / r['model_bytes']:>6.2f}",
        f"{r['sender_peak_extra_bytes'] / mib:>8.1f} {r['receiver_peak_extra_bytes'] / mib:>8.1f}",
    ]
    print(" | ".join(cells), flush=True)


def fit_hop(rows: list[dict]) -> tuple[float, float] | None:
    """Least-squares fit of t = a + bytes / bw to the 1-receiver publishes; None without two sizes."""
    points = [(r["model_bytes"], r["bucketed_seconds"]) for r in rows if r["receivers"] == 1]
    if len({x for x, _ in points}) < 2:
        return None
    mx = sum(x for x, _ in points) / len(points)
    my = sum(y for _, y in points) / len(points)
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, 1 / slope


def projected_seconds(a: float, bw: float, nbytes: int, evaluators: int, fanout: int) -> float:
    """Publish time to `evaluators` in one relay tree of `fanout` (see the module docstring)."""
    depth = max(p.depth for p in relay_tree(list(range(evaluators)), fanout).values())
    transfer = min(TRANSFER_MAX_BYTES, nbytes)
    return depth * a + fanout * (nbytes + (depth - 1) * transfer) / bw


def print_projection(rows: list[dict], fanout: int) -> None:
    fit = fit_hop(rows)
    if fit is None:
        print("projection: needs 1-receiver rows of two sizes")
        return
    a, bw = fit
    print(f"one hop: t = {a * 1e3:.2f} ms + bytes / {bw / 1e9:.2f} GB/s (fit to the 1-receiver rows)")
    for nbytes in sorted({r["model_bytes"] for r in rows} | {400_000_000}):
        cells = [f"{n} evaluators {projected_seconds(a, bw, nbytes, n, fanout):.3f} s" for n in (100, 1000)]
        print(f"projected, {nbytes / 1e6:.0f} MB, fan-out {fanout}: " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,10M", help="float32 parameter counts, e.g. 1M,10M")
    parser.add_argument("--receivers", default="1,2,4,8,16", help="receiver counts, e.g. 1,2")
    parser.add_argument("--syncs", type=int, default=3, help="timed syncs per method (best is reported)")
    parser.add_argument(
        "--gap", type=float, default=1.0,
        help="seconds between timed syncs (a training iteration; receivers page in their next buckets meanwhile)",
    )
    parser.add_argument("--group-size", type=int, default=0, help="receivers per relay tree; 0: one tree (default)")
    parser.add_argument("--fanout", type=int, default=WeightSyncConfig().relay_fanout, help="relay fan-out")
    parser.add_argument("--bucket-bytes", type=int, default=WeightSyncConfig().bucket_size_bytes)
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--json", type=Path, default=None, help="write the rows as a JSON list to this file")
    parser.add_argument(
        "--in-place", action="store_true",
        help="receivers receive each version into the weights they hold (bufferStrategy none), not a fresh copy",
    )
    parser.add_argument(
        "--port", type=int, default=BENCH_WEIGHT_SYNC.first,
        help="first port; each case uses two from here on (default: block BENCH_WEIGHT_SYNC of tests/_ports.py)",
    )
    parser.add_argument("--role", default="sender", choices=["sender", "case", "receiver"], help=argparse.SUPPRESS)
    parser.add_argument("--ordinal", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.role == "receiver":
        run_receiver(args)
        return
    torch.set_num_threads(1)
    if args.role == "case":  # one case per process, so memory figures do not inherit an earlier case's heap
        print("ROW " + json.dumps(run_case(parse_size(args.sizes), args.n, args.port, args)), flush=True)
        return
    port, rows = args.port, []
    print_header(args)  # once; each row follows as its case finishes
    for size in args.sizes.split(","):
        for n in (int(x) for x in args.receivers.split(",")):
            cmd = [sys.executable, __file__, "--role", "case", "--sizes", size, "--n", str(n), "--port", str(port),
                   "--syncs", str(args.syncs), "--gap", str(args.gap), "--bucket-bytes", str(args.bucket_bytes),
                   "--group-size", str(args.group_size), "--fanout", str(args.fanout), "--timeout", str(args.timeout),
                   *(["--in-place"] if args.in_place else [])]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
            rows.append(json.loads(next(line for line in out.splitlines() if line.startswith("ROW "))[4:]))
            print_row(rows[-1])
            port += 2
    print_projection(rows, args.fanout)
    if args.json is not None:
        args.json.write_text(json.dumps([{k: r[k] for k in JSON_KEYS} for r in rows], indent=1) + "\n")


if __name__ == "__main__":
    main()
