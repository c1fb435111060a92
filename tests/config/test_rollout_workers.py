"""`eval.rolloutWorkers`: env shards of an evaluator in async rollout mode, checked against the mode and numEnvs."""

from __future__ import annotations

import pytest

from rlightning.config import ManifestError, parse_manifest


def _document(policy: dict, eval_: dict) -> dict:
    spec = {"env": {"id": "CartPole-v1", "numEnvs": 4}, "policy": policy, "eval": eval_}
    return {"apiVersion": "rlightning.io/v1alpha1", "kind": "PolicyGroup", "metadata": {"name": "w"}, "spec": spec}


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [("sync", None, 1), ("sync", 1, 1), ("async", None, 4), ("async", 2, 2), ("async", 4, 4)],
)
def test_workers_default_to_one_per_env_copy_in_async_mode(mode: str, workers: int | None, expected: int) -> None:
    spec = parse_manifest(_document({"rolloutMode": mode}, {"rolloutWorkers": workers})).spec
    assert spec.eval_rollout_workers() == expected


@pytest.mark.parametrize(
    ("mode", "workers", "expected"),
    [
        ("sync", 2, "spec.eval.rolloutWorkers: more than 1 needs policy.rolloutMode async, got 2"),
        ("async", 5, "spec.eval.rolloutWorkers: at most env.numEnvs (4; each worker steps"),
        ("async", 0, "spec.eval.rolloutWorkers: Input should be greater than or equal to 1"),
    ],
)
def test_workers_that_do_not_fit_are_rejected_naming_the_field(mode: str, workers: int, expected: str) -> None:
    with pytest.raises(ManifestError) as raised:
        parse_manifest(_document({"rolloutMode": mode}, {"rolloutWorkers": workers}))
    assert any(line.startswith(expected) for line in raised.value.problems), raised.value.problems
