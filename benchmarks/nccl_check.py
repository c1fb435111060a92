"""What one GPU can check of the NCCL path; prints one PASS/FAIL line per check (exit 1 on any FAIL).

NCCL refuses two ranks on one GPU ("Duplicate GPU detected"), so a sender -> receiver NCCL transfer needs two
GPUs and is not checked here. On one GPU this checks:
  1. CUDA tensors (float32, bfloat16, int64) packed into CUDA buckets and unpacked: digests equal;
  2. a gloo publish of CUDA weights (staged on host) to a receiver subprocess: its reported digests equal;
  3. ProcessGroupNCCL built by rlightning on a PrefixStore with world size 1 (eager connect), broadcast works;
  4. `resolve_backend("auto")` picks nccl on this machine.

Usage: python benchmarks/nccl_check.py [--port 27700]    (needs CUDA; about a minute; uses --port and --port + 1)
"""

from __future__ import annotations

import argparse
import datetime
import subprocess
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist

from rlightning.config import WeightSyncConfig
from rlightning.weights import WeightReceiver, WeightRecord, WeightSender, tensor_digests
from rlightning.weights import _transport
from rlightning.weights._buckets import BucketLayout

sys.path.append(str(Path(__file__).resolve().parents[1]))  # the repository root, for tests._ports
from tests._ports import BENCH_NCCL

HOST = "127.0.0.1"


def cuda_state() -> dict[str, torch.Tensor]:
    gen = torch.Generator(device="cuda").manual_seed(0)
    return {
        "w": torch.randn(512, 512, device="cuda", generator=gen),
        "big": torch.randn(600_000, device="cuda", generator=gen),  # above ZERO_COPY_MIN_BYTES
        "h": torch.randn(64, 3, device="cuda", generator=gen).to(torch.bfloat16),
        "steps": torch.tensor(3, device="cuda"),
    }


def check_pack_on_cuda() -> str:
    state = cuda_state()
    layout = BucketLayout.from_state(state, 1 << 20)
    flats = [layout.allocate(i, "cuda") for i in range(len(layout.buckets))]
    for seg in layout.segments:
        out = flats[seg.bucket][seg.offset : seg.offset + seg.numel]
        layout.pack_segment(seg, state, out)
    got = layout.unpack_all(flats)
    assert all(t.is_cuda for t in got.values())
    assert tensor_digests(got) == tensor_digests(state), "digests differ after CUDA pack/unpack"
    return f"{len(layout.buckets)} buckets, {len(layout.segments)} segments"


def check_gloo_from_cuda(port: int) -> str:
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=1 << 20, group_size=2, timeout_seconds=30)
    proc = subprocess.Popen([sys.executable, __file__, "--receiver", "--port", str(port)])
    sender = WeightSender(config, HOST, port)
    try:
        deadline = time.monotonic() + 60
        while sender.members != [0]:
            assert time.monotonic() < deadline, "receiver did not register"
            time.sleep(0.1)
            sender.reports()
        state = cuda_state()
        stats = sender.publish(state)
        assert stats.receivers_acked == [0], stats
        while 0 not in sender.reports():
            assert time.monotonic() < deadline, "no report"
            time.sleep(0.1)
        report = sender.reports()[0]
        assert report.applied.digest == tensor_digests(state), "receiver digests differ"
        return f"{stats.bytes} bytes in {stats.seconds:.3f} s"
    finally:
        sender.close()
        proc.wait(60)


def run_receiver(port: int) -> None:
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=1 << 20, group_size=2, timeout_seconds=30)
    receiver = WeightReceiver(config, HOST, port, 0)
    while not receiver.sender_closed:
        got = receiver.receive(timeout=1.0)
        if got is not None:
            version, state = got
            on_gpu = {k: v.to("cuda") for k, v in state.items()}
            receiver.report(WeightRecord(version, {}, tensor_digests(on_gpu)), {})
    receiver.close()


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
    args = parser.parse_args()
    if args.receiver:
        run_receiver(args.port)
        return
    if not torch.cuda.is_available():
        print("FAIL cuda: no CUDA device")
        sys.exit(1)
    checks = [
        ("pack_on_cuda", check_pack_on_cuda),
        ("gloo_publish_of_cuda_weights", lambda: check_gloo_from_cuda(args.port)),
        ("nccl_world_size_1", lambda: check_nccl_world_size_one(args.port + 1)),
        ("auto_backend_is_nccl", check_auto_backend),
    ]
    failed = 0
    for name, check in checks:
        try:
            print(f"PASS {name}: {check()}", flush=True)
        except Exception as exc:  # noqa: BLE001 (report every check, whatever fails)
            failed += 1
            print(f"FAIL {name}: {exc!r}", flush=True)
            traceback.print_exc()
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
