"""The coordinator service on an in-memory ``CoordinatorIO`` and a snapshot
store in a temporary directory: what it injects and publishes, when it
writes a manifest, and how declines, store failures, timeouts and other
generations' events are handled."""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

import pyarrow as pa
import pytest

from barriers.coordinator import CheckpointStatus
from barriers.failures import CheckpointFailure
from barriers.handler import CheckpointKind
from barriers.messages import BarrierRejected, ChannelId, decode
from operators import KeyedAggregate, count
from streaming.adapters.kafka.control.events import (
    Abort,
    Ack,
    Committed,
    ControlEvent,
    ControlKind,
    Decline,
    Progress,
    Ready,
)
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskCheckpointMetrics, TaskParts
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.settings import JobSettings
from streaming.engine import metrics
from streaming.engine.job.coordinator import CompletionHooks, CoordinatorIO, CoordinatorService, CoordinatorStart
from streaming.errors import StoreError
from streaming.testing import LineCollector

JOB = "svc"


def _pipeline() -> Pipeline:
    return Pipeline(
        JOB,
        (Ingress("orders", 2),),
        (Stage("count", ("orders",), lambda: KeyedAggregate("k", {"n": count()}), parallelism=2, sink=Sink()),),
    )


class MemoryIO:
    """The control topic and the ingress partitions, in memory."""

    def __init__(self):
        self.ends: dict[ChannelId, int] = {}
        self.injected: list[tuple[ChannelId, list[tuple[str, bytes]]]] = []
        self.published: list[ControlEvent] = []
        self.inbox: list[ControlEvent] = []
        self.closed = False

    def io(self) -> CoordinatorIO:
        return CoordinatorIO(inject=self._inject, publish=self.published.append, poll=self._poll, close=self._close)

    def _inject(self, markers):
        offsets = {}
        for channel, headers in markers.items():
            offsets[channel] = self.ends.get(channel, 10)
            self.ends[channel] = offsets[channel] + 1
            self.injected.append((channel, list(headers)))
        return offsets

    def _poll(self, timeout_s):
        events, self.inbox = self.inbox, []
        return events

    def _close(self):
        self.closed = True

    def kinds(self) -> list[ControlKind]:
        return [e.kind for e in self.published]


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def store(tmp_path: Path):
    with SnapshotStore(open_store(str(tmp_path / "store")), JOB, key=UNSIGNED) as snapshots:
        yield snapshots


_COLLECTORS: list[LineCollector] = []


@pytest.fixture(autouse=True)
def _detach_collectors():
    yield
    while _COLLECTORS:
        _COLLECTORS.pop().detach()


def _said() -> list[str]:
    """What the coordinator says to a person (its INFO lines) from now on."""
    collector = LineCollector(logger="streaming.engine.job.coordinator")
    collector.addFilter(lambda record: record.levelno == logging.INFO)
    _COLLECTORS.append(collector.attach())
    return collector.lines


def _service(store, memory, tmp_path, clock=None, **settings) -> tuple[CoordinatorService, list[str], list[int]]:
    said = _said()
    completed: list[int] = []
    service = CoordinatorService(
        _pipeline(),
        memory.io(),
        store,
        JobSettings(store=f"file://{tmp_path}/store", **settings),
        start=CoordinatorStart(generation=2, next_checkpoint_id=5),
        hooks=CompletionHooks(completed.append, tmp_path / "progress.jsonl"),
        job_key=UNSIGNED,
        **({"clock": clock} if clock else {}),
    )
    return service, said, completed


def _ack(store: SnapshotStore, task: str, checkpoint_id: int, generation: int = 2) -> ControlEvent:
    snapshot = store.write_task(
        checkpoint_id,
        generation,
        task,
        TaskParts(
            state={"state": pa.table({"k": ["a"], "n": [1]})},
            positions={f"orders:{task[-1]}": 7},
            metadata={"kind": "aligned"},
        ),
    )
    return Ack(
        checkpoint_id=checkpoint_id,
        task=task,
        generation=generation,
        snapshot=snapshot,
        metrics=TaskCheckpointMetrics(kind="aligned", state_bytes=9),
    )


def test_trigger_injects_barrier_n_into_every_ingress_partition_and_announces_it(store, tmp_path):
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path)
    barrier = service.trigger()
    assert barrier.checkpoint_id == 5 and barrier.generation == 2
    assert [c for c, _ in memory.injected] == [ChannelId("orders", 0), ChannelId("orders", 1)]
    # each partition's barrier names it: a copy on the other partition is refused there
    assert all(decode(headers, job=JOB, channel=c, key=UNSIGNED) == barrier for c, headers in memory.injected)
    with pytest.raises(BarrierRejected, match="written for channel 'orders:0'"):
        decode(memory.injected[0][1], job=JOB, channel=ChannelId("orders", 1), key=UNSIGNED)
    (trigger,) = memory.published
    assert trigger.kind is ControlKind.TRIGGER and trigger.checkpoint_id == 5
    assert trigger.offsets == {"orders:0": 10, "orders:1": 10}
    assert decode(trigger.barrier_headers(), job=JOB, key=UNSIGNED) == barrier
    assert "abs.sig" not in trigger.barrier and "abs.channel" not in trigger.barrier
    assert service.records[5].status is CheckpointStatus.PENDING
    assert service.trigger() is None  # one pending at a time (max_concurrent=1)
    assert len(memory.injected) == 2


def test_every_ack_then_the_manifest_then_complete(store, tmp_path):
    memory = MemoryIO()
    service, said, completed = _service(store, memory, tmp_path)
    service.trigger()
    memory.inbox = [_ack(store, "count-0", 5)]
    service.poll()
    assert store.completed() == [] and ControlKind.COMPLETE not in memory.kinds()
    memory.inbox = [_ack(store, "count-1", 5)]
    service.poll()
    assert store.completed() == [5]
    manifest = store.read_manifest(5)
    assert manifest.generation == 2 and set(manifest.tasks) == {"count-0", "count-1"}
    assert manifest.metrics["kinds"] == ["aligned"]
    assert manifest.metrics["tasks"]["count-0"]["state_bytes"] == 9
    assert manifest.metrics["ingress_barrier_offsets"] == {"orders:0": 10, "orders:1": 10}
    assert memory.kinds() == [ControlKind.TRIGGER, ControlKind.COMPLETE]
    assert service.records[5].status is CheckpointStatus.COMPLETED and completed == [5]
    assert [r.checkpoint_id for r in service.completed()] == [5]
    assert said == [f"checkpoint 5 complete in {service.records[5].duration_s:.2f} s (aligned)"]
    (line,) = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert json.loads(line)["checkpoint"] == 5


def test_a_decline_aborts_the_checkpoint_for_every_task(store, tmp_path):
    memory = MemoryIO()
    service, said, _ = _service(store, memory, tmp_path)
    service.trigger()
    memory.inbox = [
        Decline(
            checkpoint_id=5,
            task="count-1",
            generation=2,
            reason=CheckpointFailure.STORE_FAILURE,
            detail="disk full",
        )
    ]
    service.poll()
    abort = memory.published[-1]
    assert abort.kind is ControlKind.ABORT and abort.reason.name == "STORE_FAILURE"
    assert service.records[5].status is CheckpointStatus.ABORTED and "disk full" in service.records[5].reason
    assert said == ["checkpoint 5 aborted: the snapshot store failed (task count-1: disk full)"]
    assert service.trigger().checkpoint_id == 6  # the job goes on


def test_an_unknown_decline_reason_is_a_plain_decline(store, tmp_path):
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path)
    service.trigger()
    wire = {"kind": "decline", "checkpoint_id": 5, "task": "count-0", "payload": {"generation": 2, "reason": "NO_SUCH"}}
    memory.inbox = [ControlEvent.decode(json.dumps(wire).encode())]
    service.poll()
    assert memory.published[-1].reason.name == CheckpointFailure.DECLINED.name


def test_a_manifest_that_cannot_be_written_aborts(store, tmp_path):
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path)
    service.trigger()
    good = _ack(store, "count-0", 5)
    forged = Ack(checkpoint_id=5, task="count-1", generation=2)  # an acknowledgement that holds no snapshot
    memory.inbox = [good, forged]
    service.poll()
    assert store.completed() == []
    assert memory.published[-1].kind is ControlKind.ABORT
    assert memory.published[-1].reason.name == "STORE_FAILURE"
    assert "manifest not written" in service.records[5].reason


def test_a_checkpoint_past_its_timeout_is_aborted(store, tmp_path):
    memory, clock = MemoryIO(), Clock()
    service, _, _ = _service(store, memory, tmp_path, clock=clock, timeout_s=5)
    service.trigger()
    memory.inbox = [_ack(store, "count-0", 5)]
    service.poll()
    clock.now += 5
    service.poll()
    assert memory.published[-1].kind is ControlKind.ABORT and memory.published[-1].reason.name == "TIMEOUT"
    assert "count-1" in service.records[5].reason


def test_events_of_other_generations_are_ignored_and_readiness_is_counted(store, tmp_path):
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path)
    memory.inbox = [
        Ready(task="count-0", generation=2),
        Ready(task="count-1", generation=1),
    ]
    service.poll()
    assert service.ready == {"count-0"} and not service.all_ready
    service.trigger()
    memory.inbox = [
        _ack(store, "count-0", 5, generation=1),
        _ack(store, "count-1", 5, generation=1),
        Ready(task="count-1", generation=2),
    ]
    service.poll()
    assert store.completed() == [] and service.records[5].status is CheckpointStatus.PENDING
    assert service.all_ready


def test_sink_commits_are_recorded_and_close_closes_the_io(store, tmp_path):
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path)
    assert service.sink_tasks == {"count-0", "count-1"}
    service.trigger()
    memory.inbox = [
        _ack(store, "count-0", 5),
        _ack(store, "count-1", 5),
        Committed(checkpoint_id=5, task="count-0", generation=2, epochs=(5,)),
    ]
    service.poll()
    assert service.records[5].committed == {"count-0"}
    service.close()
    assert memory.closed


def test_the_manifest_and_the_progress_line_name_what_they_store(store, tmp_path):
    memory = MemoryIO()
    service, said, _ = _service(store, memory, tmp_path, mode="aligned-timeout", alignment_timeout_ms=200)
    service.trigger()
    memory.inbox = [_ack(store, "count-0", 5), _ack(store, "count-1", 5)]
    service.poll()
    options = {"alignment": "aligned", "alignment_timeout_ms": 200, "held_bytes_budget": None, "in_flight": "range"}
    manifest = store.read_manifest(5)
    assert manifest.options == options and manifest.metrics["kinds"] == ["aligned"]
    (line,) = (tmp_path / "progress.jsonl").read_text().splitlines()
    assert json.loads(line)["options"] == options and json.loads(line)["kinds"] == ["aligned"]
    assert service.records[5].kinds == (CheckpointKind.ALIGNED,)
    assert said == [f"checkpoint 5 complete in {service.records[5].duration_s:.2f} s (aligned)"]


def test_a_progress_line_or_a_retention_that_fails_is_logged_and_the_checkpoint_stays_complete(
    store, tmp_path, monkeypatch, caplog
):
    memory = MemoryIO()
    service, said, _ = _service(store, memory, tmp_path)
    steps: list[tuple[str, int]] = []
    service.completion.progress_log = tmp_path  # a directory: no line can be appended to it
    service.completion.on_complete = lambda checkpoint_id: steps.append(("on_complete", checkpoint_id))

    def refuse(retain: int, pinned: list[int]) -> list[int]:
        steps.append(("retention", retain))
        raise StoreError("the store said no")

    monkeypatch.setattr(store, "apply_retention", refuse)
    service.trigger()
    memory.inbox = [_ack(store, "count-0", 5), _ack(store, "count-1", 5)]
    with caplog.at_level(logging.INFO, logger="streaming.engine.job.coordinator"):
        service.poll()
    assert store.completed() == [5] and service.records[5].status is CheckpointStatus.COMPLETED
    assert memory.kinds() == [ControlKind.TRIGGER, ControlKind.COMPLETE] and len(said) == 1
    assert steps == [("on_complete", 5), ("retention", 3)]  # the callback, then retention, though the log failed
    progress, retention = (r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)
    assert progress.startswith(f"progress log {tmp_path}: ")
    assert retention == "checkpoint 5: retention failed (will retry next time): the store said no"
    assert service.trigger().checkpoint_id == 6  # the job goes on


def _decline(checkpoint_id: int, reason: CheckpointFailure = CheckpointFailure.DECLINED) -> ControlEvent:
    return Decline(checkpoint_id=checkpoint_id, task="count-0", generation=2, reason=reason, detail="no")


def _gauge(name: str) -> float | None:
    return metrics.REGISTRY.get_sample_value(name, {"job_name": JOB})


def test_failed_checkpoints_are_counted_in_a_row_until_one_completes(store, tmp_path):
    """Counted as the aborts say it on the control topic and the gauges show it."""
    metrics.failed_in_a_row(JOB, 7)  # an earlier generation's count: a new coordinator starts at 0
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path, tolerable_failed_checkpoints=5)
    assert (_gauge("spark_abs_checkpoints_failed_in_a_row"), _gauge("spark_abs_tolerable_failed_checkpoints")) == (0, 5)
    for checkpoint_id, reason in ((5, CheckpointFailure.DECLINED), (6, CheckpointFailure.STORE_FAILURE)):
        service.trigger()
        memory.inbox = [_decline(checkpoint_id, reason)]
        service.poll()
    assert service.failures.in_a_row == 2 and "checkpoint 6" in service.failures.last
    assert _gauge("spark_abs_checkpoints_failed_in_a_row") == 2
    service.trigger()
    memory.inbox = [_decline(7, CheckpointFailure.SUBSUMED)]  # not the job's failing: not counted
    service.poll()
    assert service.failures.in_a_row == 2
    aborts = [e for e in memory.published if isinstance(e, Abort)]
    assert [(a.checkpoint_id, a.failed_in_a_row, a.tolerable_failed_checkpoints) for a in aborts] == [
        (5, 1, 5),
        (6, 2, 5),
        (7, 2, 5),
    ]
    assert ControlEvent.decode(aborts[-1].encode()) == aborts[-1]
    service.trigger()
    memory.inbox = [_ack(store, "count-0", 8), _ack(store, "count-1", 8)]
    service.poll()
    assert service.records[8].status is CheckpointStatus.COMPLETED
    assert service.failures.in_a_row == 0 and _gauge("spark_abs_checkpoints_failed_in_a_row") == 0


def test_an_older_runners_abort_decodes_without_the_counts():
    wire = {"kind": "abort", "checkpoint_id": 4, "task": "", "payload": {"generation": 1, "reason": "TIMEOUT"}}
    abort = ControlEvent.decode(json.dumps(wire).encode())
    assert isinstance(abort, Abort) and abort.reason is CheckpointFailure.TIMEOUT
    assert (abort.failed_in_a_row, abort.tolerable_failed_checkpoints) == (None, None)


def test_barriers_kafka_does_not_take_abort_the_checkpoint_without_counting_it_and_the_runner_goes_on(store, tmp_path):
    from streaming.errors import KafkaUnavailableError

    memory = MemoryIO()

    def unreachable(*_):
        raise KafkaUnavailableError("Kafka did not take a marker within 10 s")

    io = memory.io()
    service = CoordinatorService(
        _pipeline(),
        CoordinatorIO(inject=unreachable, publish=unreachable, poll=io.poll, close=io.close),
        store,
        JobSettings(store=f"file://{tmp_path}/store"),
        start=CoordinatorStart(generation=2, next_checkpoint_id=5),
        job_key=UNSIGNED,
    )
    collector = LineCollector(logger="streaming.engine.job.coordinator").attach()
    _COLLECTORS.append(collector)
    assert service.trigger() is None  # neither the injection nor the abort's publication raises
    assert service.records[5].status is CheckpointStatus.ABORTED
    assert service.records[5].reason.startswith(CheckpointFailure.TRIGGER_FAILURE.value)
    assert service.failures.in_a_row == 0
    assert any("the job runner goes on" in line for line in collector.lines)
    assert service.trigger() is None and 6 in service.records  # 5 is not pending: the next one is tried


def test_retention_keeps_the_newest_checkpoint_that_verifies_when_newer_ones_do_not(store, tmp_path):
    """Checkpoint 5 verifies; 6, 7 and 8 complete without a part each (they
    cannot be restored).  Retention (keep 3) keeps 5 for a restore; once 9
    verifies, 5 goes."""
    memory = MemoryIO()
    service, _, completed = _service(store, memory, tmp_path, retain=3)
    for checkpoint_id in (5, 6, 7, 8, 9):
        service.trigger()
        memory.inbox = [_ack(store, task, checkpoint_id) for task in ("count-0", "count-1")]
        if checkpoint_id in (6, 7, 8):
            Path(store.layout.part(checkpoint_id, "count-1/state/state.parquet")).unlink()
        service.poll()
        if checkpoint_id == 8:
            assert store.completed() == [5, 6, 7, 8]
            assert store.latest_verified()[0].checkpoint_id == 5
    assert completed == [5, 6, 7, 8, 9]
    assert store.completed() == [7, 8, 9]


def test_only_a_tasks_newer_progress_is_a_sign_of_life(store, tmp_path):
    """A task's progress events are numbered: one numbered no higher than
    the last read (a copy appended again by someone who can write to the
    topic, or one numbered 0) keeps no frozen worker alive and moves no position."""
    clock = Clock()
    memory = MemoryIO()
    service, _, _ = _service(store, memory, tmp_path, clock=clock)
    # its Ready is its first word, once: silence counts from there, and a copy refreshes nothing
    ready = Ready(task="count-0", generation=2)
    memory.inbox = [ready]
    service.poll()
    assert service.heard_at == {"count-0": clock.now}
    clock.now += 10
    memory.inbox = [ready]
    service.poll()
    assert service.heard_at == {"count-0": clock.now - 10}
    progress = Progress(task="count-0", generation=2, positions={"orders:0": 4}, sequence=1)
    memory.inbox = [progress]
    service.poll()
    assert service.heard_at == {"count-0": clock.now} and service.positions["count-0"] == {"orders:0": 4}
    clock.now += 30
    memory.inbox = [progress, dataclasses.replace(progress, positions={"orders:0": 9}, sequence=0)]
    service.poll()
    assert service.heard_at == {"count-0": clock.now - 30} and service.positions["count-0"] == {"orders:0": 4}
    memory.inbox = [dataclasses.replace(progress, positions={"orders:0": 9}, sequence=2)]
    service.poll()
    assert service.heard_at == {"count-0": clock.now} and service.positions["count-0"] == {"orders:0": 9}
