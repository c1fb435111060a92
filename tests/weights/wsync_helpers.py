"""Shared pieces of the weight-sync tests: a model with every kind of state, and receiver subprocesses."""

from __future__ import annotations

import json
import os
import select
import subprocess
import sys
import time
from pathlib import Path

import torch
from torch import nn

from rlightning.weights import WeightBufferMixin, named_state

HERE = Path(__file__).resolve().parent
PYTHON = sys.executable
BIG = 300_000  # float32 elements of `big`: 1.2 MB, above the bucket bound: alone in its bucket, sent directly
BUCKET_BYTES = 64 * 1024


class Net(nn.Module):
    """Linear + BatchNorm + a bare Parameter, an int64 buffer, a float64 buffer, a bfloat16 weight, a big tensor."""

    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(4, 32)
        self.bn = nn.BatchNorm1d(32)
        self.head = nn.Linear(32, 2).to(torch.bfloat16)
        self.scale = nn.Parameter(torch.ones(2))  # bare parameter on the root module
        self.big = nn.Parameter(torch.zeros(BIG))
        self.register_buffer("steps", torch.zeros((), dtype=torch.int64))
        self.register_buffer("stats64", torch.zeros(5, dtype=torch.float64))
        self.register_buffer("scratch", torch.zeros(3), persistent=False)


class Policy(Net, WeightBufferMixin):
    """A receiver-side policy: the net with the weight buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.__init_weight_buffer_mixin__("single")


def weights_for(version: int) -> dict[str, torch.Tensor]:
    """Deterministic, version-specific values for every tensor of `Net` (BatchNorm stats included)."""
    net = Net()
    gen = torch.Generator().manual_seed(1000 + version)
    with torch.no_grad():
        for t in named_state(net).values():
            if t.dtype.is_floating_point:
                t.copy_(torch.randn(t.shape, generator=gen, dtype=torch.float32).to(t.dtype))
            else:
                t.fill_(version * 7)
    return named_state(net)


def start_receiver(
    port: int, ordinal: int, *extra: str, lifetime: float = 60.0, group_size: int = 2, timeout: float = 5.0
) -> subprocess.Popen:
    """Start `wsync_receiver.py` as a subprocess; its stdout is JSON lines."""
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1")
    cmd = [PYTHON, str(HERE / "wsync_receiver.py"), "--port", str(port), "--ordinal", str(ordinal),
           "--lifetime", str(lifetime), "--group-size", str(group_size), "--timeout", str(timeout), *extra]
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)


def wait_started(proc: subprocess.Popen, timeout: float = 60.0) -> None:
    """Wait (bounded) for a receiver's first line, `{"event": "started"}`: it is up and connecting."""
    assert proc.stdout is not None
    readable, _, _ = select.select([proc.stdout], [], [], timeout)
    assert readable, f"receiver pid {proc.pid} printed nothing within {timeout} s"
    line = proc.stdout.readline()
    assert json.loads(line)["event"] == "started", line


def stop(procs: list[subprocess.Popen], timeout: float = 20.0) -> None:
    """Wait for receiver processes to exit; kill any that do not within `timeout` seconds."""
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(5)


def wait_reports(sender, predicate, timeout: float = 30.0) -> dict:
    """Poll `sender.reports()` until `predicate(reports)` holds; return them (or the last seen on timeout)."""
    end = time.monotonic() + timeout
    reports = sender.reports()
    while not predicate(reports) and time.monotonic() < end:
        time.sleep(0.1)
        reports = sender.reports()
    return reports


def wait_members(sender, ordinals: set[int], timeout: float = 120.0) -> None:
    """Wait until exactly `ordinals` are registered with `sender` (receivers connect asynchronously, after their
    torch import: several at once took over 60 s on a loaded 2-core machine)."""
    end = time.monotonic() + timeout
    while set(sender.members) != ordinals:
        if time.monotonic() > end:
            raise TimeoutError(f"registered {sender.members}, expected {sorted(ordinals)}")
        time.sleep(0.1)


def peak_tensor_bytes(call) -> int:
    """Peak bytes of tensor storage `call` held at once above what existed before, counted, not sampled.

    torch's profiler records every allocation and free of CPU tensor storage in the calling thread (gloo's
    threads move bytes into existing tensors and allocate none). Python's tracemalloc does not see tensor
    storage, and the resident-set high-water mark hides reuse of freed memory, hence the profiler.
    """
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as prof:
        call()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]  # type: ignore[union-attr,unused-ignore]
    held = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        held += event.nbytes()
        peak = max(peak, held)
    return peak


def applied_versions(proc) -> list[int]:
    """Versions a finished receiver process (wsync_receiver.py) applied, from its JSON lines on stdout."""
    lines = [json.loads(line) for line in proc.stdout.read().splitlines() if line.startswith("{")]
    return [line["applied"] for line in lines if line["event"] == "applied" and line["applied"] is not None]
