"""A real evaluator-like receiver process for the tests: receive, stage, apply, report; JSON lines on stdout.

Exits when the sender closes, unless --keep-after-close. With --apply-in-receive the policy applies each
version inside `receive` (its `apply` hook: the acknowledgement means applied) and --fail-apply-version N makes
that apply raise for version N. --die-in-version N sends SIGKILL to itself in the
middle of receiving version N (after its first transfers), to test a receiver that dies mid-broadcast;
--die-in-apply-version N (with --apply-in-receive) kills it once version N is committed, before it acknowledges.
--leave-after-version N leaves cleanly once it applied version N (a scale-down: what an evaluator does on SIGTERM).
--in-place receives straight into the policy's tensors (`receive(into=...)`, buffer strategy `none`); a receive
that stops part way prints {"event": "torn"}.
A publish it refuses (an older epoch's) prints {"event": "refused"} with the version, its epoch and digests the
policy holds.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import time

import torch

torch.set_num_threads(1)

from wsync_helpers import Policy  # noqa: E402

from rlightning.config import WeightSyncConfig  # noqa: E402
from rlightning.weights import WeightReceiver, WeightRecord, named_state, tensor_digests  # noqa: E402
from rlightning.runtime._exit import exit_now  # noqa: E402
from rlightning.weights import _transport  # noqa: E402


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--ordinal", type=int, required=True)
    parser.add_argument("--lifetime", type=float, default=60.0)
    parser.add_argument("--group-size", type=int, default=2)
    parser.add_argument("--relay-trees", type=int, default=WeightSyncConfig().relay_trees, help="weightSync.relayTrees")
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--bucket-bytes", type=int, default=64 * 1024)
    parser.add_argument("--die-in-version", type=int, default=0)
    parser.add_argument("--apply-in-receive", action="store_true", help="apply through receive(apply=...)")
    parser.add_argument("--fail-apply-version", type=int, default=0)
    parser.add_argument("--die-in-apply-version", type=int, default=0)
    parser.add_argument("--raw", action="store_true", help="keep what arrives as is, with no policy (any model)")
    parser.add_argument("--dtype", default=None, help="weightSync.dtype: the policy holds floating tensors in it")
    parser.add_argument("--keep-after-close", action="store_true", help="wait for a restarted sender")
    parser.add_argument("--leave-after-version", type=int, default=0,
                        help="leave cleanly (as on SIGTERM in a pod) once this version is applied: a scale-down")
    parser.add_argument("--in-place", action="store_true", help="receive into the policy's tensors")
    parser.add_argument("--log", action="store_true", help="log INFO and above to stderr")
    return parser.parse_args()


def _die_in_version(receiver: WeightReceiver, version: int) -> None:
    """SIGKILL this process in the middle of receiving `version`: header and first bucket done, the rest in flight."""
    waits = {"n": 0}
    original = _transport.BroadcastGroup.wait_work

    def wait_work(self, work, deadline=None):
        if receiver.version == version - 1:
            waits["n"] += 1
            if waits["n"] == 3:
                print(json.dumps({"event": "dying"}), flush=True)
                os.kill(os.getpid(), signal.SIGKILL)
        return original(self, work, deadline)

    _transport.BroadcastGroup.wait_work = wait_work


def main() -> None:
    args = _arguments()
    if args.log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    config = WeightSyncConfig(
        backend="gloo", bucket_size_bytes=args.bucket_bytes, group_size=args.group_size, timeout_seconds=args.timeout,
        dtype=args.dtype, relay_trees=args.relay_trees,
    )
    receiver = WeightReceiver(config, "127.0.0.1", args.port, args.ordinal)
    policy = Policy()
    if args.dtype:
        policy.to(getattr(torch, args.dtype))  # a reduced-precision fleet: every floating tensor in it
    if args.die_in_version:
        _die_in_version(receiver, args.die_in_version)

    def apply(version: int, state: dict) -> None:
        if version == args.fail_apply_version:
            raise ValueError(f"refusing version {version}")
        if version == args.die_in_apply_version:  # everything arrived and was relayed; no acknowledgement
            print(json.dumps({"event": "dying"}), flush=True)
            os.kill(os.getpid(), signal.SIGKILL)
        if args.raw:
            print(json.dumps({"event": "applied", "version": version, "staged": True, "applied": version}), flush=True)
            return
        staged = policy.stage_weights(version, state)
        applied = policy.update_weights_from_buffer()
        receiver.report(WeightRecord.of(policy.weight_version, named_state(policy)), {"ordinal": float(args.ordinal)})
        print(json.dumps({"event": "applied", "version": version, "staged": staged, "applied": applied}), flush=True)

    class InPlace:
        """The policy as an in-place target (what `BasePolicy` provides, without a rollout gate: nothing rolls out)."""

        def receive_targets(self) -> dict:
            return named_state(policy)

        def begin_weight_receive(self, timeout: float) -> bool:
            return True

        def end_weight_receive(self, version: int | None) -> None:
            policy.weight_version = version or 0
            if version is None:
                print(json.dumps({"event": "torn"}), flush=True)

    print(json.dumps({"event": "started"}), flush=True)
    end = time.monotonic() + args.lifetime
    refused = 0
    while time.monotonic() < end:
        got = receiver.receive(
            timeout=1.0, apply=apply if args.apply_in_receive else None, into=InPlace() if args.in_place else None
        )
        if receiver.refused > refused:
            refused = receiver.refused
            print(json.dumps({"event": "refused", "version": policy.weight_version,
                              "epoch": receiver.epoch_of(policy.weight_version),
                              "digests": tensor_digests(named_state(policy))}), flush=True)
        if got is None:
            if receiver.sender_closed and not args.keep_after_close:
                break
            continue
        if args.in_place:
            record = WeightRecord.of(policy.weight_version, named_state(policy))
            receiver.report(record, {"ordinal": float(args.ordinal)})
            print(json.dumps({"event": "applied", "version": got[0], "staged": True, "applied": got[0]}), flush=True)
        elif not args.apply_in_receive:
            apply(*got)
        if args.leave_after_version and receiver.version >= args.leave_after_version:
            break
    receiver.close()
    print(json.dumps({"event": "exit"}), flush=True)
    exit_now(0)  # as the evaluator ends (`rlightning.runtime._exit`): no daemon thread resumed at finalization


if __name__ == "__main__":
    main()
