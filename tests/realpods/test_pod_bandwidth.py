"""A pod's bandwidth annotations cap its links on the real node, as a cluster's CNI does (the `bandwidth` plugin).

containerd hands the plugin the annotation's rate with the largest burst it allows (about 256 MiB, seen in the
tbf qdiscs it makes), so a capped pod still moves its first ~256 MiB at line rate and only the rest at the rate.
The test reads the qdiscs, then times a stream well past the burst each way, against an unannotated pod of the
same run.
"""

from __future__ import annotations

import json
import socketserver
import subprocess
import threading

import pytest
import yaml

from devcluster import _nodeconfig
from realpods_helpers import pod_phase, python_pod, wait_for

RATE_BITS = 100_000_000  # "100M"
PAST_BURST_BYTES = 48 * 1024 * 1024  # about 4 s at the rate, each way
CHUNK = 1 << 20
MIN_SHARE_OF_RATE_TIME = 0.7
MIN_SLOWDOWN = 3.0

PROBE = """
import json, socket, time
def stream(kind):
    with socket.create_connection(({host!r}, {port}), timeout=120) as s:
        s.sendall(kind)
        start, moved = time.monotonic(), 0
        if kind == b"G":
            while chunk := s.recv({chunk}):
                moved += len(chunk)
        else:
            block = bytes({chunk})
            for _ in range({total} // {chunk}):
                s.sendall(block)
                moved += len(block)
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
        return moved, time.monotonic() - start
(fetched, fetch), (sent, upload) = stream(b"G"), stream(b"P")
print(json.dumps({{"fetched": fetched, "fetch": fetch, "sent": sent, "upload": upload}}), flush=True)
time.sleep(600)
"""


class _StreamServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    total = 0  # bytes a fetch gets


class _Stream(socketserver.BaseRequestHandler):
    """``G``: send ``server.total`` bytes and close; ``P``: read to the end, then answer one byte."""

    def handle(self) -> None:
        assert isinstance(self.server, _StreamServer)
        kind = self.request.recv(1)
        if kind == b"G":
            block = bytes(CHUNK)
            for _ in range(self.server.total // CHUNK):
                self.request.sendall(block)
        else:
            while self.request.recv(CHUNK):
                pass
            self.request.sendall(b"k")


@pytest.fixture
def stream_server():
    server = _StreamServer((_nodeconfig.BRIDGE_IP, 0), _Stream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _tbf_bursts(rate_bits: int) -> list[int]:
    """Bursts (bytes) of the host's tbf qdiscs at ``rate_bits``: one per capped direction of the capped pod."""
    qdiscs = json.loads(subprocess.run(["tc", "-j", "qdisc", "show"], check=True, capture_output=True).stdout)
    return [q["options"]["burst"] for q in qdiscs if q["kind"] == "tbf" and q["options"]["rate"] * 8 == rate_bits]


def _start_probe(cluster, namespace: str, name: str, code: str, annotations: dict[str, str]) -> None:
    pod = python_pod(name, code)
    pod["metadata"]["annotations"] = annotations
    cluster.kubectl("apply", "-n", namespace, "-f", "-", input=yaml.safe_dump(pod))


def _result(cluster, namespace: str, name: str) -> dict | None:
    proc = cluster.kubectl("logs", name, "-n", namespace, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")] if proc.returncode == 0 else []
    return json.loads(lines[-1]) if lines else None


def test_bandwidth_annotations_cap_both_directions_of_a_pods_link(cluster, real_namespace, stream_server):
    rate = f"{RATE_BITS // 1_000_000}M"
    held = "import time; time.sleep(600)"
    _start_probe(cluster, real_namespace, "shaped", held,
                 {"kubernetes.io/ingress-bandwidth": rate, "kubernetes.io/egress-bandwidth": rate})
    wait_for("the capped pod to run", lambda: pod_phase(cluster, real_namespace, "shaped") == "Running")
    bursts = _tbf_bursts(RATE_BITS)
    assert len(bursts) == 2, bursts  # the host end of its veth (ingress) and its ifb (egress)
    cluster.kubectl("delete", "pod", "shaped", "-n", real_namespace, "--wait=true")
    wait_for("its qdiscs to go with it", lambda: not _tbf_bursts(RATE_BITS))

    burst = max(bursts)
    stream_server.total = (burst + PAST_BURST_BYTES) // CHUNK * CHUNK
    code = PROBE.format(host=_nodeconfig.BRIDGE_IP, port=stream_server.server_address[1], chunk=CHUNK,
                        total=stream_server.total)
    _start_probe(cluster, real_namespace, "capped", code,
                 {"kubernetes.io/ingress-bandwidth": rate, "kubernetes.io/egress-bandwidth": rate})
    wait_for("the capped pod's streams", lambda: _result(cluster, real_namespace, "capped") is not None)
    _start_probe(cluster, real_namespace, "open", code, {})
    wait_for("the open pod's streams", lambda: _result(cluster, real_namespace, "open") is not None)

    capped, open_link = _result(cluster, real_namespace, "capped"), _result(cluster, real_namespace, "open")
    at_rate = (stream_server.total - burst) * 8 / RATE_BITS
    assert capped["fetched"] == capped["sent"] == open_link["fetched"] == stream_server.total
    for direction in ("fetch", "upload"):  # ingress-bandwidth caps the fetch, egress-bandwidth the upload
        assert capped[direction] >= MIN_SHARE_OF_RATE_TIME * at_rate, (direction, capped, at_rate)
        assert capped[direction] >= MIN_SLOWDOWN * open_link[direction], (direction, capped, open_link)
