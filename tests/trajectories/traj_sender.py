"""An evaluator stand-in: a real process streaming stamped batches through a `TrajectorySender`.

Prints one JSON object per line: {"event": "sent", "sequence", "in_flight"} after each send,
{"event": "no_credit", "in_flight"} when `wait_for_credit` times out, and {"event": "done", "counts"} once every
batch is sent and acknowledged or counted lost (then exits 0). With `--count 0` it sends until killed. With
`--hold-version V` it answers a trainer's pull with `traj_helpers.held_state(V)` under version V. With
`--connected N` it sends nothing before N ranks are connected.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time

import traj_helpers

from rlightning.trajectories import BatchStamp, TrajectorySender


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--endpoints", required=True, help="comma-separated host:port")
    parser.add_argument("--ordinal", type=int, default=0)
    parser.add_argument("--count", type=int, default=1, help="batches to send; 0 = until killed")
    parser.add_argument("--credits", type=int, default=2)
    parser.add_argument("--ack-timeout", type=float, default=60.0)
    parser.add_argument("--versions", default="0", help="comma-separated stamp versions, cycled")
    parser.add_argument("--epochs", default="0", help="comma-separated stamp epochs (trainer attempts), cycled")
    parser.add_argument("--rows", type=int, default=4, help="batch size; float32 observation of 16 per row")
    parser.add_argument("--omit", default="", help="a key to leave out (an invalid batch for the trainer)")
    parser.add_argument("--credit-wait", type=float, default=0.5, help="seconds per wait_for_credit call")
    parser.add_argument("--deadline", type=float, default=60.0, help="seconds before giving up (exit 1)")
    parser.add_argument("--hold-version", type=int, default=None, help="answer pulls with this version's weights")
    parser.add_argument("--connected", type=int, default=0, help="ranks connected before the first send")
    args = parser.parse_args()

    versions = [int(v) for v in args.versions.split(",")]
    epochs = [int(e) for e in args.epochs.split(",")]
    held = None if args.hold_version is None else traj_helpers.held_state(args.hold_version)
    sender = TrajectorySender(args.endpoints.split(","), args.ordinal, args.credits, args.ack_timeout,
                              held_weights=None if held is None else lambda: (args.hold_version, held))
    deadline = time.monotonic() + args.deadline
    while sender.connected < args.connected:  # until then the connected ranks take every batch
        if time.monotonic() > deadline:
            sys.exit(f"sender {args.ordinal}: {args.connected} ranks not connected within {args.deadline}s")
        time.sleep(0.02)
    sequence = 0
    while args.count == 0 or sequence < args.count:
        if time.monotonic() > deadline:
            sys.exit(f"sender {args.ordinal}: no credit within {args.deadline}s")
        if not sender.wait_for_credit(args.credit_wait):
            emit(event="no_credit", in_flight=sender.in_flight)
            continue
        sequence += 1
        version = versions[(sequence - 1) % len(versions)]
        batch = traj_helpers.make_batch(args.ordinal, sequence, args.rows, omit=args.omit)
        stamp = BatchStamp(version, args.ordinal, sequence, env_steps=args.rows,
                           episode_returns=(float(sequence),), episode_lengths=(sequence,),
                           epoch=epochs[(sequence - 1) % len(epochs)])
        sender.send(batch, stamp)
        emit(event="sent", sequence=sequence, in_flight=sender.in_flight)
    while sender.in_flight and time.monotonic() < deadline:
        sender.wait_for_credit(args.credit_wait)
    emit(event="done", counts=dataclasses.asdict(sender.counts), in_flight=sender.in_flight)
    sender.close()


def emit(**fields: object) -> None:
    print(json.dumps(fields), flush=True)


if __name__ == "__main__":
    main()
