"""Checkpoint-failure tolerance (``streaming.engine.job.checkpoint_failures``):
which failures count toward ``tolerable_failed_checkpoints`` (Flink's
``CheckpointFailureManager`` counts the same), how a completion resets the
count, and what the count's watcher hears."""

from __future__ import annotations

import pytest

from barriers.failures import CheckpointFailure
from streaming.engine.job.checkpoint_failures import COUNTED, CheckpointFailureTolerance


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize("failure", list(CheckpointFailure))
def test_only_declines_timeouts_and_store_failures_count(failure):
    seen: list[int] = []
    tolerance = CheckpointFailureTolerance(seen.append, Clock())
    tolerance.failed(7, failure, "why")
    counts = failure in {CheckpointFailure.DECLINED, CheckpointFailure.TIMEOUT, CheckpointFailure.STORE_FAILURE}
    assert (failure in COUNTED) is counts
    assert tolerance.in_a_row == (1 if counts else 0)
    assert seen == ([1] if counts else [])
    assert tolerance.last == (f"checkpoint 7: {failure.value} (why)" if counts else "")


def test_a_failure_without_a_reason_does_not_count():
    tolerance = CheckpointFailureTolerance()
    tolerance.failed(1, None, "no reason given")
    assert tolerance.in_a_row == 0 and tolerance.last == ""


def test_failures_count_in_a_row_until_a_checkpoint_completes():
    clock = Clock()
    seen: list[int] = []
    tolerance = CheckpointFailureTolerance(seen.append, clock)
    assert tolerance.since == 100.0  # no checkpoint completed since the generation started
    tolerance.failed(1, CheckpointFailure.TIMEOUT, "not complete")
    tolerance.failed(2, CheckpointFailure.SUBSUMED, "a newer one")  # not counted, and no reset either
    tolerance.failed(3, CheckpointFailure.DECLINED, "task a-0 declined")
    assert tolerance.in_a_row == 2 and seen == [1, 2]
    assert tolerance.last == f"checkpoint 3: {CheckpointFailure.DECLINED.value} (task a-0 declined)"
    clock.now = 130.0
    tolerance.completed()
    assert tolerance.in_a_row == 0 and seen == [1, 2, 0] and tolerance.since == 130.0
    clock.now = 140.0
    tolerance.completed()  # nothing to reset: the watcher hears nothing, the clock moves on
    assert seen == [1, 2, 0] and tolerance.since == 140.0
