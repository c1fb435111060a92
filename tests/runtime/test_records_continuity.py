"""What trainer rank 0 exports never goes back at a gang restart: the weight version gauge holds the resumed version
before the first publish, and status.training and the gauges count iterations and env steps over every attempt."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlightning.runtime._records import Carried, DataFigures, IterationRow, Recorder
from rlightning.runtime._status_reporter import StatusReporter
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings

DATA = DataFigures(env_steps_per_second=100.0, trainer_idle_fraction=0.0, policy_lag_mean=None, policy_lag_max=None,
                   dropped_batches=0, update_seconds=0.1)


class FakeApi:
    """status.training as the previous attempt left it; records the patches."""

    def __init__(self, training: dict) -> None:
        self.training = training
        self.patches: list[dict] = []

    def get_namespaced_custom_object_status(self, *args, **kwargs):
        return {"status": {"training": self.training}}

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        self.patches.append(args[5]["status"]["training"])
        return {}


def recorder(tmp_path: Path, attempt: int, previous: dict, metrics_port: int = 0) -> tuple[Recorder, FakeApi]:
    settings = ProcessSettings(group_name="g", namespace="ns", spec_path=tmp_path / "spec.yaml", run_dir=tmp_path,
                               master_addr="127.0.0.1", weight_sync_port=0, metrics_port=metrics_port,
                               report_status=True, attempt=attempt)
    made = Recorder(settings, RunDir(tmp_path).create())
    api = FakeApi(previous)
    made.status = StatusReporter("g", "ns", min_interval=0, api=api)
    return made, api


def gauges(made: Recorder) -> tuple[float | None, ...]:
    names = ("rlightning_weight_version", "rlightning_train_iteration", "rlightning_train_env_steps")
    return tuple(made.metrics.registry.get_sample_value(name) for name in names)


def one_iteration(made: Recorder, iteration: int, env_steps: int, version: int) -> None:
    made.iteration(IterationRow(iteration=iteration, env_steps=env_steps, train_return=None, eval_return=None,
                                eval_version=None, weight_version=version, consistent=None, evaluators=(),
                                train_stats={}, data=DATA))


PREVIOUS = {"attempt": 0, "iteration": 47, "envSteps": 58880, "weightVersion": 47}


# (name, attempt, previous report, start (iteration, env steps, version), first export (version, iteration, env
# steps, attempt env steps), after one iteration)
CASES = [
    ("restart without a checkpoint: from the previous attempt's report", 1, PREVIOUS, (0, 0, 47),
     (47, 47, 58880, 0), (48, 61440, 2560)),
    ("restart from a checkpoint older than the last report: the version does not go back", 1, PREVIOUS,
     (40, 51200, 40), (47, 47, 58880, 0), (48, 61440, 2560)),
    ("first attempt: a report of the same attempt carries nothing", 0, PREVIOUS, (0, 0, 0),
     (0, 0, 0, 0), (1, 2560, 2560)),
    ("no report yet", 1, {}, (40, 51200, 40), (40, 40, 51200, 0), (41, 53760, 2560)),
]


@pytest.mark.parametrize(("name", "attempt", "previous", "start", "first", "after"), CASES, ids=[c[0] for c in CASES])
def test_counts_continue_across_attempts(tmp_path, name, attempt, previous, start, first, after):
    made, api = recorder(tmp_path, attempt, previous)
    iteration, env_steps, held = start
    version, *first = first
    assert made.begin(iteration, env_steps, held) == version, "the next publish goes above it"
    assert gauges(made) == (version, first[0], first[1]), "exported before the first publish: nothing at 0"
    assert made.metrics.registry.get_sample_value("rlightning_train_attempt") == attempt  # the gang's restarts
    report = api.patches[-1]
    assert (report["attempt"], report["iteration"], report["envSteps"], report["attemptEnvSteps"]) == (attempt, *first)
    assert report["weightVersion"] == version and report["updatedAt"]
    one_iteration(made, iteration + 1, env_steps + 2560, version + 1)
    report = api.patches[-1]
    assert (report["iteration"], report["envSteps"], report["attemptEnvSteps"]) == after
    assert gauges(made) == (version + 1, after[0], after[1])


def test_carried_is_never_negative():
    assert Carried.from_report({"attempt": 0, "iteration": 3, "envSteps": 100}, 1, 10, 1000) == Carried(0, 0)
    assert Carried.from_report({"iteration": 3, "envSteps": 100}, 2, 0, 0) == Carried(3, 100)  # no attempt: 0


def test_an_unreadable_status_carries_nothing(tmp_path, caplog):
    made, _ = recorder(tmp_path, 1, {})
    made.status = StatusReporter("g", "ns", min_interval=0, api=object())  # no such method: an API error
    made.begin(5, 640, 5)
    assert made.carried == Carried() and gauges(made) == (5, 5, 640)
    assert "could not read status.training" in caplog.text


def test_metrics_are_served_only_once_they_hold_the_resumed_state(tmp_path, monkeypatch):
    made, _ = recorder(tmp_path, 1, PREVIOUS, metrics_port=9100)
    served: list[tuple[int, tuple[float | None, ...]]] = []
    monkeypatch.setattr(made.metrics, "serve", lambda port: served.append((port, gauges(made))))
    made.begin(40, 51200, 40)
    assert served == [(9100, (47.0, 47.0, 58880.0))], "the first scrape reads the run's version, never less"
