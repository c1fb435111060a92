"""A pod's bandwidth annotations cap its links on the real node, as a cluster's CNI does (the `bandwidth` plugin).

containerd hands the plugin the annotation's rate with the largest burst it allows (about 256 MiB, seen in the
tbf qdiscs it makes), so a capped pod still moves its first ~256 MiB at line rate and only the rest at the rate.
The host server sizes each stream from the pod's qdiscs (its burst plus a few seconds at the rate) and the pod
times them: past the burst, both directions run at the rate (an uncapped veth moves that in a fraction of it).
"""

from __future__ import annotations

import json
import socketserver
import struct
import subprocess
import threading

import pytest
import yaml

from devcluster import _nodeconfig
from realpods_helpers import python_pod, wait_for

RATE_BITS = 100_000_000  # "100M"
PAST_BURST_BYTES = 40 * 1024 * 1024  # about 3.4 s at the rate, each way
CHUNK = 1 << 20
MIN_SHARE_OF_RATE_TIME = 0.7

PROBE = """
import json, socket, struct, time
def stream(kind):
    with socket.create_connection(({host!r}, {port}), timeout=120) as s:
        s.sendall(kind)
        total = struct.unpack("!Q", s.recv(8, socket.MSG_WAITALL))[0]
        start, moved, block = time.monotonic(), 0, bytes({chunk})
        if kind == b"G":
            while chunk := s.recv({chunk}):
                moved += len(chunk)
        else:
            while moved < total:
                s.sendall(block)
                moved += len(block)
            s.shutdown(socket.SHUT_WR)
            s.recv(1)
        return moved, total, time.monotonic() - start
fetch, upload = stream(b"G"), stream(b"P")
print(json.dumps({{"fetch": fetch, "upload": upload}}), flush=True)
time.sleep(600)
"""


def _tbf_bursts(rate_bits: int) -> list[int]:
    """Bursts (bytes) of the host's tbf qdiscs at ``rate_bits``: one per capped direction of the capped pod."""
    qdiscs = json.loads(subprocess.run(["tc", "-j", "qdisc", "show"], check=True, capture_output=True).stdout)
    return [q["options"]["burst"] for q in qdiscs if q["kind"] == "tbf" and q["options"]["rate"] * 8 == rate_bits]


class _StreamServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    bursts: list[int] = []  # the tbf bursts found when the first stream began


class _Stream(socketserver.BaseRequestHandler):
    """Both kinds first send the stream's size (8 bytes): the largest burst plus `PAST_BURST_BYTES`, in chunks.
    ``G``: then that many bytes, and close; ``P``: read to the end, then answer one byte."""

    def handle(self) -> None:
        assert isinstance(self.server, _StreamServer)
        kind = self.request.recv(1)
        if not self.server.bursts:
            self.server.bursts = _tbf_bursts(RATE_BITS)
        total = (max(self.server.bursts, default=0) + PAST_BURST_BYTES) // CHUNK * CHUNK
        self.request.sendall(struct.pack("!Q", total))
        if kind == b"G":
            block = bytes(CHUNK)
            for _ in range(total // CHUNK):
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


def _result(cluster, namespace: str, name: str) -> dict | None:
    proc = cluster.kubectl("logs", name, "-n", namespace, check=False)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")] if proc.returncode == 0 else []
    return json.loads(lines[-1]) if lines else None


def test_bandwidth_annotations_cap_both_directions_of_a_pods_link(cluster, real_namespace, stream_server):
    rate = f"{RATE_BITS // 1_000_000}M"
    pod = python_pod("capped", PROBE.format(host=_nodeconfig.BRIDGE_IP, port=stream_server.server_address[1],
                                            chunk=CHUNK))
    pod["metadata"]["annotations"] = {"kubernetes.io/ingress-bandwidth": rate, "kubernetes.io/egress-bandwidth": rate}
    cluster.kubectl("apply", "-n", real_namespace, "-f", "-", input=yaml.safe_dump(pod))
    wait_for("the capped pod's streams", lambda: _result(cluster, real_namespace, "capped") is not None)

    result = _result(cluster, real_namespace, "capped")
    bursts = stream_server.bursts
    assert len(bursts) == 2, bursts  # the host end of its veth (ingress) and its ifb (egress)
    for direction in ("fetch", "upload"):  # ingress-bandwidth caps the fetch, egress-bandwidth the upload
        moved, total, seconds = result[direction]
        at_rate = (total - max(bursts)) * 8 / RATE_BITS
        assert moved == total
        assert seconds >= MIN_SHARE_OF_RATE_TIME * at_rate, (direction, result, bursts)
    cluster.kubectl("delete", "pod", "capped", "-n", real_namespace, "--wait=true")
    wait_for("its qdiscs to go with it", lambda: not _tbf_bursts(RATE_BITS))
