"""What a task does at barrier n (``streaming.engine.task.controller``), driven
by a real ``BarrierHandler``, with the task's other parts as small recorded
fakes: the snapshot takes the state and the sink epoch after every record
sent is flushed, the barrier goes out after the event-time progress and is
announced, the acknowledgement hands the snapshot to the uploader, an
abort gives the epoch back and declines."""

from __future__ import annotations

import collections
import time
from types import SimpleNamespace

import pyarrow as pa
import pytest

from barriers.failures import CheckpointFailure
from barriers.handler import BarrierHandler, CheckpointKind, TaskCheckpoint
from barriers.lineage import Lineage
from barriers.messages import Barrier, BarrierRejected, ChannelId, decode
from operators.state import StateChanges
from streaming.adapters.kafka.control.events import Announce, Decline, announced_barrier
from streaming.engine.task.controller import TaskController, TaskWiring
from streaming.engine.task.gate import InputGate
from streaming.engine.task.record_errors import RecordErrors
from streaming.engine.task.replay import CopiedReplay
from streaming.engine.task.segments import Segmenter
from streaming.engine.task.uploads import Incremental
from streaming.errors import KafkaUnavailableError, SinkError, TaskError

A, B = ChannelId("in", 0), ChannelId("in", 1)
OUT = (ChannelId("spark-abs.job.count", 0), ChannelId("spark-abs.job.count", 1))
KEY = b"k" * 32
GENERATION = 3


class IO:
    """The task's I/O as the controller uses it: flush, append a barrier, publish an event."""

    def __init__(self, log: list):
        self.log = log
        self.events: list = []
        self.barriers: list = []
        self.fail_flush: Exception | None = None

    def flush(self) -> None:
        self.log.append("flush")
        if self.fail_flush is not None:
            raise self.fail_flush

    def append_barrier(self, markers) -> dict[ChannelId, int]:
        self.log.append("barrier")
        self.barriers.append(dict(markers))
        return {c: 100 + i for i, c in enumerate(markers)}

    def publish(self, event) -> None:
        self.log.append(event.kind.value)
        self.events.append(event)


class Output:
    """The task's output: its output channels and the sink epoch's rows."""

    def __init__(self, outputs):
        self.spec = SimpleNamespace(outputs=list(outputs))
        self.epoch_rows: list[pa.Table] = []
        self.given_back: list[list[pa.Table]] = []

    def take_epoch(self) -> list[pa.Table]:
        rows, self.epoch_rows = self.epoch_rows, []
        return rows

    def give_back(self, rows: list[pa.Table]) -> None:
        self.given_back.append(rows)
        self.epoch_rows = rows + self.epoch_rows


class Uploader:
    """The asynchronous phase: what was submitted, and whether a base is due."""

    def __init__(self, incremental: Incremental | None):
        self.incremental = incremental
        self.base = False
        self.submitted: list = []

    def wants_base(self) -> bool:
        return self.base

    def submit(self, checkpoint, taken) -> None:
        self.submitted.append((checkpoint, taken))


class Operator:
    """An operator's snapshot surface: its tables, and what changed since it was last asked."""

    def __init__(self):
        self.table = pa.table({"k": ["a"], "n": [1]})
        self.asked = 0

    def snapshot(self) -> dict[str, pa.Table]:
        return {"counts": self.table}

    def changes(self) -> dict[str, StateChanges]:
        self.asked += 1
        return {"counts": StateChanges(self.table.slice(0, self.asked % 2), pa.table({"k": pa.array([], pa.string())}))}


def _task(outputs=OUT, *, incremental: Incremental | None = None, inputs=(A, B), positions=None, errors=None):
    log: list = []
    io, output, uploader = IO(log), Output(outputs), Uploader(incremental)
    gate = InputGate("count-0", inputs, Segmenter([], GENERATION, Lineage()), collections.Counter())
    watermarks = SimpleNamespace(snapshot=lambda: {A: 5, B: 7})
    wiring = TaskWiring(Operator(), gate, output, watermarks, uploader, lambda: log.append("watermark"), errors)
    controller = TaskController("count-0", GENERATION, io, wiring, collections.Counter(), job_key=KEY)
    handler = BarrierHandler(controller, inputs, positions=positions, generation=GENERATION)
    controller.handler = handler
    return SimpleNamespace(
        controller=controller, handler=handler, io=io, output=output, uploader=uploader, gate=gate, log=log
    )


def _checkpoint(barrier: Barrier, positions=None) -> TaskCheckpoint:
    now = time.monotonic()
    return TaskCheckpoint(barrier, CheckpointKind.ALIGNED, positions or {A: 1, B: 1}, {}, now, now, now)


def _align(task, checkpoint_id: int, at: int = 0) -> Barrier:
    """Barrier ``checkpoint_id`` on both inputs at ``at``, through the handler."""
    barrier = Barrier(checkpoint_id, GENERATION, job="job")
    assert task.handler.barrier_received(A, barrier, at) is None
    assert task.handler.barrier_received(B, barrier, at) is None
    return barrier


def test_an_aligned_checkpoint_snapshots_forwards_a_signed_barrier_announces_it_and_hands_it_on():
    task = _task()
    task.output.epoch_rows = [pa.table({"n": [1, 2]})]
    task.gate.note_held(512)
    task.handler.record_processed(A, 0)
    barrier = Barrier(1, GENERATION, job="job")
    task.handler.barrier_received(A, barrier, 1)
    assert task.handler.blocked == {A} and task.log == []
    task.handler.barrier_received(B, barrier, 0)

    # what was sent before is in Kafka before the snapshot; the watermark goes before the barrier
    assert task.log == ["flush", "watermark", "flush", "barrier", "announce"]
    (markers,) = task.io.barriers
    assert tuple(markers) == OUT
    # each output's copy verifies on its own channel only
    for channel, headers in markers.items():
        assert decode(headers, job="job", key=KEY, channel=channel) == barrier
        other = next(c for c in OUT if c != channel)
        with pytest.raises(BarrierRejected, match="written for channel"):
            decode(headers, job="job", key=KEY, channel=other)
    (announce,) = task.io.events
    # the announcement carries the barrier's fields, and no signature a reader could copy onto a channel
    assert "abs.sig" not in announce.barrier and "abs.channel" not in announce.barrier
    assert announce == Announce(
        checkpoint_id=1,
        task="count-0",
        generation=GENERATION,
        barrier=announced_barrier(barrier),
        offsets={"spark-abs.job.count:0": 100, "spark-abs.job.count:1": 101},
    )
    ((checkpoint, taken),) = task.uploader.submitted
    assert checkpoint.checkpoint_id == 1 and dict(checkpoint.positions) == {A: 2, B: 1}
    assert taken.state == {"counts": task.controller.operator.table}
    assert [t.to_pylist() for t in taken.epoch] == [[{"n": 1}, {"n": 2}]] and task.output.epoch_rows == []
    assert taken.held_bytes_max == 512 and task.gate.take_held_max() == 0
    assert taken.watermarks == {A: 5, B: 7}
    assert taken.changes is None and taken.since is None and taken.replay_rest == {}
    assert taken.sync_snapshot_s >= 0 and abs(taken.snapshot_wall - time.time()) < 60
    assert set(taken.barrier_path) == {"forwarded"}
    assert task.handler.blocked == set() and task.handler.pending == ()


def test_a_task_without_outputs_takes_its_snapshot_and_forwards_nothing():
    task = _task(outputs=())
    _align(task, 1)
    assert task.log == ["flush"]  # flushed for the snapshot; no watermark, barrier or announcement
    assert task.io.barriers == [] and task.io.events == []
    assert len(task.uploader.submitted) == 1


def test_a_send_that_failed_fails_the_checkpoint_as_kafka_being_unavailable():
    task = _task()
    task.io.fail_flush = SinkError("record 7 of spark-abs.job.count:0 was not delivered")
    task.output.epoch_rows = [pa.table({"n": [1]})]
    with pytest.raises(KafkaUnavailableError, match=r"count-0: checkpoint 1: record 7 .* not delivered") as raised:
        task.controller.snapshot(Barrier(1, GENERATION, job="job"))
    assert isinstance(raised.value.__cause__, SinkError)
    with pytest.raises(KafkaUnavailableError, match="count-0: checkpoint 2"):
        task.controller.forward_barrier(Barrier(2, GENERATION, job="job"))
    assert "barrier" not in task.log and task.io.events == []  # no barrier after output that may be lost
    assert len(task.output.epoch_rows) == 1  # the epoch was not taken by a snapshot that failed


def test_a_snapshot_with_no_handler_driving_the_task_is_a_task_error():
    task = _task()
    task.controller.handler = None
    with pytest.raises(TaskError, match="checkpoint 4: no barrier handler drives the task"):
        task.controller.snapshot(Barrier(4, GENERATION, job="job"))


def test_an_abort_gives_the_epoch_to_the_next_and_declines():
    task = _task()
    rows = [pa.table({"n": [1]})]
    task.output.epoch_rows = list(rows)
    task.controller.snapshot(Barrier(1, GENERATION, job="job"))
    task.output.epoch_rows = [pa.table({"n": [2]})]  # the next epoch goes on meanwhile
    task.controller.abort(1, CheckpointFailure.SUBSUMED, "too slow")
    assert task.output.given_back == [rows]
    assert [t["n"].to_pylist() for t in task.output.epoch_rows] == [[1], [2]]
    assert task.io.events[-1] == Decline(
        checkpoint_id=1,
        task="count-0",
        generation=GENERATION,
        reason=CheckpointFailure.SUBSUMED,
        detail="too slow",
    )
    assert task.controller.counters["aborted"] == 1
    with pytest.raises(KeyError):  # what it took is gone: an aborted checkpoint is never acknowledged
        task.controller.acknowledge(_checkpoint(Barrier(1, GENERATION, job="job")))
    # an abort before the snapshot has no epoch to give back, and still declines
    task.controller.abort(2, CheckpointFailure.CANCELLED, "upstream")
    assert len(task.output.given_back) == 1
    assert [e.checkpoint_id for e in task.io.events if isinstance(e, Decline)] == [1, 2]
    assert task.controller.counters["aborted"] == 2


def test_incremental_snapshots_take_changes_since_the_previous_snapshot_and_a_base_when_due():
    task = _task(incremental=Incremental(base_every=5))
    operator = task.controller.operator
    for checkpoint_id in (1, 2, 3):
        if checkpoint_id == 3:
            task.uploader.base = True
        _align(task, checkpoint_id, at=checkpoint_id)
    first, second, third = (taken for _, taken in task.uploader.submitted)
    # the first takes the whole state: there is nothing to link changes to
    assert first.changes is None and first.state == {"counts": operator.table}
    # the next only what changed since the first (nothing whole)
    assert second.since == 1 and second.state == {} and set(second.changes) == {"counts"}
    # a base when the uploader wants one
    assert third.changes is None and third.state == {"counts": operator.table}
    # the changes were taken at every snapshot, a base's too: the next changes count from it
    assert operator.asked == 3


def test_a_state_put_back_since_the_last_snapshot_is_stored_whole_and_the_brake_counts_again():
    errors = RecordErrors("count-0")
    task = _task(incremental=Incremental(base_every=5), errors=errors)
    _align(task, 1, at=1)
    errors.processed(10)
    errors.rolled_back = True  # the operator was put back (operators.isolation)
    errors.isolate(A, 2, ValueError("bad"))
    _align(task, 2, at=2)
    _align(task, 3, at=3)
    first, second, third = (taken for _, taken in task.uploader.submitted)
    assert first.changes is None and second.changes is None  # whole: the changes since 1 are not all known
    assert third.since == 2 and set(third.changes) == {"counts"}
    assert errors.isolated == 0 and errors.records == 0


def test_without_incremental_snapshots_the_operators_changes_are_not_touched():
    task = _task()
    _align(task, 1)
    assert task.controller.operator.asked == 0


def test_the_first_barrier_path_of_a_checkpoint_goes_with_its_snapshot():
    task = _task()
    task.controller.barrier_path(1, appended=10.0, began=None, received=12.0)
    task.controller.barrier_path(1, appended=99.0, received=99.0)  # a later barrier of the same checkpoint
    _align(task, 1)
    ((_, taken),) = task.uploader.submitted
    assert taken.barrier_path.keys() == {"appended", "received", "forwarded"}
    assert (taken.barrier_path["appended"], taken.barrier_path["received"]) == (10.0, 12.0)


def _taken_path(task, checkpoint_id: int) -> dict[str, float]:
    """The barrier path checkpoint ``checkpoint_id``'s snapshot is handed on with."""
    barrier = Barrier(checkpoint_id, GENERATION, job="job")
    task.controller.snapshot(barrier)
    task.controller.acknowledge(_checkpoint(barrier))
    return task.uploader.submitted[-1][1].barrier_path


def test_a_barrier_of_a_checkpoint_started_already_or_aborted_leaves_no_path():
    task = _task()
    _align(task, 5)
    task.controller.barrier_path(3, appended=30.0)  # older than the newest started: stale
    assert _taken_path(task, 3) == {}
    task.controller.barrier_path(6, appended=60.0)
    task.controller.abort(6, CheckpointFailure.CANCELLED, "upstream")
    task.controller.barrier_path(6, appended=61.0)  # the abort forgot the first one
    assert _taken_path(task, 6) == {"appended": 61.0}


def test_only_the_newest_barrier_paths_of_checkpoints_never_started_are_kept():
    task = _task()
    for checkpoint_id in range(1, 41):
        task.controller.barrier_path(checkpoint_id, appended=float(checkpoint_id))
    assert [_taken_path(task, c) for c in (8, 9, 40)] == [{}, {"appended": 9.0}, {"appended": 40.0}]


def test_copied_channel_state_not_processed_yet_goes_into_the_snapshot():
    task = _task(inputs=(A,), positions={A: 7})
    copied = pa.table({"offset": pa.array([5, 6, 7, 8, 9], pa.int64()), "value": [b"x"] * 5})
    task.controller.copied = CopiedReplay({A: copied}, resume={A: 12})
    task.controller.snapshot(Barrier(1, GENERATION, job="job"))
    task.controller.acknowledge(_checkpoint(Barrier(1, GENERATION, job="job"), {A: 7}))
    ((_, taken),) = task.uploader.submitted
    (rest,) = taken.replay_rest.values()
    assert taken.replay_rest.keys() == {A}
    assert rest.records["offset"].to_pylist() == [7, 8, 9] and rest.kafka_from == 12
