"""Fixed loopback ports of the tests and benchmarks: one disjoint block per area, all below the ephemeral range.

Linux hands out outgoing-connection ports from 32768-60999 (``/proc/sys/net/ipv4/ip_local_port_range``), and
gloo, the Kubernetes client and kopf open many such connections, so a fixed port in that range can be taken at
random (EADDRINUSE). Every port a test or benchmark listens on comes from a block below, chosen by a fixed index
(never a pid or a free-port probe); a test needing several ports numbers them 0, 1, 2, ... in its block.

======================  ===========  ==================================================================
Block                   Ports        Used by
======================  ===========  ==================================================================
RUNTIME_RUNS            27000-27099  tests/runtime/conftest.py ``tiny_manifest``: torchrun, weightSync,
                                     2 trajectory intakes (4 per manifest, in session order, 25 per session)
RUNTIME_METRICS         27100-27109  tests/runtime/test_prometheus.py (trainer, evaluator)
AUTOSCALING_METRICS     27110-27119  tests/autoscaling/test_keda.py: the trainer's /metrics that KEDA reads (0)
RUNTIME_TORCHRUN        27120-27129  tests/runtime/test_torchrun_fork.py: torchrun's master port (one per run)
WEIGHTS_SYNC            27200-27219  tests/weights/: test_weight_sync (0-5), _relay (7, 14, 16, 17), _memory (6, 9),
                                     _liveness (10-13), _cadence (15), _dtype (18), _ack (19),
                                     _scale_down (8)
WEIGHTS_STATE           27220-27229  tests/weights/test_weight_state.py
WEIGHTS_VERSION_FLOOR   27230-27239  tests/weights/test_weight_version_floor.py (one per test)
WEIGHTS_IN_PLACE        27240-27249  tests/weights/test_weight_relay.py, receivers in place (0, 1)
WEIGHTS_DOUBLE_TREE     27250-27259  tests/weights/test_weight_double_tree.py (0-4)
WEIGHTS_TORCHRUN        27300-27309  tests/weights/test_weight_torchrun.py (master port, weight sync)
POLICY                  27400-27409  tests/policy/test_policy_group.py
BENCH_WEIGHT_SYNC       27500-27599  benchmarks/weight_sync.py default ``--port`` (2 per case)
OPERATOR                27600-27619  tests/operator/operator_cluster.py: health, metrics (2 per devcluster slot)
BENCH_NCCL              27700-27709  benchmarks/nccl_check.py default ``--port`` (3)
TRAJECTORIES            27800-27821  tests/trajectories/ (one or two per test, numbered in each file)
BENCH_FLEET             27900-27929  benchmarks/fleet_throughput.py: torchrun, weightSync, trajectories per run
BENCH_PEERS             27930-27969  benchmarks/peers.py: torchrun, weightSync, 2 trajectory intakes per run, reused
                                     every 10 runs
(devcluster)            28700-28899  devcluster/_ports.py: 20 per ``RLIGHTNING_DEVCLUSTER_SLOT`` 0..9
(defaults)              29500 29600  rlightning.contract torchrun, weight sync, trajectory intakes (29700,
                        29700 29701  29701): ``examples/cartpole.yaml`` as run unchanged by
                        9400         tests/cli/test_examples.py (one xdist group, so one at a time);
                        8080 9090    8080, 9090: the operator's health and metrics defaults
======================  ===========  ==================================================================

Ports bound with 0 (an OS-chosen port, e.g. the TCPStores of tests/policy and tests/runtime/test_resume.py)
need no entry. Importing this module checks that the blocks are disjoint, below 32768 and clear of the reserved
ports above (so a new block that overlaps fails every test at once).

Parallel sessions: each pytest-xdist worker (and each session started with its own ``RLIGHTNING_DEVCLUSTER_SLOT``)
runs on one devcluster slot (tests/conftest.py gives worker ``gwN`` the slot ``base + N``), and every block above
moves down by :data:`SLOT_SHIFT` ports per slot (slot 1: 26000-26929, ..., slot 9: 18000-18929), so two workers
never share a port. The check below covers every slot's layout.

Import it as ``from tests._ports import ...``: pytest puts the repository root on ``sys.path``
(``pythonpath = ["."]`` in pyproject.toml) and ``tests`` is then a namespace package; a benchmark run as a
script inserts the repository root itself.
"""

from __future__ import annotations

import dataclasses
import itertools

from devcluster import _ports as devcluster_ports
from rlightning import contract

EPHEMERAL_FIRST = 32768
"""First port of Linux's default ephemeral range (32768-60999)."""

SLOT_SHIFT = 1000
"""Ports every block moves down per devcluster slot (the blocks span less than this)."""


def slot_shift() -> int:
    """Return how far this session's blocks move: ``SLOT_SHIFT`` times its devcluster slot.

    Raises:
        ValueError: When ``RLIGHTNING_DEVCLUSTER_SLOT`` is not a slot (``devcluster_ports.slot_from_env``).
    """
    return SLOT_SHIFT * devcluster_ports.slot_from_env()


@dataclasses.dataclass(frozen=True)
class PortBlock:
    """A contiguous block of loopback ports owned by one area.

    Attributes:
        name (str): The area, for error messages.
        first (int): First port of the block.
        size (int): Number of ports.
    """

    name: str
    first: int
    size: int

    @property
    def last(self) -> int:
        """Last port of the block (inclusive)."""
        return self.first + self.size - 1

    def port(self, index: int) -> int:
        """Return the port at a fixed index of the block.

        Args:
            index (int): 0..size-1.

        Returns:
            int: ``first + index``, moved down by :func:`slot_shift`.

        Raises:
            IndexError: When the index lies outside the block (it would take another area's port).
        """
        if not 0 <= index < self.size:
            raise IndexError(
                f"port index {index} is outside block {self.name} ({self.first}-{self.last}, {self.size} ports): "
                "use fewer ports or widen the block in tests/_ports.py"
            )
        return self.first + index - slot_shift()

    def shifted(self, shift: int) -> PortBlock:
        """Return this block moved down by ``shift`` ports (its place in another slot)."""
        return PortBlock(self.name, self.first - shift, self.size)


RUNTIME_RUNS = PortBlock("RUNTIME_RUNS", 27000, 100)
RUNTIME_METRICS = PortBlock("RUNTIME_METRICS", 27100, 10)
AUTOSCALING_METRICS = PortBlock("AUTOSCALING_METRICS", 27110, 10)
RUNTIME_TORCHRUN = PortBlock("RUNTIME_TORCHRUN", 27120, 10)
WEIGHTS_SYNC = PortBlock("WEIGHTS_SYNC", 27200, 20)
WEIGHTS_STATE = PortBlock("WEIGHTS_STATE", 27220, 10)
WEIGHTS_VERSION_FLOOR = PortBlock("WEIGHTS_VERSION_FLOOR", 27230, 10)
WEIGHTS_IN_PLACE = PortBlock("WEIGHTS_IN_PLACE", 27240, 10)
WEIGHTS_DOUBLE_TREE = PortBlock("WEIGHTS_DOUBLE_TREE", 27250, 10)
WEIGHTS_TORCHRUN = PortBlock("WEIGHTS_TORCHRUN", 27300, 10)
POLICY = PortBlock("POLICY", 27400, 10)
BENCH_WEIGHT_SYNC = PortBlock("BENCH_WEIGHT_SYNC", 27500, 100)
OPERATOR = PortBlock("OPERATOR", 27600, 2 * (devcluster_ports.MAX_SLOT + 1))
BENCH_NCCL = PortBlock("BENCH_NCCL", 27700, 10)
TRAJECTORIES = PortBlock("TRAJECTORIES", 27800, 22)
BENCH_FLEET = PortBlock("BENCH_FLEET", 27900, 30)
BENCH_PEERS = PortBlock("BENCH_PEERS", 27930, 40)

BLOCKS = (
    RUNTIME_RUNS, RUNTIME_METRICS, AUTOSCALING_METRICS, RUNTIME_TORCHRUN, WEIGHTS_SYNC, WEIGHTS_STATE,
    WEIGHTS_VERSION_FLOOR, WEIGHTS_IN_PLACE, WEIGHTS_DOUBLE_TREE, WEIGHTS_TORCHRUN, POLICY, BENCH_WEIGHT_SYNC,
    OPERATOR, BENCH_NCCL, TRAJECTORIES, BENCH_FLEET, BENCH_PEERS,
)
"""Every block of the table above."""

RESERVED = (
    PortBlock(
        "devcluster", devcluster_ports.BASE_PORT, devcluster_ports.BLOCK_SIZE * (devcluster_ports.MAX_SLOT + 1)
    ),
    *(
        PortBlock(name, port, 1)
        for name, port in (
            ("contract.TORCHRUN_PORT", contract.TORCHRUN_PORT),
            ("contract.WEIGHT_SYNC_PORT", contract.WEIGHT_SYNC_PORT),
            ("contract.TRAJECTORY_PORT", contract.TRAJECTORY_PORT),
            ("contract.TRAJECTORY_PORT + 1", contract.TRAJECTORY_PORT + 1),
            ("contract.METRICS_PORT", contract.METRICS_PORT),
            ("contract.OPERATOR_HEALTH_PORT", contract.OPERATOR_HEALTH_PORT),
            ("contract.OPERATOR_METRICS_PORT", contract.OPERATOR_METRICS_PORT),
        )
    ),
)
"""Ports owned elsewhere: devcluster's slots and the defaults that examples/cartpole.yaml runs with."""


def check_layout(blocks: tuple[PortBlock, ...] = BLOCKS, reserved: tuple[PortBlock, ...] = RESERVED) -> None:
    """Fail when a block overlaps another block or a reserved port, or reaches the ephemeral range.

    Args:
        blocks (tuple[PortBlock, ...]): The blocks to check (default :data:`BLOCKS`).
        reserved (tuple[PortBlock, ...]): Ports they must avoid (default :data:`RESERVED`).

    Raises:
        ValueError: Naming the offending block(s).
    """
    for block in blocks:
        if block.last >= EPHEMERAL_FIRST:
            raise ValueError(f"block {block.name} ends at {block.last}: must stay below {EPHEMERAL_FIRST}")
    ordered = sorted(blocks + reserved, key=lambda b: b.first)
    for low, high in itertools.pairwise(ordered):
        if high.first <= low.last:
            raise ValueError(f"port blocks {low.name} ({low.first}-{low.last}) and {high.name} "
                             f"({high.first}-{high.last}) overlap")


for _slot in range(devcluster_ports.MAX_SLOT + 1):
    check_layout(tuple(block.shifted(SLOT_SHIFT * _slot) for block in BLOCKS))
