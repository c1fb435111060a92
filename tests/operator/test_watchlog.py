"""Each watch stream's loss, reconnect and listing again is one INFO line with how long it was down."""

from __future__ import annotations

import logging

import yarl

from rlightning_operator._watchlog import StreamLog, describe

PODS = "https://api:6443/api/v1/namespaces/ns/pods"
GROUPS = "https://api:6443/apis/rlightning.io/v1alpha1/policygroups"


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_stream_down_then_answered_logs_its_loss_and_its_reconnect_with_the_time_down(caplog):
    clock = Clock()
    log = StreamLog(clock)
    watch = yarl.URL(f"{PODS}?watch=true&resourceVersion=7")
    with caplog.at_level(logging.INFO, logger="rlightning_operator._watchlog"):
        log.answered(yarl.URL(f"{PODS}?limit=500"))  # the first listing: nothing to say
        log.answered(watch)  # a watch that was never down: nothing to say
        log.failed(watch, "ConnectionRefusedError")
        clock.now += 3.0
        log.failed(watch, "HTTP 503")  # the same outage
        clock.now += 4.5
        log.answered(watch)
        log.failed(watch, "ConnectionResetError")
        clock.now += 2.0
        log.answered(yarl.URL(f"{PODS}?limit=500"))  # 410 Gone, or a stream that failed: listed again
        log.answered(yarl.URL(f"{PODS}?limit=500&continue=abc"))  # its second page
        log.answered(yarl.URL(f"{PODS}/pod-0"))  # a read of one object is no stream
    assert [record.getMessage() for record in caplog.records] == [
        "watch of pods in namespace ns lost: ConnectionRefusedError",
        "watch of pods in namespace ns reconnected after 7.5 s down",
        "watch of pods in namespace ns lost: ConnectionResetError",
        "watch of pods in namespace ns listing again after 2.0 s down",
    ]


def test_streams_are_told_apart_by_collection():
    assert describe(yarl.URL(PODS)) == "pods in namespace ns"
    assert describe(yarl.URL(GROUPS)) == "policygroups in the cluster"
    assert describe(yarl.URL("https://api:6443/api/v1/nodes")) == "nodes in the cluster"
