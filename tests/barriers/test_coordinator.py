"""Coordinator bookkeeping: lifecycle, acks, declines, timeouts, retention,
restores and ids that keep growing across generations."""

from __future__ import annotations

import pytest

from barriers.coordinator import CheckpointCoordinator, CheckpointStatus, CompletedCheckpointStore, CoordinatorError
from barriers.failures import CheckpointFailure
from barriers.messages import CheckpointOptions


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def coordinator(**kwargs):
    clock = Clock()
    return CheckpointCoordinator(["a", "b"], job="j", clock=clock, **kwargs), clock


def test_a_checkpoint_completes_after_one_ack_per_task_and_its_manifest():
    coord, clock = coordinator()
    barrier = coord.trigger(CheckpointOptions.unaligned(), timestamp_ms=5)
    assert (barrier.checkpoint_id, barrier.generation, barrier.job) == (1, 0, "j")
    assert coord.acknowledge("a", 1, {"state": 1}) is None
    pending = coord.acknowledge("b", 1, {"state": 2})
    assert pending.status is CheckpointStatus.ACKNOWLEDGED
    clock.now += 2
    done, dropped = coord.complete(1)
    assert done.acks == {"a": {"state": 1}, "b": {"state": 2}}
    assert done.completed_at - done.triggered_at == 2 and dropped == []
    assert coord.pending == {} and coord.completed.latest() is done


def test_acks_that_do_not_count_are_ignored_with_a_reason():
    coord, _ = coordinator()
    coord.trigger()
    coord.acknowledge("a", 1)
    assert "duplicate" in coord.acknowledge("a", 1).reason
    assert "not a task" in coord.acknowledge("z", 1).reason
    assert "never triggered" in coord.acknowledge("a", 9).reason
    coord.abort(1, CheckpointFailure.USER)
    assert "no longer pending" in coord.acknowledge("b", 1).reason
    assert len(coord.ignored) == 4


def test_a_decline_aborts_with_its_reason():
    coord, _ = coordinator()
    coord.trigger()
    aborted = coord.decline("b", 1, CheckpointFailure.STORE_FAILURE, "s3 unreachable")
    assert aborted.status is CheckpointStatus.ABORTED
    assert aborted.failure is CheckpointFailure.STORE_FAILURE and aborted.failure_detail == "task b: s3 unreachable"
    with pytest.raises(CoordinatorError, match="not pending"):
        coord.complete(1)


def test_concurrency_limit_and_timeouts():
    coord, clock = coordinator(max_concurrent=2, timeout_s=10)
    coord.trigger()
    clock.now += 6
    coord.trigger()
    with pytest.raises(CoordinatorError, match="max_concurrent=2"):
        coord.trigger()
    clock.now += 5
    expired = coord.expire()
    assert [p.checkpoint_id for p in expired] == [1]
    assert expired[0].failure is CheckpointFailure.TIMEOUT and "['a', 'b']" in expired[0].failure_detail
    assert coord.can_trigger()


def test_completing_a_newer_checkpoint_subsumes_older_pending_ones():
    coord, _ = coordinator(max_concurrent=3)
    coord.trigger(), coord.trigger()
    coord.acknowledge("a", 2), coord.acknowledge("b", 2)
    coord.complete(2)
    assert [(p.checkpoint_id, p.failure) for p in coord.aborted] == [(1, CheckpointFailure.SUBSUMED)]


def test_complete_needs_every_ack():
    coord, _ = coordinator()
    coord.trigger()
    coord.acknowledge("a", 1)
    with pytest.raises(CoordinatorError, match="pending"):
        coord.complete(1)


def _complete(coord):
    barrier = coord.trigger()
    for task in sorted(coord.tasks):
        coord.acknowledge(task, barrier.checkpoint_id)
    return coord.complete(barrier.checkpoint_id)


def test_retention_keeps_the_last_k_and_never_a_pinned_one():
    coord, _ = coordinator(retain=2)
    dropped = [_complete(coord)[1] for _ in range(4)]
    assert dropped == [[], [], [1], [2]]
    assert coord.completed.ids == [3, 4]
    restored = coord.restore(3)
    assert _complete(coord)[1] == [] and coord.completed.ids == [3, 4, 5]
    assert _complete(coord)[1] == [4] and coord.completed.ids == [3, 5, 6]
    assert coord.release_restore(restored.checkpoint_id) == [3]


def test_restore_starts_a_new_generation_and_ids_keep_growing():
    coord, _ = coordinator()
    _complete(coord)
    coord.trigger()
    target = coord.restore()
    assert target.checkpoint_id == 1 and coord.generation == 1
    assert coord.aborted[-1].failure is CheckpointFailure.RESTORED
    barrier = coord.trigger()
    assert (barrier.checkpoint_id, barrier.generation) == (3, 1)


def test_restore_without_a_completed_checkpoint_says_so():
    coord, _ = coordinator()
    with pytest.raises(CoordinatorError, match="retained: none"):
        coord.restore()


def test_bad_settings_fail_fast():
    with pytest.raises(ValueError, match="at least one task"):
        CheckpointCoordinator([])
    with pytest.raises(ValueError, match="max_concurrent"):
        CheckpointCoordinator(["a"], max_concurrent=0)
    with pytest.raises(ValueError, match="retain"):
        CompletedCheckpointStore(0)
