"""`consistent` is a verdict on what was compared: null with a reason when no evaluator's report was checked (no
evaluator at all), never true; summary.json, the Prometheus gauges and status.training all say so."""

from __future__ import annotations

import json

import pytest

from rlightning.policy._consistency import Consistency
from rlightning.runtime import report
from rlightning.runtime._fleet import final_consistency
from rlightning.runtime._records import IterationRow
from test_records_continuity import DATA, one_iteration, recorder

CASES = [
    ("no evaluator", Consistency(None, [], {}, []), 0, None, report.NOT_COMPARED),
    ("expected evaluators, none reported", Consistency(None, [], {}, []), 2, None, report.NOT_COMPARED),
    ("every expected one on the final version", Consistency(True, [0, 1], {}, [0, 1]), 2, True, None),
    ("one behind the final version", Consistency(True, [0, 1], {}, [0]), 2, False,
     "1 of 2 evaluators hold the final version"),
    ("a tensor differs", Consistency(False, [0], {0: ["w", "b"]}, [0]), 1, False,
     "evaluators differ from the trainer (ordinal: tensors) {0: 2}"),
]


@pytest.mark.parametrize(("name", "checked", "expected", "verdict", "reason"), CASES, ids=[c[0] for c in CASES])
def test_final_verdict(name, checked, expected, verdict, reason) -> None:
    assert final_consistency(checked, expected) == (verdict, reason)


def gauge(made, name: str) -> float | None:
    return made.metrics.registry.get_sample_value(name)


def test_nothing_compared_is_null_with_a_reason_everywhere(tmp_path) -> None:
    made, api = recorder(tmp_path, 0, {})
    assert gauge(made, "rlightning_eval_compared") == 0.0
    one_iteration(made, 1, 100, 1)  # no evaluator report checked
    assert (api.patches[-1]["consistent"], api.patches[-1]["consistentReason"]) == (None, report.NOT_COMPARED)
    assert gauge(made, "rlightning_eval_compared") == 0.0
    made.iteration(IterationRow(iteration=2, env_steps=200, train_return=None, eval_return=None, eval_version=None,
                                weight_version=2, consistent=True, evaluators=(0,), train_stats={}, data=DATA))
    assert (api.patches[-1]["consistent"], api.patches[-1]["consistentReason"]) == (True, None)
    assert (gauge(made, "rlightning_eval_compared"), gauge(made, "rlightning_eval_consistent")) == (1.0, 1.0)
    # The evaluator is gone by the end: nothing is compared, and the explicit null clears the earlier `true`.
    verdict, reason = final_consistency(Consistency(None, [], {}, []), 0)
    made.summary(stop_reason="total_env_steps", iterations=2, env_steps=200, weight_version=2,
                 final_eval_return=None, final_eval_version=None, final_train_return=None, target_eval_return=None,
                 reached_target=False, consistent=verdict, consistent_reason=reason)
    summary = json.loads(made.run_dir.summary_path.read_text())
    assert (summary["consistent"], summary["consistent_reason"]) == (None, report.NOT_COMPARED)
    assert (api.patches[-1]["consistent"], api.patches[-1]["consistentReason"]) == (None, report.NOT_COMPARED)
    assert gauge(made, "rlightning_eval_compared") == 0.0
