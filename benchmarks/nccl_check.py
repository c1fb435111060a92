"""What one GPU can check of the NCCL path; prints one PASS/FAIL/SKIP line per check (exit 1 on any FAIL).

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a sender -> receiver NCCL transfer needs two
GPUs. On one GPU this checks:
  1. CUDA tensors (float32, bfloat16, int64) packed into CUDA buckets and unpacked: digests equal; and packed
     into the wire dtypes of `weightSync.dtype: bfloat16` (the sender's cast): digests equal to
     `tensor_digests(state, "bfloat16")`;
  2. a gloo publish of CUDA weights, cast to bfloat16, to two receiver subprocesses in one relay tree (receiver 0
     relays to receiver 1): both report the cast digests;
  3. ProcessGroupNCCL built by rlightning on a PrefixStore with world size 1 (eager connect), broadcast works;
  4. `resolve_backend("auto")` picks nccl on this machine;
  5. with three GPUs or more (else SKIP): an NCCL publish, cast to bfloat16, from GPU 0 along a relay chain
     (fan-out 1) to receivers on GPUs 1 and 2: both report the cast digests;
  6. check 2 with receivers that receive in place (`bufferStrategy: none`) into CUDA tensors of the policy's
     dtypes (cast back from bfloat16 on landing, from CPU staging buffers), and check 5 the same way on GPUs.

Usage: python benchmarks/nccl_check.py [--port 27700]    (needs CUDA; about a minute; uses --port .. --port + 2)
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Literal

import torch
import torch.distributed as dist

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightRecord, WeightSender, tensor_digests
from rlightning.weights import _transport
from rlightning.weights._buckets import BucketLayout
from rlightning.weights._state import wire_dtype

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for tests._ports
from tests._ports import BENCH_NCCL

HOST = "127.0.0.1"


def cuda_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return {
        "w": torch.randn(512, 512, device="cuda", generator=gen),
        "big": torch.randn(600_000, device="cuda", generator=gen),  # above the bucket bound: sent directly
        "h": torch.randn(64, 3, device="cuda", generator=gen).to(torch.bfloat16),
        "steps": torch.tensor(3, device="cuda"),
    }


def check_pack_on_cuda() -> str:
    state = cuda_state()
    for cast in (None, "bfloat16"):
        entries = [(name, wire_dtype(t.dtype, cast), t.shape) for name, t in state.items()]
        layout = BucketLayout(entries, 1 << 20)
        flats = [layout.allocate(i, "cuda") for i in range(len(layout.buckets))]
        for seg in layout.segments:
            out = flats[seg.bucket][seg.offset : seg.offset + seg.numel]
            layout.pack_segment(seg, state, out)
        got = layout.unpack_all(flats)
        assert all(t.is_cuda for t in got.values())
        assert tensor_digests(got) == tensor_digests(state, cast), f"digests differ after CUDA pack/unpack ({cast})"
    return f"{len(layout.buckets)} buckets, {len(layout.segments)} segments, cast and not"


def sync_config(backend: Literal["gloo", "nccl"], fanout: int) -> WeightSyncConfig:
    return WeightSyncConfig(
        backend=backend, bucket_size_bytes=1 << 20, group_size=4, relay_fanout=fanout, timeout_seconds=30,
        dtype="bfloat16",
    )


def check_publish(port: int, backend: Literal["gloo", "nccl"], fanout: int, in_place: bool = False) -> str:
    """Publish `cuda_state()` cast to bfloat16 to receivers 0 and 1 in one relay tree; both must match."""
    procs = [
        subprocess.Popen([sys.executable, __file__, "--receiver", "--port", str(port), "--ordinal", str(o),
                          "--backend", backend, "--fanout", str(fanout), *(["--in-place"] if in_place else [])])
        for o in (0, 1)
    ]
    sender = WeightSender(sync_config(backend, fanout), HOST, port)
    try:
        deadline = time.monotonic() + 120
        while sender.members != [0, 1]:
            assert time.monotonic() < deadline, "receivers did not register"
            time.sleep(0.1)
        state = cuda_state()
        stats = sender.publish(state)
        assert stats.receivers_acked == [0, 1], stats
        while not all(o in sender.reports() and sender.reports()[o].applied.version == stats.version for o in (0, 1)):
            assert time.monotonic() < deadline, "no reports"
            time.sleep(0.1)
        for ordinal, report in sender.reports().items():
            assert report.applied.digest == tensor_digests(state, "bfloat16"), f"receiver {ordinal} digests differ"
        return f"{stats.bytes} bytes (bfloat16) relayed to 2 receivers in {stats.seconds:.3f} s"
    finally:
        sender.close()
        for proc in procs:
            proc.wait(60)


class InPlace:
    """A policy's CUDA tensors (the sender's dtypes) that each version is received into (`bufferStrategy: none`)."""

    def __init__(self) -> None:
        self.tensors = {name: torch.zeros_like(t) for name, t in cuda_state().items()}

    def receive_targets(self) -> dict[str, torch.Tensor]:
        return self.tensors

    def begin_weight_receive(self, timeout: float) -> bool:
        return True

    def end_weight_receive(self, version: int | None) -> None:
        assert version is not None, "a receive in place stopped part way"


def run_receiver(port: int, ordinal: int, backend: Literal["gloo", "nccl"], fanout: int, in_place: bool) -> None:
    if backend == "nccl":
        torch.cuda.set_device(ordinal + 1)  # the sender holds GPU 0; NCCL wants one rank per GPU
    receiver = WeightReceiver(sync_config(backend, fanout), HOST, port, ordinal)
    into = InPlace() if in_place else None
    while not receiver.sender_closed:
        got = receiver.receive(timeout=1.0, into=into)
        if got is not None:
            version, state = got
            on_gpu = {k: v.to("cuda") for k, v in state.items()}
            # in place the tensors hold the policy's dtypes: compare in the wire's, as evaluators report
            digests = tensor_digests(on_gpu, "bfloat16") if in_place else tensor_digests(on_gpu)
            receiver.report(WeightRecord(version, {}, digests), {})
    receiver.close()


def check_nccl_relay_chain(port: int, in_place: bool = False) -> str:
    if torch.cuda.device_count() < 3:
        return "SKIP: needs three GPUs (a sender and two relaying receivers, one GPU each)"
    return check_publish(port, "nccl", fanout=1, in_place=in_place)


def check_nccl_world_size_one(port: int) -> str:
    store = dist.TCPStore(HOST, port, None, True, datetime.timedelta(seconds=30), wait_for_workers=False)
    group = _transport.BroadcastGroup(store, "nccl-check/", 0, 1, 30.0, "nccl", HOST)
    t = torch.arange(10, device="cuda", dtype=torch.float32)
    group.wait_work(group.broadcast(t))
    assert torch.equal(t.cpu(), torch.arange(10, dtype=torch.float32))
    group.close()
    return f"ProcessGroupNCCL on {group.device}"


def check_auto_backend() -> str:
    backend = _transport.resolve_backend("auto")
    assert backend == "nccl", backend
    return backend


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--port", type=int, default=BENCH_NCCL.first,
        help="first of two ports (default: block BENCH_NCCL of tests/_ports.py)",
    )
    parser.add_argument("--receiver", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--ordinal", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--backend", default="gloo", choices=["gloo", "nccl"], help=argparse.SUPPRESS)
    parser.add_argument("--fanout", type=int, default=2, help=argparse.SUPPRESS)
    parser.add_argument("--in-place", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.receiver:
        run_receiver(args.port, args.ordinal, args.backend, args.fanout, args.in_place)
        return
    if not torch.cuda.is_available():
        print("FAIL cuda: no CUDA device")
        sys.exit(1)
    checks = [
        ("pack_on_cuda", check_pack_on_cuda),
        ("gloo_relayed_publish_of_cuda_weights_cast", lambda: check_publish(args.port, "gloo", fanout=2)),
        ("nccl_world_size_1", lambda: check_nccl_world_size_one(args.port + 1)),
        ("auto_backend_is_nccl", check_auto_backend),
        ("nccl_relay_chain_cast", lambda: check_nccl_relay_chain(args.port + 2)),
        ("gloo_relayed_publish_in_place", lambda: check_publish(args.port, "gloo", fanout=2, in_place=True)),
        ("nccl_relay_chain_in_place", lambda: check_nccl_relay_chain(args.port + 2, in_place=True)),
    ]
    failed = 0
    for name, check in checks:
        try:
            outcome = check()
            verdict = "SKIP" if outcome.startswith("SKIP") else "PASS"
            print(f"{verdict} {name}: {outcome.removeprefix('SKIP: ')}", flush=True)
        except Exception as exc:  # noqa: BLE001 (report every check, whatever fails)
            failed += 1
            print(f"FAIL {name}: {exc!r}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
