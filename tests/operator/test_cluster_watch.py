"""Connections to the API server that go silent (no reset): the operator recovers within the bound, or its
liveness endpoint fails, or, as the leader, it exits before a standby may act."""

from __future__ import annotations

import json
import time

import pytest

from rlightning import contract

from operator_cluster import OperatorProcess, apply, condition, get_json, small, wait_for
from tcp_proxy import SilencingProxy

FAST = {
    # Small bounds, so that the test takes seconds: the defaults (30, 45, 30, 60) behave the same, slower.
    "RLIGHTNING_OPERATOR_WATCH_SERVER_TIMEOUT_SECONDS": "8",
    "RLIGHTNING_OPERATOR_WATCH_CLIENT_TIMEOUT_SECONDS": "10",
    "RLIGHTNING_OPERATOR_API_TIMEOUT_SECONDS": "4",
    "RLIGHTNING_OPERATOR_API_SILENCE_LIMIT_SECONDS": "8",
    "RLIGHTNING_OPERATOR_HEARTBEAT_SECONDS": "1",
}
SLACK_SECONDS = 20.0
"""Room for a busy 2-core machine: kopf's relisting, a reconcile, kwok running pods."""


@pytest.fixture
def proxy(crd):
    silencing = SilencingProxy(SilencingProxy.target_of(crd.kubeconfig))
    yield silencing
    silencing.close()


def through(crd, namespace, tmp_path, proxy, *args: str, **env: str) -> OperatorProcess:
    kubeconfig = proxy.kubeconfig(crd.kubeconfig, tmp_path / "proxied.kubeconfig")
    return OperatorProcess(crd, namespace, tmp_path / "operator.log", args=args, env={**FAST, **env},
                           kubeconfig=kubeconfig)


def evaluators_ready(crd, namespace, count: int) -> bool:
    group = get_json(crd, "pg", "cartpole", "-n", namespace)
    return condition(group, "Ready").get("status") == "True" and group["status"]["eval"]["ready"] == count


def freeze_once_ready(crd, namespace, proxy) -> float:
    """Apply a group of 2 evaluators, wait until they are ready, freeze every open connection; when (monotonic)."""
    apply(crd, namespace, small(replicas=2))
    wait_for("2 evaluators ready", lambda: evaluators_ready(crd, namespace, 2))
    assert proxy.freeze_open() > 0
    return time.monotonic()


def test_watches_frozen_without_a_reset_are_made_again_within_the_bound(crd, namespace, tmp_path, proxy):
    operator = through(crd, namespace, tmp_path, proxy).start()
    try:
        frozen = freeze_once_ready(crd, namespace, proxy)
        crd.kubectl("scale", "pg", "cartpole", "-n", namespace, "--replicas=3")  # directly, not through the proxy
        bound = float(FAST["RLIGHTNING_OPERATOR_WATCH_CLIENT_TIMEOUT_SECONDS"]) + SLACK_SECONDS
        wait_for("the scale to be handled through new connections", lambda: evaluators_ready(crd, namespace, 3),
                 timeout=bound)
        print(f"quiet watch: the scale was handled {time.monotonic() - frozen:.1f} s after the freeze")
        assert operator.health()[0] == 200
    finally:
        operator.stop()
        print(operator.log()[-8000:])


def test_pod_events_during_a_frozen_pod_watch_are_delivered_by_the_watch_made_again(crd, namespace, tmp_path, proxy):
    # Only the pod watch can tell a crash loop (the StatefulSet counts the pod unready, no pass lists pods), so the
    # status names it only if the operator's own pod watch was made again and resumed where it stopped.
    operator = through(crd, namespace, tmp_path, proxy).start()
    try:
        frozen = freeze_once_ready(crd, namespace, proxy)
        crashing = {"status": {
            "conditions": [{"type": "Ready", "status": "False", "reason": "ContainersNotReady"}],
            "containerStatuses": [{
                "name": "eval", "image": contract.DEFAULT_IMAGE, "imageID": "", "ready": False, "restartCount": 3,
                "state": {"waiting": {"reason": "CrashLoopBackOff"}},
                "lastState": {"terminated": {"exitCode": 2, "reason": "Error"}}}]}}
        crd.kubectl("patch", "pod", "cartpole-eval-0", "-n", namespace, "--subresource=status", "--type=merge",
                    "-p", json.dumps(crashing))  # directly, not through the proxy
        bound = float(FAST["RLIGHTNING_OPERATOR_WATCH_CLIENT_TIMEOUT_SECONDS"]) + SLACK_SECONDS

        def crash_loop_named() -> bool:
            evaluators = condition(get_json(crd, "pg", "cartpole", "-n", namespace), "EvaluatorsReady")
            return evaluators.get("reason") == "CrashLoopBackOff" and "cartpole-eval-0" in evaluators["message"]
        wait_for("the crash loop named through a new pod watch", crash_loop_named, timeout=bound)
        print(f"frozen pod watch: the crash loop was named {time.monotonic() - frozen:.1f} s after the freeze")
    finally:
        operator.stop()
        print(operator.log()[-8000:])


def test_liveness_fails_while_the_api_server_is_silent_and_recovers(crd, namespace, tmp_path, proxy):
    operator = through(crd, namespace, tmp_path, proxy).start()
    try:
        proxy.blackhole()
        silenced = time.monotonic()
        limit = float(FAST["RLIGHTNING_OPERATOR_API_SILENCE_LIMIT_SECONDS"])
        status, body = wait_for("/healthz to fail", lambda: (lambda h: h if h[0] == 500 else None)(operator.health()),
                                timeout=limit + SLACK_SECONDS, interval=0.2)
        failed_after = time.monotonic() - silenced
        print(f"silent API server: /healthz failed after {failed_after:.1f} s ({body})")
        assert failed_after >= limit - 1.0 and body["apiSilenceSeconds"] >= limit  # rounded to the ms
        proxy.restore()
        wait_for("/healthz to pass again", lambda: operator.health()[0] == 200, timeout=SLACK_SECONDS)
        assert operator.process.poll() is None
    finally:
        operator.stop()
        print(operator.log()[-8000:])


RENEW_DEADLINE_SECONDS, LEASE_DURATION_SECONDS = 5.0, 15.0
"""The leader exits once it could not renew for the deadline; a standby may act after the lease duration (the
default), so a leader that exits later than that is a defect, whatever the load. A deadline a third of the duration
leaves that bound at least 2x what a loaded machine measured (see the test)."""


def test_a_leader_cut_off_exits_before_a_standby_may_act(crd, namespace, tmp_path, proxy):
    operator = through(crd, namespace, tmp_path, proxy, "--leader-elect",
                       RLIGHTNING_OPERATOR_LEASE_NAMESPACE=namespace,
                       RLIGHTNING_OPERATOR_RENEW_DEADLINE_SECONDS=str(RENEW_DEADLINE_SECONDS),
                       RLIGHTNING_OPERATOR_LEASE_DURATION_SECONDS=str(LEASE_DURATION_SECONDS)).start()
    try:
        wait_for("the operator to lead", lambda: operator.health()[1].get("role") == "leader")
        proxy.blackhole()
        silenced = time.monotonic()
        code = wait_for("the leader to exit", lambda: operator.process.poll(),
                        timeout=LEASE_DURATION_SECONDS + SLACK_SECONDS, interval=0.2)
        exited_after = time.monotonic() - silenced
        print(f"leader cut off: exited with {code} after {exited_after:.1f} s")
        assert code == 1 and exited_after < LEASE_DURATION_SECONDS  # no standby acted yet; measured 4.8 s idle
        assert "lost the Lease" in operator.log()
    finally:
        operator.stop()
        print(operator.log()[-8000:])
