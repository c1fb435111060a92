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
    python benchmarks/weight_sync.py --link-rate 200mbit --bucket-bytes 1048576 --json rows.json  # capped links

`--link-rate RATE` (root): the sender and every receiver each in a network namespace of its own, joined by veth
pairs to one bridge, every link capped both ways at RATE with tbf (tests/_netns.py), as pods behind capped links
are. Per receiver count, for each size and topology of `--topologies`: `relayK` (one relay tree of fan-out K),
`dtreeK` (two relay trees of fan-out K, each carrying half the transfers: `weightSync.relayTrees` 2, NCCL's double
binary tree for K = 2), `star` (`groupSize` 1: the sender sends every receiver its own copy, as a naive broadcast
does) and `tcp` (one plain TCP stream to one receiver: the link's physical limit, with 1 receiver only). Each
topology is timed over `--syncs` publishes after one that forms the trees; the median is reported. Every receiver's
digest of the last version is checked against the sender's. `--kill-relay` kills receiver 1 half way into one more
publish of the last phase and times the failure and the next publish. Then it fits t = d * a + X / bw per hop (see
`critical_path`) and projects 100, 1,000 and 10,000 evaluators. `--json` rows: topology, params, receivers, seconds
(median), all_seconds, link_rate_bps, model_bytes, sender_egress_bytes, sender_wire_bytes, transfer_bytes,
digests_ok, loadavg (the machine's 1-minute load when the row finished), congestion_control (TCP's, in every
namespace: `--congestion-control`, cubic unless said).

`--json FILE` writes one object per row: params, receivers, bucketed_seconds, naive_seconds, tcp_seconds,
model_bytes, sender_egress_bytes, sender_peak_extra_bytes, receiver_peak_extra_bytes. GB/s is payload bytes
per receiver per second (1 GB = 1e9 bytes). The naive and TCP parts use benchmark-only keys on the sender's store.
`--record` appends the rows' seconds to docs/measurements.md as one row (`loopback_figures`, `capped_figures`).
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from pathlib import Path

import torch

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightSender, WeightSyncError, tensor_digests
from rlightning.weights._buckets import TRANSFER_MAX_BYTES, BucketLayout
from rlightning.weights._topology import relay_tree, relay_trees
from rlightning.weights._transport import BroadcastGroup

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for tests._ports
from benchmarks import _record
from tests import _netns
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
        store = receiver._session.store  # benchmark only: its keys share the sender's store
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
        store = receiver._session.store
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
        row.update(time_publishes(sender, state, n, args))
        store = sender._store  # benchmark only
        row["naive_seconds"] = time_naive(store, state, n, args)
        row["tcp_seconds"] = time_tcp(store, state, n, port + 1, args)
    finally:
        sender.close()
        for p in procs:
            try:
                p.wait(60)
            except subprocess.TimeoutExpired:
                p.kill()
    return row


def time_publishes(sender: WeightSender, state: dict[str, torch.Tensor], n: int, args: argparse.Namespace) -> dict:
    """(a) `publish` after one that forms the trees: times, egress, the peaks of both sides, the bucket count."""
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
    row: dict = {"bucketed_seconds": min(times), "bucketed_all_seconds": times, "sender_egress_bytes": max(egress)}
    time.sleep(args.gap)
    row["sender_peak_extra_bytes"] = peak_tensor_bytes(lambda: sender.publish(state))
    peaks = [PEAK.format(ordinal=o) for o in range(n)]
    store.wait(peaks, datetime.timedelta(seconds=args.timeout))
    row["receiver_peak_extra_bytes"] = max(int(store.get(key)) for key in peaks)
    row["buckets"] = len(BucketLayout.from_state(state, args.bucket_bytes).buckets)
    return row


def time_naive(
    store: torch.distributed.Store, state: dict[str, torch.Tensor], n: int, args: argparse.Namespace
) -> float:
    """(b) naive: one tensor at a time over one gloo group of everyone, in the receivers' order; best seconds."""
    layout = BucketLayout.from_state(state, args.bucket_bytes)
    order = [slot.name for bucket in layout.buckets for slot in bucket.slots]  # the receivers' order
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
    return min(times)


def time_tcp(
    store: torch.distributed.Store, state: dict[str, torch.Tensor], n: int, port: int, args: argparse.Namespace
) -> float:
    """(c) plain TCP: the same bytes (a contiguous copy, as a stream sends them) to every receiver concurrently,
    served on `port`; best seconds.
    """
    flat = torch.cat([t.reshape(-1) for t in state.values()]).view(torch.uint8)
    payload = flat.numpy().data
    with socket.create_server((HOST, port)) as server:
        store.set(TCP_KEY, json.dumps([args.syncs, flat.numel(), port]))
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
    return min(times)


# -- capped links (--link-rate) ------------------------------------------------------------------------
FINAL_KEY, DIGEST_KEY, PID_KEY = "bench/final", "bench/digest/{ordinal}", "bench/pid/{ordinal}"
CAPPED_PROJECTED = (100, 1000, 10_000)
"""Fleet sizes of the projection."""


TREES_OF = {"relay": 1, "dtree": 2}
"""Relay trees per group (`weightSync.relayTrees`) of each relay topology's name."""


def topology_fanout(topology: str) -> int | None:
    """The relay fan-out of `relayK` and `dtreeK`; None for `star` and `tcp`.

    Raises:
        ValueError: on another name.
    """
    if topology in ("star", "tcp"):
        return None
    if topology[:5] in TREES_OF and topology[5:].isdigit() and int(topology[5:]) >= 1:
        return int(topology[5:])
    raise ValueError(f"--topologies: {topology!r} is not relayK or dtreeK (K >= 1), star or tcp")


def topology_trees(topology: str) -> int:
    """Relay trees per group: 2 for `dtreeK`, else 1."""
    return TREES_OF.get(topology[:5], 1)


def capped_config(args: argparse.Namespace, topology: str, receivers: int) -> WeightSyncConfig:
    """`relayK`: one tree of fan-out K; `dtreeK`: two; `star`: groups of one (the sender sends each its copy)."""
    fanout = topology_fanout(topology)
    return WeightSyncConfig(
        backend="gloo", bucket_size_bytes=args.bucket_bytes, group_size=receivers if fanout else 1,
        relay_fanout=fanout or WeightSyncConfig().relay_fanout, relay_trees=topology_trees(topology),
        timeout_seconds=args.timeout,
    )


def state_digest(state: Mapping[str, torch.Tensor]) -> str:
    """One sha256 over every tensor's digest (bytes, dtype, shape), in name order."""
    return hashlib.sha256(json.dumps(sorted(tensor_digests(state).items())).encode()).hexdigest()


def capped_phases(args: argparse.Namespace, receivers: int) -> list[tuple[str, str]]:
    """(topology, size) in the order run for one receiver count; `tcp` only with one receiver."""
    return [(t, size) for size in args.sizes.split(",") for t in args.topologies.split(",")
            if t != "tcp" or receivers == 1]


def run_capped_receiver(args: argparse.Namespace) -> None:
    """One receiver through every phase: a `WeightReceiver` per phase on its port, until that sender closes."""
    torch.set_num_threads(1)
    sender_ip = _netns.CappedNetwork.address(0)
    for index, (topology, size) in enumerate(capped_phases(args, args.n)):
        port = args.port + index
        if topology == "tcp":
            receive_tcp_stream(sender_ip, port, parse_size(size) * 4)
            continue
        receiver = WeightReceiver(capped_config(args, topology, args.n), sender_ip, port, args.ordinal)
        while not receiver.sender_closed:
            got = receiver.receive(timeout=1.0)
            store = receiver._session.store  # benchmark only: its keys share the sender's store
            if got is not None and store is not None:
                store.set(PID_KEY.format(ordinal=args.ordinal), str(os.getpid()))  # for --kill-relay
            final = got is not None and store is not None and store.check([FINAL_KEY])
            if final and int(store.get(FINAL_KEY)) == got[0]:  # type: ignore[union-attr,index]
                store.set(DIGEST_KEY.format(ordinal=args.ordinal), state_digest(got[1]))  # type: ignore[union-attr,index]
        receiver.close()


def receive_tcp_stream(host: str, port: int, nbytes: int) -> None:
    """Receive rounds of `nbytes` on one connection to (host, port), answering each with one byte, until EOF."""
    deadline = time.monotonic() + 60
    while True:  # the sender listens once its previous phase closed
        try:
            conn = socket.create_connection((host, port))
            break
        except ConnectionRefusedError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    buf = torch.empty(nbytes, dtype=torch.uint8)
    view = buf.numpy().data
    with conn:
        while True:
            got = 0
            while got < nbytes:
                step = conn.recv_into(view[got:], nbytes - got)
                if step == 0:
                    return
                got += step
            conn.sendall(b"k")


def wire_tx_bytes() -> int:
    """Bytes this namespace's eth0 sent, headers included (the link's counter)."""
    return int(Path("/sys/class/net/eth0/statistics/tx_bytes").read_text())


def capped_tcp_phase(args: argparse.Namespace, port: int, state: Mapping[str, torch.Tensor]) -> dict:
    """One plain TCP stream of the model's bytes to receiver 0, `--syncs` times: the link's limit."""
    payload = torch.cat([t.reshape(-1) for t in state.values()]).view(torch.uint8).numpy().data
    times = []
    with socket.create_server((_netns.CappedNetwork.address(0), port)) as server:
        conn = server.accept()[0]
        with conn:
            for _ in range(args.syncs):
                time.sleep(args.gap)
                t0 = time.perf_counter()
                conn.sendall(payload)
                assert conn.recv(1) == b"k"
                times.append(time.perf_counter() - t0)
    return {"seconds": statistics.median(times), "all_seconds": times, "sender_egress_bytes": len(payload)}


def capped_publish_phase(
    args: argparse.Namespace, sender: WeightSender, n: int, state: Mapping[str, torch.Tensor]
) -> dict:
    """One publish that forms the tree, then `--syncs` timed ones; digests of the last checked."""
    wait_members(sender, n)
    sender.publish(state)
    store = sender._store  # benchmark only
    times, egress, wire = [], [], []
    for i in range(args.syncs):
        if i == args.syncs - 1:
            store.set(FINAL_KEY, str(sender.version + 1))
        time.sleep(args.gap)
        before, wire_before = tcp_bytes_acked(os.getpid()), wire_tx_bytes()
        t0 = time.perf_counter()
        sender.publish(state)
        times.append(time.perf_counter() - t0)
        time.sleep(0.05)  # the last bytes' TCP acknowledgements
        egress.append(tcp_bytes_acked(os.getpid()) - before)
        wire.append(wire_tx_bytes() - wire_before)
    keys = [DIGEST_KEY.format(ordinal=o) for o in range(n)]
    store.wait(keys, datetime.timedelta(seconds=args.timeout))
    expected = state_digest(state)
    return {
        "seconds": statistics.median(times), "all_seconds": times, "sender_egress_bytes": max(egress),
        "sender_wire_bytes": max(wire), "digests_ok": all(store.get(k).decode() == expected for k in keys),
    }


def wait_members(sender: WeightSender, count: int, bound: float = 300.0) -> None:
    deadline = time.monotonic() + bound
    while len(sender.members) < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count - len(sender.members)} receivers did not register")
        time.sleep(0.05)


def kill_relay_phase(
    args: argparse.Namespace, sender: WeightSender, n: int, state: Mapping[str, torch.Tensor], seconds: float
) -> dict:
    """SIGKILL receiver 1 (a relay once the fleet exceeds fan-out + 1) half way into a publish of about `seconds`.

    Times the publish that fails (its subtree is reported lost), the orphans' registering again, and the next
    publish to the n - 1 left, which re-forms the tree.
    """
    victim = int(sender._store.get(PID_KEY.format(ordinal=1)))  # benchmark only
    failed: dict = {}

    def publish() -> None:
        t0 = time.perf_counter()
        try:
            sender.publish(state)
            failed["error"] = None
        except WeightSyncError as exc:
            failed["error"] = str(exc)
        failed["seconds"] = time.perf_counter() - t0

    thread = threading.Thread(target=publish)
    thread.start()
    time.sleep(seconds / 2)  # mid-publish
    os.kill(victim, signal.SIGKILL)
    thread.join()
    t0 = time.perf_counter()
    wait_members(sender, n - 1)
    rejoin = time.perf_counter() - t0
    t0 = time.perf_counter()
    stats = sender.publish(state)
    return {
        "kill_failed_seconds": failed["seconds"], "kill_error": failed["error"], "kill_rejoin_seconds": rejoin,
        "kill_next_seconds": time.perf_counter() - t0, "kill_next_acked": len(stats.receivers_acked),
    }


def run_capped_sender(args: argparse.Namespace) -> None:
    """Every phase of one receiver count, in order; prints one `ROW {json}` line per phase."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    host = _netns.CappedNetwork.address(0)
    phases = capped_phases(args, args.n)
    states = {size: make_state(parse_size(size)) for size in args.sizes.split(",")}

    def open_sender(index: int) -> WeightSender | None:
        if index >= len(phases) or phases[index][0] == "tcp":
            return None
        return WeightSender(capped_config(args, phases[index][0], args.n), host, args.port + index)

    sender = open_sender(0)
    for index, (topology, size) in enumerate(phases):
        state = states[size]
        nbytes = sum(t.numel() * t.element_size() for t in state.values())
        layout = BucketLayout.from_state(state, args.bucket_bytes)
        row = {
            "topology": topology, "params": parse_size(size), "receivers": args.n, "link_rate_bps": args.rate_bps,
            "model_bytes": nbytes, "bucket_bytes": args.bucket_bytes, "transfers": len(layout.segments),
            "transfer_bytes": max(s.numel * layout.buckets[s.bucket].dtype.itemsize for s in layout.segments),
        }
        if sender is None:
            row.update(capped_tcp_phase(args, args.port + index, state))
            sender = open_sender(index + 1)
        else:
            row.update(capped_publish_phase(args, sender, args.n, state))
            if args.kill_relay and index == len(phases) - 1:
                row.update(kill_relay_phase(args, sender, args.n, state, row["seconds"]))
            following = open_sender(index + 1)  # listening before this one closes: receivers move on at once
            sender.close()
            sender = following
        row["loadavg"] = os.getloadavg()[0]  # the machine's load: many busy receivers make hops CPU-bound
        print("ROW " + json.dumps(row), flush=True)


def stop_processes(procs: list[subprocess.Popen]) -> None:
    """Terminate, then kill, every process still running (they run inside the namespaces about to go)."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _raise_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def run_capped(args: argparse.Namespace) -> list[dict]:
    """Make the capped network, run every receiver count, delete the network (also on error or signal)."""
    counts = [int(x) for x in args.receivers.split(",")]
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_exit)  # so the finally below removes the namespaces
    net = _netns.CappedNetwork(max(counts) + 1, args.rate_bps, congestion_control=args.congestion_control)
    procs: list[subprocess.Popen] = []
    rows: list[dict] = []
    try:
        net.start()
        print(f"network {net.prefix}-*: {net.nodes} namespaces, links capped at {args.rate_bps / 1e6:g} Mbit/s "
              f"each way (tbf, burst {_netns.tbf_burst_bytes(args.rate_bps)} B; TCP {args.congestion_control}); "
              f"bucket bound {args.bucket_bytes} B; median of {args.syncs} publishes", flush=True)
        print_capped_header()
        for n in counts:
            common = [sys.executable, __file__, "--link-rate", args.link_rate, "--n", str(n), "--port", str(args.port),
                      "--sizes", args.sizes, "--topologies", args.topologies, "--syncs", str(args.syncs),
                      "--gap", str(args.gap), "--bucket-bytes", str(args.bucket_bytes), "--timeout", str(args.timeout),
                      *(["--kill-relay"] if args.kill_relay else [])]
            procs = []  # filled one by one, so an interrupt stops every process started (net.close() kills the rest)
            for o in range(n):
                argv = net.exec_argv(o + 1, [*common, "--role", "capped-receiver", "--ordinal", str(o)])
                procs.append(subprocess.Popen(argv, start_new_session=True))
            sender = subprocess.Popen(net.exec_argv(0, [*common, "--role", "capped-sender"]), stdout=subprocess.PIPE,
                                      text=True, start_new_session=True)
            procs.append(sender)
            assert sender.stdout is not None
            for line in sender.stdout:
                if line.startswith("ROW "):
                    rows.append({**json.loads(line[4:]), "congestion_control": args.congestion_control})
                    print_capped_row(rows[-1], rows)
            if sender.wait() != 0:
                raise RuntimeError(f"the sender of {n} receivers exited with {sender.returncode}")
            for p in procs:
                p.wait(60)
    finally:
        stop_processes(procs)
        for error in net.close():
            print(error, file=sys.stderr)
    return rows


def print_capped_header() -> None:
    head = (f"{'topology':>8} {'params':>7} {'recv':>4} {'MB':>6} | {'seconds':>8} {'Mbit/s':>7} | "
            f"{'x 1 recv':>8} | {'egress':>6} | {'load':>5} | digests")
    print(head)
    print("-" * len(head), flush=True)


def print_capped_row(r: dict, rows: list[dict]) -> None:
    """One row; `x 1 recv`: its time over the same size's first 1-receiver publish of this run."""
    base = [b for b in rows if b["receivers"] == 1 and b["params"] == r["params"] and b["topology"] != "tcp"]
    ratio = f"{r['seconds'] / base[0]['seconds']:>8.2f}" if base and r["topology"] != "tcp" else f"{'':>8}"
    print(f"{r['topology']:>8} {r['params'] / 1e6:>6g}M {r['receivers']:>4} {r['model_bytes'] / 2**20:>6.1f} | "
          f"{r['seconds']:>8.3f} {r['model_bytes'] * 8 / r['seconds'] / 1e6:>7.1f} | {ratio} | "
          f"{r['sender_egress_bytes'] / r['model_bytes']:>6.2f} | {r['loadavg']:>5.1f} | {r.get('digests_ok', '')}",
          flush=True)
    if "kill_failed_seconds" in r:
        lost = re.search(r"ordinals \[[^\]]*\]", r["kill_error"] or "")  # the whole error is in the JSON row
        print(f"  receiver 1 killed mid-publish: that publish failed after {r['kill_failed_seconds']:.3f} s "
              f"({lost.group(0) if lost else r['kill_error']} missed it); the orphans registered again "
              f"{r['kill_rejoin_seconds']:.3f} s later; the next publish (tree re-formed) took "
              f"{r['kill_next_seconds']:.3f} s to {r['kill_next_acked']} receivers",
              flush=True)


def critical_path(
    fanout: int | None,
    receivers: int,
    model_bytes: int,
    transfer_bytes: int,
    group_size: int | None = None,
    trees: int = 1,
) -> tuple[int, int]:
    """Hops and link bytes on the path to the receiver that a capped-link publish reaches last.

    Every link carries `bw` bytes/s each way; a node that feeds c peers (the sender: one per group; a relay: its
    children) gives each bw / c. Transfers of T bytes are stored and forwarded hop by hop (`_relay`), so along a
    path of hops h = 1..d whose senders feed c_h peers the last byte arrives after
    X / bw = (T * sum(c_h) + (M - T) * max(c_h)) / bw, the pipeline's fill plus the model at its slowest hop,
    and each hop adds a fixed cost a: t = d * a + X / bw (`fit_capped`). A star is one hop feeding every
    receiver: X = n * M. With two trees (`dtreeK`) each carries M / 2 (alternate transfers), the sender feeds
    both roots, and every receiver's link takes in from two parents at once, so every hop gets at most bw / 2:
    c_h = max(c_h, 2), and X = T * sum(c_h) + (M / 2 - T) * max(c_h); for fan-out 2 that is M + 2 (d - 1) T.

    Args:
        fanout (int | None): relay fan-out; None: the star (groups of one).
        receivers (int): fleet size n.
        model_bytes (int): M.
        transfer_bytes (int): T, the largest transfer (`BucketLayout.segments`).
        group_size (int | None, optional): receivers per tree (`groupSize`); None: one tree. Defaults to None.
        trees (int, optional): relay trees per group (`relayTrees`). Defaults to 1.

    Returns:
        tuple[int, int]: (d, X) of the receiver with the largest X (then the deepest).
    """
    if fanout is None:
        return 1, receivers * model_bytes
    group = min(group_size or receivers, receivers)
    groups = -(-receivers // group)
    worst = (0, 0)
    for tree in relay_trees(list(range(group)), fanout, trees):  # a full group is the slowest
        for place in tree.values():
            feeds, up = [groups * trees], place  # the sender feeds every tree's root of every group
            while up.parent is not None:
                up = tree[up.parent]
                feeds.append(max(len(up.children), trees))  # a receiver's link takes in from `trees` parents
            x = transfer_bytes * sum(feeds) + (model_bytes // trees - transfer_bytes) * max(feeds)
            worst = max(worst, (x, place.depth))
    return worst[1], worst[0]


def row_path(r: dict) -> tuple[int, int]:
    topology = r["topology"]
    return critical_path(
        topology_fanout(topology), r["receivers"], r["model_bytes"], r["transfer_bytes"], None, topology_trees(topology)
    )


def fit_capped(rows: list[dict]) -> tuple[float, float]:
    """Least squares of t = d * a + X / bw over `rows` in relative error (each row weighted by 1 / t).

    Returns:
        tuple[float, float]: a (seconds per hop), bw (bytes per second).
    """
    sdd = sdx = sxx = sd = sx = 0.0
    for r in rows:
        d, x = row_path(r)
        d, x = d / r["seconds"], x / r["seconds"]  # weighted: residuals relative to t
        sdd, sdx, sxx, sd, sx = sdd + d * d, sdx + d * x, sxx + x * x, sd + d, sx + x
    det = sdd * sxx - sdx * sdx
    a, inv_bw = (sd * sxx - sx * sdx) / det, (sdd * sx - sdx * sd) / det
    return a, 1 / inv_bw


def predicted(a: float, bw: float, path: tuple[int, int]) -> float:
    return path[0] * a + path[1] / bw


def print_capped_model(rows: list[dict]) -> None:
    """Fit on the rows below the largest receiver count, check every row, project 100 to 10,000 evaluators."""
    timed = [r for r in rows if r["topology"] != "tcp"]
    largest = max(r["receivers"] for r in timed)
    train = [r for r in timed if r["receivers"] < largest] or timed
    if len({row_path(r) for r in train}) < 2:
        print("model: needs rows of two different paths")
        return
    a, bw = fit_capped(train)
    print(f"\nper hop: a = {a * 1e3:.1f} ms, bw = {bw * 8 / 1e6:.1f} Mbit/s of payload (fit to the rows with fewer "
          f"than {largest} receivers; the {largest}-receiver rows are predicted, not fitted)")
    print(f"{'topology':>8} {'params':>7} {'recv':>4} | {'measured':>8} {'model':>8} {'error':>7}")
    for r in rows:
        fanout = topology_fanout(r["topology"])
        path = (1, r["model_bytes"]) if r["topology"] == "tcp" else row_path(r)
        guess = predicted(a, bw, path) if fanout is not None or r["topology"] == "star" else path[1] / bw
        print(f"{r['topology']:>8} {r['params'] / 1e6:>6g}M {r['receivers']:>4} | {r['seconds']:>8.3f} "
              f"{guess:>8.3f} {(guess - r['seconds']) / r['seconds']:>+7.1%}")
    transfer = max(r["transfer_bytes"] for r in timed)
    print(f"\nprojected publish, seconds (transfers of {transfer} B; groups of at most 1024, the largest groupSize)")
    plans = [("relay1", 1, 1024, 1), ("relay2", 2, 1024, 1), ("relay4", 4, 1024, 1), ("relay2 g16", 2, 16, 1),
             ("dtree2", 2, 1024, 2), ("star", None, 1, 1)]
    print(f"{'params':>7} {'evaluators':>10} | " + " ".join(f"{name:>10}" for name, *_ in plans))
    for nbytes, params in sorted({(r["model_bytes"], r["params"]) for r in timed}):
        for n in CAPPED_PROJECTED:
            cells = [predicted(a, bw, critical_path(k, n, nbytes, min(transfer, nbytes), g, t)) for _, k, g, t in plans]
            print(f"{params / 1e6:>6g}M {n:>10} | " + " ".join(f"{c:>10.1f}" for c in cells))


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


def loopback_figures(rows: list[dict]) -> str:
    """The loopback rows as one line for docs/measurements.md: each case's seconds, bucketed / naive / TCP streams.

    Args:
        rows (list[dict]): `run_cases`' rows (the `--json` keys).

    Returns:
        str: e.g. ``publish s (bucketed/naive/tcp): 10M to 1 0.027/0.044/0.013, 10M to 8 0.187/0.244/0.078; sender
        egress at most 1.00 model``.
    """
    cases = ", ".join(f"{r['params'] / 1e6:g}M to {r['receivers']} {r['bucketed_seconds']:.3f}/"
                      f"{r['naive_seconds']:.3f}/{r['tcp_seconds']:.3f}" for r in rows)
    egress = max(r["sender_egress_bytes"] / r["model_bytes"] for r in rows)
    return f"publish s (bucketed/naive/tcp): {cases}; sender egress at most {egress:.2f} model"


def capped_figures(rows: list[dict], args: argparse.Namespace) -> str:
    """The capped rows as one line for docs/measurements.md: each topology's median seconds and its ratio to 1.

    Args:
        rows (list[dict]): `run_capped`'s rows.
        args (argparse.Namespace): The command line (`link_rate`, `congestion_control`).

    Returns:
        str: e.g. ``links 25mbit, cubic: dtree2 10M to 1 13.394 s, dtree2 10M to 16 16.856 s (1.26x); sender egress
        at most 1.00 model; digests exact``.
    """
    cells = []
    for r in rows:
        base = next((b for b in rows if b["receivers"] == 1 and b["params"] == r["params"]
                     and b["topology"] == r["topology"]), None)
        ratio = f" ({r['seconds'] / base['seconds']:.2f}x)" if base is not None and base is not r else ""
        cells.append(f"{r['topology']} {r['params'] / 1e6:g}M to {r['receivers']} {r['seconds']:.3f} s{ratio}")
    egress = max((r["sender_egress_bytes"] / r["model_bytes"] for r in rows if r["topology"] != "tcp"), default=0.0)
    digests = "exact" if all(r.get("digests_ok", True) for r in rows) else "NOT all exact"
    return (f"links {args.link_rate}, {args.congestion_control}: {', '.join(cells)}; sender egress at most "
            f"{egress:.2f} model; digests {digests}")


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


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
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
    parser.add_argument("--record", action="store_true", help=_record.RECORD_HELP)
    parser.add_argument(
        "--in-place", action="store_true",
        help="receivers receive each version into the weights they hold (bufferStrategy none), not a fresh copy",
    )
    parser.add_argument(
        "--port", type=int, default=BENCH_WEIGHT_SYNC.port(0),
        help="first port; each case uses two from here on (default: block BENCH_WEIGHT_SYNC of tests/_ports.py)",
    )
    parser.add_argument(
        "--link-rate", default=None,
        help="cap every link at this rate both ways (tc units, e.g. 200mbit), each process in a network namespace "
             "of its own (root); see the module docstring",
    )
    parser.add_argument(
        "--congestion-control", default="cubic",
        help="with --link-rate: TCP congestion control in every namespace (default cubic, the Linux kernel's "
             "default; BBR v1 ignores loss and, behind tbf's shallow queues, retransmits until the CPU is the limit)",
    )
    parser.add_argument(
        "--topologies", default="relay1,relay2,relay4,star,tcp",
        help="with --link-rate: relayK (one relay tree of fan-out K), dtreeK (two trees of fan-out K, each carrying "
             "half the transfers), star (the sender sends each receiver), tcp",
    )
    parser.add_argument(
        "--kill-relay", action="store_true",
        help="with --link-rate: in the last phase, SIGKILL receiver 1 half way into one more publish and time the "
             "failure, the orphans' return and the next publish (receiver 1 is then gone: use one relay topology)",
    )
    parser.add_argument(
        "--role", default="sender", choices=["sender", "case", "receiver", "capped-sender", "capped-receiver"],
        help=argparse.SUPPRESS,
    )
    parser.add_argument("--ordinal", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, default=1, help=argparse.SUPPRESS)
    return parser, parser.parse_args()


def main_capped(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """`--link-rate`: one role of the capped run (see the module docstring)."""
    try:
        args.rate_bps = _netns.parse_rate(args.link_rate)
        for topology in args.topologies.split(","):
            topology_fanout(topology)
    except ValueError as exc:
        parser.error(str(exc))
    if args.role == "capped-receiver":
        run_capped_receiver(args)
        return
    if args.role == "capped-sender":
        run_capped_sender(args)
        return
    reason = _netns.missing_requirements()
    if reason is not None:
        print(f"weight_sync.py --link-rate: {reason}", file=sys.stderr)
        sys.exit(2)
    available = Path("/proc/sys/net/ipv4/tcp_available_congestion_control").read_text().split()
    if args.congestion_control not in available:
        parser.error(f"--congestion-control must be one of this kernel's {' '.join(available)}, "
                     f"not {args.congestion_control!r}")
    try:
        rows = run_capped(args)
    except KeyboardInterrupt:  # the namespaces are gone (run_capped's finally)
        print("interrupted", file=sys.stderr)
        sys.exit(130)
    print_capped_model(rows)
    if args.json is not None:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    if args.record:
        print(f"recorded: {_record.append_row(capped_figures(rows, args))}")


def run_cases(args: argparse.Namespace) -> list[dict]:
    """Every size x receiver count, one case per process, printing each row as it finishes."""
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
    return rows


def main() -> None:
    parser, args = parse_args()
    if args.link_rate is not None:
        main_capped(parser, args)
        return
    if args.role == "receiver":
        run_receiver(args)
        return
    torch.set_num_threads(1)
    if args.role == "case":  # one case per process, so memory figures do not inherit an earlier case's heap
        print("ROW " + json.dumps(run_case(parse_size(args.sizes), args.n, args.port, args)), flush=True)
        return
    rows = run_cases(args)
    print_projection(rows, args.fanout)
    if args.json is not None:
        args.json.write_text(json.dumps([{k: r[k] for k in JSON_KEYS} for r in rows], indent=1) + "\n")
    if args.record:
        print(f"recorded: {_record.append_row(loopback_figures(rows))}")


if __name__ == "__main__":
    main()
