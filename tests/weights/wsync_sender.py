"""A real trainer-like sender process for the tests: host the store, publish version 1 to ordinal 0, then idle.

Prints JSON lines on stdout ({"event": "published", ...}); idles (its heartbeat thread beating) until killed, so
a test can SIGSTOP it to simulate a trainer whose node vanished without closing its connections.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time

import torch

torch.set_num_threads(1)

from wsync_helpers import BUCKET_BYTES, wait_members, weights_for  # noqa: E402

from rlightning.config import WeightSyncConfig  # noqa: E402
from rlightning.weights import WeightSender  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--timeout", type=float, default=5.0)
    parser.add_argument("--log", action="store_true", help="log INFO and above to stderr")
    args = parser.parse_args()
    if args.log:
        logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    config = WeightSyncConfig(backend="gloo", bucket_size_bytes=BUCKET_BYTES, timeout_seconds=args.timeout)
    sender = WeightSender(config, "127.0.0.1", args.port)
    wait_members(sender, {0})
    stats = sender.publish(weights_for(1))
    print(json.dumps({"event": "published", "version": stats.version, "acked": stats.receivers_acked}), flush=True)
    while True:
        time.sleep(60.0)


if __name__ == "__main__":
    main()
