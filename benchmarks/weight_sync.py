"""Benchmark of weight sync: bucketed broadcast vs naive per-tensor broadcast vs a plain TCP stream.

For each model size (float32 parameters) and receiver count, on this machine over 127.0.0.1:
  (a) `WeightSender.publish` (bucketed, acknowledged);
  (b) a naive broadcast of one tensor at a time over the same gloo group (what many RL stacks do);
  (c) a plain TCP stream of the same bytes to every receiver (one socket each, sent concurrently), the
      loopback ceiling measured in the same run;
plus the sender's resident-memory high-water mark during a publish (VmHWM from /proc/self/status, reset
through /proc/self/clear_refs) against the model size and two buckets.

Syncs are `--gap` seconds apart, as between training iterations. Receivers run as local processes.

Usage:
    python benchmarks/weight_sync.py                      # full table: 1M,10M,100M x 1,2,4 receivers
    python benchmarks/weight_sync.py --sizes 1M,10M --receivers 1,2 --syncs 3

GB/s is payload bytes per receiver per second (1 GB = 1e9 bytes). On a small machine the receivers compete
with the sender for CPU: read the ratios, not the absolute figures.
The naive and TCP parts reach into the sender's and receiver's private group to share it (benchmark only).
"""

from __future__ import annotations

import argparse
import datetime
import json
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightSender
from rlightning.weights._buckets import BucketLayout

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for tests._ports
from tests._ports import BENCH_WEIGHT_SYNC

HOST = "127.0.0.1"
TENSOR_NUMEL = 262_144  # 1 MB float32 tensors, plus a 1024-element bias after each
NAIVE_KEY, TCP_KEY, ROUND_ACK = "bench/naive", "bench/tcp", "bench/ack/{kind}/{round}/{ordinal}"


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


def rss_kib() -> tuple[int, int]:
    """(VmRSS, VmHWM) of this process in KiB."""
    fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return int(fields["VmRSS"].split()[0]), int(fields["VmHWM"].split()[0])


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def config(args: argparse.Namespace, receivers: int) -> WeightSyncConfig:
    group_size = args.group_size or max(receivers, 1)
    return WeightSyncConfig(
        backend="gloo", bucket_size_bytes=args.bucket_bytes, group_size=group_size, timeout_seconds=args.timeout
    )


# -- receiver process ---------------------------------------------------------------------------------
def run_receiver(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    receiver = WeightReceiver(config(args, args.n), HOST, args.port, args.ordinal)
    state: dict[str, torch.Tensor] = {}
    done = set()
    while not receiver.sender_closed:
        got = receiver.receive(timeout=0.2)
        if got is not None:
            state = got[1]
        store = receiver._store
        if store is None or receiver.sender_closed:
            continue
        transport = receiver._transport
        if "naive" not in done and transport is not None and store.check([NAIVE_KEY]):
            done.add("naive")
            for r in range(int(store.get(NAIVE_KEY))):
                for t in state.values():
                    out = torch.empty_like(t)
                    transport.wait_work(transport.broadcast(out))
                store.set(ROUND_ACK.format(kind="naive", round=r, ordinal=args.ordinal), "1")
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
           str(args.bucket_bytes), "--timeout", str(args.timeout), "--group-size", str(args.group_size)]
    procs = [subprocess.Popen([*cmd, "--ordinal", str(o)]) for o in range(n)]
    sender = WeightSender(config(args, n), HOST, port)
    row: dict = {"params": numel, "receivers": n, "bytes": nbytes}
    try:
        deadline = time.monotonic() + 120
        while len(sender.members) < n:
            if time.monotonic() > deadline:
                raise TimeoutError("receivers did not register")
            time.sleep(0.1)
            sender.reports()
        rss0, _ = rss_kib()
        reset_peak()
        sender.publish(state)  # first publish: forms the group, allocates the staging buckets
        _, peak_first = rss_kib()
        times, deltas = [], []
        for _ in range(args.syncs):
            time.sleep(args.gap)
            before, _ = rss_kib()
            reset_peak()
            t0 = time.perf_counter()
            sender.publish(state)
            times.append(time.perf_counter() - t0)
            deltas.append(rss_kib()[1] - before)
        row["bucketed_s"] = min(times)
        row["bucketed_all_s"] = times  # every timed sync, for medians across runs
        row["peak_delta_first_mb"] = (peak_first - rss0) / 1024
        row["peak_delta_steady_mb"] = max(deltas) / 1024
        layout = BucketLayout.from_state(state, args.bucket_bytes)
        row["buckets"] = len(layout.buckets)
        row["two_buckets_mb"] = 2 * max(b.nbytes for b in layout.buckets) / 2**20
        order = [slot.name for bucket in layout.buckets for slot in bucket.slots]  # the receiver's order

        # (b) naive: one tensor at a time over the same gloo group (only when there is one group)
        store, transport = sender._store, next(iter(sender._groups.values())).transport
        assert transport is not None, "the publishes above formed the group"
        times = []
        if len(sender._groups) == 1:
            store.set(NAIVE_KEY, str(args.syncs))
        for r in range(args.syncs if len(sender._groups) == 1 else 0):
            time.sleep(args.gap)
            t0 = time.perf_counter()
            for name in order:
                transport.wait_work(transport.broadcast(state[name]))
            wait_acks(store, "naive", r, n, args.timeout)
            times.append(time.perf_counter() - t0)
        row["naive_s"] = min(times) if times else None
        row["naive_all_s"] = times  # every timed sync, for medians across runs

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
        row["tcp_s"] = min(times)
        row["tcp_all_s"] = times  # every timed sync, for medians across runs
    finally:
        sender.close()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return row


def print_header(bucket_bytes: int) -> None:
    print(f"bucket bound {bucket_bytes / 2**20:.0f} MiB; seconds per sync (best of runs); GB/s per receiver")
    head = (
        f"{'params':>7} {'recv':>4} {'MB':>6} {'bkts':>4} | {'bucketed s':>10} {'GB/s':>6} | "
        f"{'naive s':>8} {'GB/s':>6} | {'tcp s':>7} {'GB/s':>6} | {'bkt/tcp':>7} {'bkt/naive':>9} | "
        f"{'peak+1st':>8} {'peak+':>6} {'2 bkts':>6}"
    )
    print(head)
    print("-" * len(head), flush=True)


def print_row(r: dict) -> None:
    gb = 1e9
    naive = r["naive_s"]
    cells = [
        f"{r['params'] / 1e6:>6g}M {r['receivers']:>4} {r['bytes'] / 2**20:>6.0f} {r['buckets']:>4}",
        f"{r['bucketed_s']:>10.4f} {r['bytes'] / r['bucketed_s'] / gb:>6.2f}",
        f"{naive:>8.4f} {r['bytes'] / naive / gb:>6.2f}" if naive else f"{'n/a':>15}",
        f"{r['tcp_s']:>7.4f} {r['bytes'] / r['tcp_s'] / gb:>6.2f}",
        f"{r['tcp_s'] / r['bucketed_s']:>7.2f} " + (f"{naive / r['bucketed_s']:>9.2f}" if naive else f"{'n/a':>9}"),
        f"{r['peak_delta_first_mb']:>8.1f} {r['peak_delta_steady_mb']:>6.1f} {r['two_buckets_mb']:>6.1f}",
    ]
    print(" | ".join(cells), flush=True)


def print_notes() -> None:
    print("bkt/tcp: bucketed throughput as a fraction of the plain TCP stream (goal >= 0.70 at 100M, 1 receiver);")
    print("peak+1st / peak+: sender RSS high-water mark (MiB) above its RSS before the first publish (staging")
    print("allocated, group formed) / before later publishes (staging reused); goal below '2 bkts', twice the")
    print("largest bucket (peak < model + 2 buckets)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default="1M,10M,100M", help="float32 parameter counts, e.g. 1M,10M")
    parser.add_argument("--receivers", default="1,2,4", help="receiver counts, e.g. 1,2")
    parser.add_argument("--syncs", type=int, default=3, help="timed syncs per method (best is reported)")
    parser.add_argument(
        "--gap", type=float, default=1.0,
        help="seconds between timed syncs (a training iteration; receivers page in their next buckets meanwhile)",
    )
    parser.add_argument(
        "--group-size", type=int, default=0, help="receivers per broadcast group; 0: all in one (default)"
    )
    parser.add_argument("--bucket-bytes", type=int, default=WeightSyncConfig().bucket_size_bytes)
    parser.add_argument("--timeout", type=float, default=120.0)
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
    port = args.port
    print_header(args.bucket_bytes)  # once; each row follows as its case finishes
    for size in args.sizes.split(","):
        for n in (int(x) for x in args.receivers.split(",")):
            cmd = [sys.executable, __file__, "--role", "case", "--sizes", size, "--n", str(n), "--port", str(port),
                   "--syncs", str(args.syncs), "--gap", str(args.gap), "--bucket-bytes", str(args.bucket_bytes),
                   "--group-size", str(args.group_size),
                   "--timeout", str(args.timeout)]
            out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True).stdout
            print_row(json.loads(next(line for line in out.splitlines() if line.startswith("ROW "))[4:]))
            port += 2
    print_notes()

if __name__ == "__main__":
    main()
