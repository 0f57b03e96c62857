"""When a job that runs is not live (``streaming.engine.job.liveness``):
failed checkpoints in a row past the tolerable number, a worker alive but
silent while the runner hears Kafka, a worker never ready; and that silence
during a broker outage blames nobody."""

from __future__ import annotations

import logging

import pytest

from barriers.failures import CheckpointFailure
from streaming.engine.job.checkpoint_failures import CheckpointFailureTolerance
from streaming.engine.job.liveness import READY_BOUND_S, DueRestore, Liveness, Verdict, WaitingRestore
from streaming.errors import JobFailed, StoreError


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kafka:
    """The probe: raises while Kafka is away."""

    def __init__(self):
        self.up = True
        self.asked = 0

    def __call__(self) -> None:
        self.asked += 1
        if not self.up:
            raise ConnectionError("no broker answers")


WORKERS = {"all": ["a-0", "b-0"]}


@pytest.fixture
def clock() -> Clock:
    return Clock()


def _liveness(clock: Clock, kafka: Kafka, tolerable: int = 2) -> Liveness:
    return Liveness(tolerable, 15.0, kafka, clock, failing_for_s=60.0)


def test_more_failed_checkpoints_in_a_row_than_tolerable_restore_and_a_completion_resets_the_count(clock):
    seen: list[int] = []
    failed = CheckpointFailureTolerance(seen.append, clock)
    liveness = _liveness(clock, Kafka())
    ready = {"a-0", "b-0"}
    for checkpoint_id in (1, 2):
        failed.failed(checkpoint_id, CheckpointFailure.TIMEOUT, "not complete")
    clock.now += 120
    heard = {"a-0": clock.now, "b-0": clock.now}
    assert liveness.verdict(failed, WORKERS, heard, ready) is None  # two is tolerable
    failed.completed()
    assert failed.in_a_row == 0
    for checkpoint_id in (3, 4, 5):
        failed.failed(checkpoint_id, CheckpointFailure.DECLINED, "store away")
    failed.failed(6, CheckpointFailure.SUBSUMED, "")  # not counted
    failed.failed(7, CheckpointFailure.TRIGGER_FAILURE, "")  # not counted
    clock.now += 10
    heard = {"a-0": clock.now, "b-0": clock.now}
    # declines come fast: past tolerable, the job restores once none completed for the checkpoint timeout too
    assert liveness.verdict(failed, WORKERS, heard, ready) is None
    clock.now += 50
    heard = {"a-0": clock.now, "b-0": clock.now}
    verdict = liveness.verdict(failed, WORKERS, heard, ready)
    assert verdict is not None and verdict.cause == "checkpoints_failing"
    assert "3 checkpoints failed in a row" in verdict.reason and "none completed for 60 s" in verdict.reason
    assert "checkpoint 5" in verdict.reason
    assert seen == [1, 2, 0, 1, 2, 3]  # what the metric shows


def test_a_short_broker_outage_the_runner_only_met_in_its_own_sends_blames_nobody(clock):
    """Kafka away for 20 s between two looks, answering at both: the runner's
    sends found it away (``lost``) and its step waited (``deaf``), so the
    silence counts from when it listened again."""
    kafka = Kafka()
    liveness = _liveness(clock, kafka)
    ready = {"a-0", "b-0"}
    heard = {"a-0": clock.now, "b-0": clock.now}
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    clock.now += 20  # a trigger waited 10 s, its abort 10 s more: Kafka away meanwhile
    liveness.lost()
    liveness.deaf()
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    assert liveness.hearing_since == clock.now  # asked again at once, and it answers
    clock.now += 10
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    clock.now += 6  # 16 s after the runner heard again, nobody: now that is a stuck worker
    verdict = liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready)
    assert verdict is not None and verdict.cause == "worker_stuck"


def test_an_outage_the_runner_sent_nothing_through_is_found_by_asking_kafka_once_a_worker_is_quiet(clock):
    """Kafka away 13 s while a checkpoint is pending (the runner sends
    nothing, so no send of its own finds Kafka away): a worker quiet for a
    few seconds makes the runner ask Kafka, which finds the outage; the
    worker's silence counts from Kafka's return, and its first progress 5 s
    after it is in time.  Asked only once the worker was quiet: it had
    blamed the worker 15 s after its last progress, Kafka answering by then."""
    kafka = Kafka()
    liveness = _liveness(clock, kafka)
    ready = {"a-0", "b-0"}
    heard = {"a-0": clock.now, "b-0": clock.now}
    for second in range(1, 19):  # a step a second
        kafka.up = not 1 <= second <= 13
        clock.now += 1
        assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None, second
    assert kafka.asked >= 3  # while the worker was quiet, every few seconds
    heard["a-0"] = clock.now  # its producer back, 5 s after Kafka
    clock.now += 10
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None


def test_a_runner_that_did_not_listen_for_a_while_counts_silence_from_when_it_does_again(clock):
    liveness = _liveness(clock, Kafka())
    ready = {"a-0", "b-0"}
    heard = {"a-0": clock.now, "b-0": clock.now}
    clock.now += 30  # a long step (a retention's verification, a slow store): nothing read meanwhile
    liveness.deaf()
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None


def test_a_worker_silent_while_kafka_answers_is_stuck(clock):
    kafka = Kafka()
    liveness = _liveness(clock, kafka)
    ready = {"a-0", "b-0"}
    heard = {"a-0": clock.now, "b-0": clock.now}
    clock.now += 10
    heard["a-0"] = clock.now  # one task heard is enough
    clock.now += 10
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    clock.now += 10  # 20 s since a-0 was heard
    verdict = liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready)
    assert verdict == Verdict(
        "worker_stuck",
        "worker all is alive but stuck: none of its tasks heard for 20 s while the control topic worked "
        "(heartbeat_timeout_s 15)",
    )
    asked = kafka.asked
    for _ in range(10):  # a step five times a second: Kafka is asked every few seconds, not at each
        liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready)
    assert kafka.asked == asked


def test_silence_while_kafka_is_away_blames_nobody_and_is_counted_from_when_it_answers_again(clock):
    kafka = Kafka()
    liveness = _liveness(clock, kafka)
    ready = {"a-0", "b-0"}
    heard = {"a-0": clock.now, "b-0": clock.now}
    kafka.up = False
    for _ in range(40):  # 200 s of outage
        clock.now += 5
        assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    kafka.up = True
    clock.now += 5
    assert (
        liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    )  # hears again: counted from now
    clock.now += 10
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready) is None
    clock.now += 10  # 20 s after Kafka answered again, still nobody heard
    verdict = liveness.verdict(CheckpointFailureTolerance(), WORKERS, heard, ready)
    assert verdict is not None and verdict.cause == "worker_stuck"


def test_a_worker_whose_tasks_are_not_ready_is_judged_by_the_ready_bound(clock):
    liveness = _liveness(clock, Kafka())
    liveness.launched()
    clock.now += READY_BOUND_S - 1
    assert liveness.verdict(CheckpointFailureTolerance(), WORKERS, {}, {"a-0"}) is None
    clock.now += 2
    verdict = liveness.verdict(CheckpointFailureTolerance(), WORKERS, {}, {"a-0"})
    assert verdict is not None and verdict.cause == "worker_stuck" and "tasks b-0 not ready" in verdict.reason


def test_a_restore_that_waits_pauses_longer_each_time_up_to_a_limit():
    due = DueRestore(Verdict("worker_died", "worker all died"), since=0.0)
    assert [due.failed(0.0) for _ in range(7)] == [2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]
    assert due.attempts == 7 and due.retry_at == 30.0


class _Restores:
    """What a waiting restore drives: the restore itself (failing while ``away``), the kill, the clock."""

    def __init__(self):
        self.away: Exception | None = None
        self.restored: list[str] = []
        self.killed = 0
        self.slept: list[float] = []

    def restore(self, verdict: Verdict) -> None:
        if self.away is not None:
            raise self.away
        self.restored.append(verdict.cause)

    def kill_all(self) -> None:
        self.killed += 1


def _waiting(clock: Clock, restores: _Restores, hears: bool = True) -> WaitingRestore:
    return WaitingRestore(
        "j", restores.restore, restores.kill_all, lambda: hears, "127.0.0.1:9092", 60.0, logging.getLogger("t"), clock
    )


def test_a_restore_that_can_run_runs_at_once_and_leaves_nothing_due(clock):
    restores = _Restores()
    waiting = _waiting(clock, restores)
    waiting.attempt(Verdict("worker_died", "worker all died"))
    assert restores.restored == ["worker_died"] and waiting.due is None and restores.killed == 0


def test_a_restore_kafka_or_the_store_refuses_waits_with_its_workers_killed_then_runs(clock):
    restores = _Restores()
    restores.away = StoreError("the store does not answer")
    waiting = _waiting(clock, restores)
    waiting.attempt(Verdict("worker_died", "worker all died"))
    assert waiting.due is not None and waiting.due.attempts == 1 and restores.killed == 1
    waiting.retry(sleep=restores.slept.append)  # its pause (2 s) is not over: a short pause, no attempt
    assert restores.slept == [0.2] and waiting.due.attempts == 1
    restores.away = None
    clock.now += 2.0
    waiting.retry(sleep=restores.slept.append)
    assert restores.restored == ["worker_died"] and waiting.due is None


def test_kafka_that_does_not_answer_keeps_the_restore_due_and_it_fails_the_job_past_its_bound(clock):
    restores = _Restores()
    waiting = _waiting(clock, restores, hears=False)
    waiting.attempt(Verdict("worker_lost", "group b went silent"))
    assert restores.restored == [] and waiting.due is not None and restores.killed == 1
    clock.now += 61.0
    with pytest.raises(JobFailed, match=r"waited 61 s for Kafka and the store, more than restore_wait_s \(60 s\)"):
        waiting.retry(sleep=restores.slept.append)
