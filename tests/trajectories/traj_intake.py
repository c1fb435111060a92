"""A trainer rank stand-in: a real process reading batches through a `TrajectoryIntake` until killed.

Prints {"event": "held", "count"} (one JSON object per line) each time it holds one more batch.
"""

from __future__ import annotations

import argparse
import json

from rlightning.trajectories import TrajectoryIntake


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    args = parser.parse_args()
    intake = TrajectoryIntake(args.port, bind_host="127.0.0.1")
    while True:
        if intake.fill(intake.held + 1, version=0, max_policy_lag=0, timeout=1.0):
            print(json.dumps({"event": "held", "count": intake.held}), flush=True)


if __name__ == "__main__":
    main()
