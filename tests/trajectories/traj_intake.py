"""A trainer rank stand-in: a real process reading batches through a `TrajectoryIntake` until killed.

Prints {"event": "held", "count"} (one JSON object per line) each time it holds more batches. Each fill wants one
batch plus `--room` more than it holds when called, so acknowledgements report a room > 0 with a large `--room`
(0 by default: every fill ends full).
"""

from __future__ import annotations

import argparse
import json

from rlightning.trajectories import TrajectoryIntake


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--room", type=int, default=0)
    args = parser.parse_args()
    intake = TrajectoryIntake(args.port, bind_host="127.0.0.1")
    reported = 0
    while True:
        intake.fill(intake.held + 1 + args.room, version=0, max_policy_lag=0, timeout=0.2)
        if intake.held > reported:
            reported = intake.held
            print(json.dumps({"event": "held", "count": reported}), flush=True)


if __name__ == "__main__":
    main()
