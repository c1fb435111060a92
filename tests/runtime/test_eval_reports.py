"""An evaluator's report pairs its evaluation episodes with the record of the weights that played them.

The receiving thread applies a version, acknowledges it, then digests it; the main thread may finish the
episodes of a report on that version before the digest is done. Posted then with the older record, the report
said "episodes of version 2, weights of version 1", and when it was the last one rank 0 read, the run ended with
"1 of 2 evaluators hold the final version". The evaluator runs in this process (its main loop on a thread) against a
real `WeightSender`; the digest of version 2 is held until the main thread has reported on version 2.
"""

from __future__ import annotations

import threading

import pytest
import torch

from rlightning import weights
from tests._polling import wait_for


@pytest.mark.timeout(120)
def test_a_report_on_episodes_of_a_version_carries_that_versions_record(
    evaluator_in_process, monkeypatch: pytest.MonkeyPatch
) -> None:
    evaluator, sender, runner = evaluator_in_process("reports")
    posted: list[tuple[int, float | None]] = []  # (record's version, episodes' return_version) of every post
    post = evaluator.receiver.report

    def report(applied: weights.WeightRecord, metrics: dict[str, float]) -> bool:
        posted.append((applied.version, metrics.get("return_version")))
        return post(applied, metrics)

    evaluator.receiver.report = report
    digest = weights.WeightRecord.of.__func__  # type: ignore[attr-defined]

    def late_digest(cls, version: int, state, digest_bytes: bool = True, cast: str | None = None):
        if version == 2 and threading.current_thread().name == "weight-receiver":
            # Past the report after the second episode of version 2 (episodesPerReport 2): the third has begun.
            wait_for("the main thread to report on version 2", lambda: evaluator.record.complete(2, 3), 30.0,
                     interval=0.01)
        return digest(cls, version, state, digest_bytes, cast)

    monkeypatch.setattr(weights.WeightRecord, "of", classmethod(late_digest))
    runner.start()
    wait_for("the evaluator to register", lambda: 0 in sender.members, 30.0, interval=0.05)
    state = {n: torch.full_like(t, 0.01) for n, t in weights.named_state(evaluator.policy).items()}
    assert sender.publish(state).receivers_acked == [0]
    assert sender.publish({n: t + 0.01 for n, t in state.items()}).receivers_acked == [0]

    def reported_on_2() -> bool:
        last = sender.reports().get(0)
        return last is not None and last.metrics.get("return_version") == 2.0

    wait_for("a report on version 2", reported_on_2, 30.0, interval=0.05)
    assert sender.reports()[0].applied.version == 2
    # Positive control: the main thread did finish a report on version 2 while the digest was held.
    assert evaluator.record.complete(2, 3)
    assert all(rv is None or rv <= version for version, rv in posted), posted
