"""Trainer and evaluator metrics are served in Prometheus text format on the metrics port."""

from __future__ import annotations

import contextlib
import os
import threading
import urllib.request
from pathlib import Path

import pytest

from rlightning.runtime._prometheus import EvaluatorMetrics, TrainerMetrics
from tests._ports import RUNTIME_METRICS


def test_trainer_and_evaluator_metrics_are_served() -> None:
    port, evaluator_port = RUNTIME_METRICS.port(0), RUNTIME_METRICS.port(1)
    trainer = TrainerMetrics(port)
    trainer.weight_version.set(7)
    trainer.sync_bytes.inc(1024)
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    assert "rlightning_weight_version 7.0" in text
    assert "rlightning_weight_sync_bytes_total 1024.0" in text
    evaluator = EvaluatorMetrics(evaluator_port)
    evaluator.eval_return.set(475.5)
    text = urllib.request.urlopen(f"http://127.0.0.1:{evaluator_port}/metrics", timeout=10).read().decode()
    assert "rlightning_eval_return 475.5" in text


def _sockets() -> set[str]:
    """The sockets this process holds (`socket:[inode]` links of /proc/self/fd)."""
    links = set()
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # an fd closed meanwhile (the listing's own, another thread's)
            links.add(os.readlink(fd))
    return {link for link in links if link.startswith("socket:")}


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="reads the process's sockets from /proc")
def test_port_zero_serves_nothing() -> None:
    # prometheus-client would bind port 0 to a free port and serve from a thread: neither may appear.
    threads, sockets = set(threading.enumerate()), _sockets()
    metrics = TrainerMetrics(0)
    metrics.iteration.set(1)  # usable, just not exported
    assert metrics.registry.get_sample_value("rlightning_train_iteration") == 1.0
    assert set(threading.enumerate()) - threads == set()
    assert _sockets() - sockets == set()
