"""The API server restarts five times in a row (SIGKILL, then started again: every watch ends with its connection
reset or refused; `devcluster.Cluster.restart_api_server`); after each, a new PolicyGroup is Ready and a
`kubectl scale` shows in status within `BOUND_SECONDS` of the API answering again, and the operator's log says when
each of its watches reconnected or listed again and how long it was down. The figures are printed for
docs/measurements.md."""

from __future__ import annotations

import re
import time

from operator_cluster import apply, condition, get_json, small, wait_for

RESTARTS = 5
BOUND_SECONDS = 15.0
"""What the issue allows from the API answering again (its /readyz) to the new group Ready and the scale in status."""
RECONNECTED = re.compile(r"watch of (\S+) in .* (?:reconnected|listing again) after ([\d.]+) s down")


def ready(crd, namespace: str, name: str, evaluators: int) -> bool:
    group = get_json(crd, "pg", name, "-n", namespace)
    return condition(group, "Ready").get("status") == "True" and \
        (group.get("status") or {}).get("eval", {}).get("ready") == evaluators


def test_after_each_of_five_api_server_restarts_a_new_group_is_ready_and_a_scale_shows_within_the_bound(
    crd, namespace, operator,
):
    apply(crd, namespace, small("scaled", replicas=1))
    wait_for("group scaled Ready", lambda: ready(crd, namespace, "scaled", 1))
    figures = []
    for restart in range(RESTARTS):
        killed = time.monotonic()
        answered = crd.restart_api_server()
        replicas = restart + 2
        apply(crd, namespace, small(f"new-{restart}", replicas=1))
        crd.kubectl("scale", "pg", "scaled", "-n", namespace, f"--replicas={replicas}")
        seen: dict[str, float] = {}

        def both(restart=restart, replicas=replicas, seen=seen, answered=answered) -> bool:
            for name, evaluators in ((f"new-{restart}", 1), ("scaled", replicas)):
                if name not in seen and ready(crd, namespace, name, evaluators):
                    seen[name] = time.monotonic() - answered
            return len(seen) == 2

        wait_for(f"restart {restart + 1}: group new-{restart} Ready and scaled at {replicas} evaluators ready",
                 both, timeout=BOUND_SECONDS, interval=0.2)
        figures.append((answered - killed, seen[f"new-{restart}"], seen["scaled"]))
    for number, (down, new, scaled) in enumerate(figures, 1):
        print(f"restart {number}: API down {down:.1f} s; after it answered: new group Ready {new:.1f} s, "
              f"scale in status {scaled:.1f} s")
    reconnects = RECONNECTED.findall(operator.log())
    assert {kind for kind, _ in reconnects} >= {"pods", "jobs", "statefulsets", "policygroups"}, reconnects
