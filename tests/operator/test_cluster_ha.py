"""Two operator replicas with leader election: exactly one acts; the standby takes over when it is killed."""

from __future__ import annotations

import collections
import time

from devcluster._ports import slot_from_env
from rlightning import contract
from tests._ports import OPERATOR

from operator_cluster import OperatorProcess, apply, condition, get_json, items, small, wait_for

LEASE_DURATION_SECONDS = 15.0
"""The Lease's default duration (`OperatorSettings.lease_duration_seconds`), which these operators keep."""
TAKEOVER_BOUND_SECONDS = LEASE_DURATION_SECONDS + 2.0 + 10.0
"""Lease duration + one retry period + slack for a busy 2-core machine (kopf's start, the Lease requests)."""


def candidate(cluster, namespace, tmp_path, name: str, index: int) -> OperatorProcess:
    """An operator with leader election on the Lease in `namespace`, identity `name_<hex>`; metrics off (the
    OPERATOR block holds two ports per slot: one health port for each of the two)."""
    return OperatorProcess(
        cluster, namespace, tmp_path / f"{name}.log", ports=(OPERATOR.port(2 * slot_from_env() + index), 0),
        args=("--leader-elect",),
        env={"POD_ID": name, "RLIGHTNING_OPERATOR_LEASE_NAMESPACE": namespace},
    )


def holder(cluster, namespace) -> str:
    """The Lease's holderIdentity ("" when absent or released)."""
    leases = items(cluster, "leases", "-n", namespace)
    return next(((lease["spec"].get("holderIdentity") or "") for lease in leases
                 if lease["metadata"]["name"] == "rlightning-operator"), "")


def group_events(cluster, namespace) -> collections.Counter:
    """(reason, message) -> times posted, over every Event about PolicyGroups in the namespace."""
    posted: collections.Counter = collections.Counter()
    for event in items(cluster, "events", "-n", namespace, "--field-selector", f"involvedObject.kind={contract.KIND}"):
        posted[(event["reason"], event["message"])] += int(event.get("count") or 1)
    return posted


def evaluators_ready(cluster, namespace, count: int) -> bool:
    group = get_json(cluster, "pg", "cartpole", "-n", namespace)
    return condition(group, "Ready").get("status") == "True" and group["status"]["eval"]["ready"] == count


def test_one_replica_acts_and_the_standby_takes_over(crd, namespace, tmp_path):
    first = candidate(crd, namespace, tmp_path, "operator-a", 0).start()
    second = None
    try:
        wait_for("operator-a to hold the Lease", lambda: holder(crd, namespace).startswith("operator-a_"))
        second = candidate(crd, namespace, tmp_path, "operator-b", 1).start()
        assert second.health()[1]["role"] == "standby"
        apply(crd, namespace, small(replicas=2))
        wait_for("2 evaluators ready", lambda: evaluators_ready(crd, namespace, 2))
        posted = group_events(crd, namespace)
        created = [message for reason, message in posted if reason == "Created"]
        assert len(created) == 1 and created[0].count(", ") == 10, posted  # one Event naming the 11 children once
        assert all(count == 1 for count in posted.values()), posted
        assert "reconcile-create" not in second.log() and "cartpole: create" not in second.log()
        assert "watching pods" in first.log() and "watching pods" not in second.log(), "only the leader watches"
        status, body = second.health()
        assert status == 200 and body["role"] == "standby", body

        first.kill()
        killed = time.monotonic()
        wait_for("operator-b to hold the Lease", lambda: holder(crd, namespace).startswith("operator-b_"),
                 timeout=TAKEOVER_BOUND_SECONDS, interval=0.2)
        took_over = time.monotonic() - killed
        print(f"takeover: the standby held the Lease {took_over:.1f} s after the leader was killed")
        # The Lease shows the new holder as soon as its PUT lands, a moment before the process says it leads.
        wait_for("operator-b to say it leads", lambda: second.health()[1].get("role") == "leader")
        crd.kubectl("scale", "pg", "cartpole", "-n", namespace, "--replicas=3")
        wait_for("3 evaluators ready, scaled by operator-b", lambda: evaluators_ready(crd, namespace, 3))
        print(f"takeover: operator-b scaled {time.monotonic() - killed:.1f} s after the leader was killed")
        posted = group_events(crd, namespace)
        assert all(count == 1 for count in posted.values()), posted
        assert any(reason == "Scaled" for reason, _ in posted), posted
        assert "watching pods" in second.log()
        assert "Traceback" not in second.log()
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()
                print(f"--- {process.log_path.name} ---\n{process.log()[-8000:]}")


def test_a_clean_stop_hands_the_lease_over_at_once(crd, namespace, tmp_path):
    first = candidate(crd, namespace, tmp_path, "operator-a", 0).start()
    second = None
    try:
        wait_for("operator-a to hold the Lease", lambda: holder(crd, namespace).startswith("operator-a_"))
        second = candidate(crd, namespace, tmp_path, "operator-b", 1).start()
        assert first.stop() == 0
        stopped = time.monotonic()
        wait_for("operator-b to hold the Lease", lambda: holder(crd, namespace).startswith("operator-b_"),
                 timeout=LEASE_DURATION_SECONDS - 5.0, interval=0.2)
        print(f"handover after a clean stop: {time.monotonic() - stopped:.1f} s")
    finally:
        for process in (first, second):
            if process is not None:
                process.stop()
                print(f"--- {process.log_path.name} ---\n{process.log()[-8000:]}")
