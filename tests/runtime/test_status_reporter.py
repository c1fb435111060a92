"""Trainer rank 0's status.training patches: merge patch of the status subresource, rate-limited, never raising."""

from __future__ import annotations

from rlightning import contract
from rlightning.config import CheckpointReport, TrainingStatus
from rlightning.runtime._records import Recorder
from rlightning.runtime._status_reporter import StatusReporter
from rlightning.runtime.rundir import RunDir
from rlightning.runtime.settings import ProcessSettings


class FakeApi:
    def __init__(self, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.fail = fail

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        if self.fail:
            raise RuntimeError("403 Forbidden")
        return {}


def test_patches_status_training_in_camel_case_rate_limited() -> None:
    api = FakeApi()
    reporter = StatusReporter("cartpole", "team-a", min_interval=3600, api=api)
    status = TrainingStatus(iteration=3, env_steps=6144, weight_version=3, eval_return=21.5, consistent=True)
    assert reporter.report(status) is True
    assert reporter.report(status) is False  # within the interval
    assert reporter.report(status, force=True) is True
    args, kwargs = api.calls[0]
    assert args[:5] == (contract.API_GROUP, contract.API_VERSION, "team-a", contract.PLURAL, "cartpole")
    assert args[5] == {
        "status": {
            "training": {"attempt": 0, "iteration": 3, "envSteps": 6144, "weightVersion": 3, "evalReturn": 21.5,
                         "consistent": True, "droppedBatches": 0, "waitingForDataSeconds": None,
                         "consistentReason": None}
        }
    }  # fmt: skip
    assert kwargs["_content_type"] == "application/merge-patch+json"


def test_api_error_is_logged_not_raised(caplog) -> None:
    reporter = StatusReporter("cartpole", "team-a", min_interval=0, api=FakeApi(fail=True))
    assert reporter.report(TrainingStatus(iteration=1)) is False
    assert "403 Forbidden" in caplog.text


class AnsweringApi(FakeApi):
    """Answers each read and patch with the PolicyGroup carrying `request` as its checkpoint-request annotation."""

    def __init__(self) -> None:
        super().__init__()
        self.request: str | None = None

    def _group(self) -> dict:
        annotations = {} if self.request is None else {contract.ANNOTATION_CHECKPOINT_REQUEST: self.request}
        return {"metadata": {"annotations": annotations}, "status": {"training": {}}}

    def get_namespaced_custom_object_status(self, *args, **kwargs):
        return self._group()

    def patch_namespaced_custom_object_status(self, *args, **kwargs):
        super().patch_namespaced_custom_object_status(*args, **kwargs)
        return self._group()


def test_the_checkpoint_request_is_read_from_each_answer() -> None:
    api = AnsweringApi()
    reporter = StatusReporter("cartpole", "team-a", min_interval=0, api=api)
    api.request = "before the start"
    reporter.previous()
    assert reporter.checkpoint_request == "before the start"
    api.request = "t1 node n1 is cordoned"
    assert reporter.report(TrainingStatus(iteration=1)) is True
    assert reporter.checkpoint_request == "t1 node n1 is cordoned"
    api.request = None
    reporter.report(TrainingStatus(iteration=2))
    assert reporter.checkpoint_request is None


def test_a_last_checkpoint_is_patched_whole_so_a_null_request_clears_the_last() -> None:
    api = FakeApi()
    reporter = StatusReporter("cartpole", "team-a", min_interval=0, api=api)
    reporter.report(TrainingStatus(iteration=9, last_checkpoint=CheckpointReport(iteration=9, seconds=0.25)))
    args, _ = api.calls[0]
    assert args[5]["status"]["training"]["lastCheckpoint"] == {"iteration": 9, "seconds": 0.25, "request": None,
                                                               "writtenAt": None}


def test_rank_0_answers_each_new_request_once_and_none_from_before_its_start(tmp_path) -> None:
    settings = ProcessSettings(group_name="g", namespace="ns", spec_path=tmp_path / "spec.yaml", run_dir=tmp_path,
                               master_addr="127.0.0.1", weight_sync_port=0, metrics_port=0, report_status=True)
    recorder = Recorder(settings, RunDir(tmp_path).create())
    api = AnsweringApi()
    recorder.status = StatusReporter("g", "ns", min_interval=0, api=api)
    api.request = "asked of the attempt before"
    recorder.begin(0, 0, 0)
    assert recorder.checkpoint_asked() is None
    api.request = "node n1 is cordoned"
    recorder.waiting_for_data(1.0)  # any report brings the answer
    assert recorder.checkpoint_asked() == "node n1 is cordoned"
    assert recorder.checkpoint_asked() is None, "answered once"
    recorder.checkpoint(4, 0.5, "node n1 is cordoned")
    assert recorder.metrics.registry.get_sample_value("rlightning_checkpoint_seconds") == 0.5
    assert api.calls[-1][0][5]["status"]["training"]["lastCheckpoint"]["request"] == "node n1 is cordoned"
