"""Trainer rank 0's status.training patches: merge patch of the status subresource, rate-limited, never raising."""

from __future__ import annotations

from rlightning import contract
from rlightning.config import TrainingStatus
from rlightning.runtime._status_reporter import StatusReporter


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
