"""A stage task: the barrier handler of ``barriers`` driven by the micro-batches
of one Structured Streaming query.

Each micro-batch goes through the task's input gate (``gate``: segments per
channel, handed out round-robin from the channels the handler has not
blocked, so a blocked channel's records are held while the others go on).
Data segments go down the data path (``processing``: decoded, malformed
records to the dead-letter topic with their reason, run through the
operator, and the output on, ``output``: routed to the task's output
partitions, or kept for the sink's current epoch).  Control segments (barriers, cancellations) go to the
handler, which calls back the task's ``controller`` at barrier n (snapshot,
forward, acknowledge through the ``uploads`` in the background).

A task is built, then ``recover``-ed (its operator state restored; copied
channel state handed over in runs once it runs, ``replay``, so checkpoints
go on meanwhile), then fed.  Beside it: ``segments`` (cutting
batches, skipping what an older generation wrote after a restore) and
``watermarks`` (event-time progress)."""

from __future__ import annotations

import collections
import concurrent.futures
import itertools
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from barriers.handler import BarrierHandler
from barriers.lineage import Lineage
from barriers.messages import (
    Barrier,
    BarrierRejected,
    CancelBarrier,
    ChannelId,
    Unsigned,
    decode,
)
from operators.isolation import said
from streaming.adapters.kafka.control.events import ControlEvent, Progress, Replayed
from streaming.adapters.serde.records import (
    BATCH_BEGAN,
    HANDED,
    kafka_time,
    stamp_of,
    stamped,
)
from streaming.api.pipeline import Pipeline, TaskSpec
from streaming.api.settings import JobSettings
from streaming.engine.kafka_retention import AtRisk
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.controller import TaskController, TaskWiring
from streaming.engine.task.gate import InputGate
from streaming.engine.task.inbox import ControlInbox
from streaming.engine.task.output import TaskOutput
from streaming.engine.task.processing import RecordProcessor
from streaming.engine.task.quarantine import Quarantine
from streaming.engine.task.record_errors import RecordErrors
from streaming.engine.task.replay import RUN_RECORDS as REPLAY_RUN_RECORDS
from streaming.engine.task.replay import CopiedReplay, RestoredChannelState
from streaming.engine.task.segments import Segment, Segmenter, SegmentKind, SegmentPace
from streaming.engine.task.uploads import Incremental, SnapshotUploader
from streaming.engine.task.watermarks import WatermarkTracker, event_time_inputs
from streaming.errors import RecordsFailed, SparkAbsError, TaskError

__all__ = ["StageTask", "TaskStart", "TaskIO", "TaskOptions"]

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TaskStart:
    """Where a task starts: its generation, the checkpoint it restores (None
    for a fresh start), each channel's offset and the operator state."""

    generation: int = 0
    checkpoint_id: int | None = None
    positions: Mapping[ChannelId, int] = field(default_factory=dict)
    state: Mapping[str, pa.Table] = field(default_factory=dict)
    watermarks: Mapping[ChannelId, int] = field(default_factory=dict)
    # the restores this generation descends from: which records of older
    # generations are stale (skipped) and which are channel state (replayed)
    lineage: Lineage = field(default_factory=Lineage)
    # copied channel state to process before anything the query reads
    replay: Mapping[ChannelId, pa.Table] = field(default_factory=dict)
    # channel state kept as offset ranges: the query reads each channel again up to here
    replay_until: Mapping[ChannelId, int] = field(default_factory=dict)
    # where the query resumes each channel whose channel state was copied (after the barrier)
    resume: Mapping[ChannelId, int] = field(default_factory=dict)


@dataclass(frozen=True)
class TaskOptions:
    """How a task runs, from its job's settings (``streaming.engine.worker.wiring``
    makes them; a test sets what it tries)."""

    # checkpoints in progress at once (JobSettings.max_concurrent)
    max_concurrent: int = 1
    # unaligned channel state copied into the snapshot, not kept as offset ranges
    copy_in_flight: bool = False
    # the longest run of data records a segment holds
    max_segment_records: int = 50_000
    # segments cut to take about this long to process (None: by record count alone)
    segment_ms: float | None = None
    # memory the records held while aligning may take before they spill
    held_memory_bytes: int = 256 << 20
    # incremental snapshots (None: every snapshot holds the whole state)
    incremental: Incremental | None = None
    # copied channel state replayed in runs of this many records
    replay_run_records: int = REPLAY_RUN_RECORDS
    # the job's barrier key: barriers signed and checked with it (UNSIGNED, said explicitly: neither)
    job_key: bytes | Unsigned = field(kw_only=True)
    # the most bytes one Arrow record of an internal topic may take decompressed (JobSettings.max_decoded_bytes)
    max_decoded_bytes: int = JobSettings.default("max_decoded_bytes")
    # what a record the stage's code raises on does, and the brake (JobSettings.record_errors,
    # max_isolated_records, max_isolated_share)
    record_errors: str = JobSettings.default("record_errors")
    max_isolated_records: int = JobSettings.default("max_isolated_records")
    max_isolated_share: float = JobSettings.default("max_isolated_share")
    # records an operator named to skip into the dead letters (JobSettings.skip_records, parsed)
    skip_records: tuple[tuple[ChannelId, int, int], ...] = ()


@dataclass
class TaskIO:
    """What a task talks to, given to it so the processing core stays testable:
    ``send(channel, key, value, headers)`` for output records, ``append_barrier``
    ({channel: headers}) -> offsets, ``publish(ControlEvent)``, ``dead_letter``
    (channel, offset, key, value, headers, reason, notes), ``write_snapshot`` (the
    store's ``write_task``), ``stage_epoch(epoch, table)`` for sink tasks."""

    send: Callable[[ChannelId, bytes | None, bytes, list[tuple[str, bytes]]], None]
    append_barrier: Callable[[Mapping[ChannelId, list[tuple[str, bytes]]]], Mapping[ChannelId, int]]
    publish: Callable[[ControlEvent], Any]
    dead_letter: Callable[
        [ChannelId, int, bytes | None, bytes | None, list[tuple[str, bytes]], str, list[tuple[str, bytes]]], None
    ]
    write_snapshot: Callable[..., Any]
    stage_epoch: Callable[[int, pa.Table], Any] | None = None
    flush: Callable[[], None] = lambda: None
    # (channel, start, end, timeout_s=) -> the records at [start, end), read from Kafka in bulk
    read_range: Callable[..., pa.Table] | None = None
    # a stage with Spark code: Kafka records read in Python, prepared by it as its query prepares
    # each micro-batch (``streaming.adapters.spark.stage``)
    prepare: Callable[[pa.Table], pa.Table] | None = None
    # channel -> the offset a restore would read it from -> those time retention may delete
    # before the checkpoint is superseded (``kafka_retention.RetentionWatch.at_risk``)
    retention_risk: Callable[[Mapping[ChannelId, int]], Mapping[ChannelId, AtRisk]] | None = None


def _input_gate(
    pipeline: Pipeline,
    spec: TaskSpec,
    io: TaskIO,
    generation: int,
    lineage: Lineage,
    counters: collections.Counter,
    options: TaskOptions,
    clock: Callable[[], float],
) -> InputGate:
    """Task ``spec``'s input gate: batches cut into segments (records an older
    generation wrote skipped), ranges read again prepared as its batches are."""
    max_segment_records, segment_ms = options.max_segment_records, options.segment_ms
    segmenter = Segmenter(
        (pipeline.topic_of(s.name) for s in pipeline.stages),
        generation,
        lineage,
        max_records=max_segment_records,
        skip=[skip for skip in options.skip_records if skip[0] in spec.inputs],
    )
    read_range = source = io.read_range
    prepare = io.prepare
    if source is not None and prepare is not None:
        read_range = lambda channel, start, end: prepare(source(channel, start, end))  # noqa: E731
    return InputGate(
        spec.name,
        spec.inputs,
        segmenter,
        counters,
        read_range=read_range,
        held_memory_bytes=options.held_memory_bytes,
        pace=SegmentPace(segment_ms / 1000, max_segment_records) if segment_ms is not None else None,
        clock=clock,
    )


class StageTask:
    """One task of a stage (see the module docstring), run as ``options``
    says (``TaskOptions``).  ``recover`` once, then ``process_batch`` is the
    ``foreachBatch`` body; ``on_control`` takes the control topic's events.
    ``clock`` and the ``upload`` executor are the tests' to replace."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: TaskSpec,
        io: TaskIO,
        *,
        start: TaskStart | None = None,
        options: TaskOptions,
        clock: Callable[[], float] = time.monotonic,
        upload: concurrent.futures.Executor | None = None,
    ):
        self.pipeline = pipeline
        self.spec = spec
        self.io = io
        self.start = start or TaskStart()
        self.generation = self.start.generation
        self.job_key = options.job_key
        self.operator = pipeline.stage(spec.stage).make_operator()
        self.lineage = self.start.lineage
        self.counters: collections.Counter = collections.Counter()
        # what Prometheus sees of the task's data path (streaming.engine.metrics)
        self.metrics = TaskMetrics(pipeline.job, spec.name, spec.inputs, spec.outputs)
        self.gate = _input_gate(pipeline, spec, io, self.generation, self.lineage, self.counters, options, clock)
        self.watermarks = WatermarkTracker(event_time_inputs(pipeline, spec), self.start.watermarks, clock=clock)
        self.quarantine = Quarantine(
            spec.name,
            io,
            self.counters,
            self.metrics,
            generation=self.generation,
            after_checkpoint=lambda: self.controller.snapshotted,
            ingress_topics={i.topic: i.partitions for i in pipeline.ingress},
        )
        self.output = TaskOutput(pipeline, spec, io, self.generation, self.counters, self.metrics)
        self.record_errors = RecordErrors(
            spec.name, options.record_errors, options.max_isolated_records, options.max_isolated_share
        )
        self.processor = RecordProcessor(
            pipeline,
            spec,
            self.operator,
            max_decoded_bytes=options.max_decoded_bytes,
            quarantine=self.quarantine,
            output=self.output,
            watermarks=self.watermarks,
            counters=self.counters,
            metrics=self.metrics,
            open_inputs=lambda: self.handler.open_inputs,
            errors=self.record_errors,
        )
        uploader = SnapshotUploader(
            spec.name,
            self.generation,
            io,
            self.lineage,
            self.counters,
            copy_in_flight=options.copy_in_flight,
            executor=upload,
            incremental=options.incremental,
        )
        wiring = TaskWiring(
            self.operator,
            self.gate,
            self.output,
            self.watermarks,
            uploader,
            self.processor.forward_watermark,
            self.record_errors,
        )
        self.controller = TaskController(
            spec.name,
            self.generation,
            io,
            wiring,
            self.counters,
            job_key=self.job_key,
            snapshotted=self.start.checkpoint_id or 0,
        )
        self.handler = BarrierHandler(
            self.controller,
            spec.inputs,
            positions=self.start.positions,
            generation=self.generation,
            max_concurrent=options.max_concurrent,
            clock=clock,
            newest_started=self.start.checkpoint_id or 0,
        )
        self.controller.handler = self.handler
        self._lock = threading.RLock()
        self.inbox = ControlInbox(spec.name, pipeline.job, spec.inputs, self.handler, self._lock)
        self._started = time.monotonic()
        # numbers the task's progress events (taken on the worker's beat thread: count is atomic)
        self._progress_numbers = itertools.count(1)
        # channel state still to process again (``recover``), its copied part handed over in runs
        # (``start_replay``, and ahead of every batch)
        self.restored = RestoredChannelState(
            spec.name, self.handler.position, self._announce_replayed, options.replay_run_records
        )
        self._recovered = False

    def recover(self) -> None:
        """Where the task starts (``TaskStart``): its operator's state
        restored, and its channel state noted: records copied into its
        snapshot are processed before anything the query reads on their
        channels, in runs once the task runs (``start_replay``); offset ranges
        are read again by the query.  ``replay_records`` counts both."""
        if self._recovered:
            raise TaskError(f"{self.spec.name}: recovered twice")
        self._recovered = True
        if self.start.state:
            self.operator.restore(dict(self.start.state))
        self.controller.copied = self.restored.note(self.start.replay, self.start.replay_until, self.start.resume)

    @property
    def copied(self) -> CopiedReplay | None:
        """The copied part of the restored channel state, while any is left."""
        return self.restored.copied

    @property
    def replay_records(self) -> int:
        """The records of the restored channel state, copied and read again alike."""
        return self.restored.records

    @property
    def replay_error(self) -> BaseException | None:
        """What stopped the replay of copied channel state (the worker stops on it)."""
        return self.restored.error

    def start_replay(self) -> None:
        """Replay the copied channel state on a thread of the task's own, once
        the worker said the task is ready (the worker's own thread keeps
        reading the control topic, so announcements reach the task between
        the segments of each run); a batch that comes first hands over what
        is left itself, before its own records."""
        self.restored.start(self.replay_run)

    def wait_for_replay(self, timeout_s: float = 60.0) -> None:
        """Until the replay started by ``start_replay`` ended (done, failed or closed)."""
        self.restored.wait(timeout_s)

    def replay_run(self) -> bool:
        """One run of the copied channel state, unless none is left; whether one was."""
        with self._lock:
            run = self.copied.next_run() if self.copied is not None else None
            if run is None:
                return False
            self.counters["replayed_in_flight"] += run.num_rows
            self._feed(run if self.io.prepare is None else self.io.prepare(run))
            return True

    # ------------------------------------------------------------------ input

    def process_batch(self, table: pa.Table, batch_id: int = -1) -> None:
        """One micro-batch, ordered by channel and offset (``ChannelQuery``
        order), after whatever copied channel state is still to hand over."""
        with self._lock:
            if self.replay_error is not None:
                raise TaskError(f"{self.spec.name}: the replay of its channel state failed") from self.replay_error
            while self.replay_run():
                pass
            self._feed(table)

    def _feed(self, table: pa.Table) -> None:
        began = time.perf_counter()
        table = stamped(table, HANDED, time.time())  # for the barrier path of a checkpoint it carries
        with self._lock:
            brought = self.gate.add(table)
            if self.copied is not None and self.copied.handing:
                # a replay of copied channel state hands its channels over one by one: none is idle meanwhile
                brought = {*brought, *self.copied.ends}
            self.watermarks.batch(brought)
            self.gate.drain(self.handler.is_blocked, self._handle, self._between_segments)
            self.processor.follow_event_time()
            watermarks = self.watermarks
            self.metrics.batch(
                time.perf_counter() - began,
                self.held_bytes,
                watermarks.current,
                watermarks.idle_inputs(self.processor.inputs),
            )

    def _between_segments(self) -> None:
        """Control events that came in, and the handler's clock (timeouts, budget)."""
        self.inbox.apply()
        held = self.held_bytes
        self.gate.note_held(held)
        self.handler.tick(held)
        self.gate.bound(held, self.handler.blocked)

    @property
    def held_bytes(self) -> int:
        """Bytes of the records alignment holds (spilled ones included)."""
        return self.gate.held_bytes(self.handler.blocked)

    def _handle(self, segment: Segment) -> None:
        channel = segment.channel
        fresh = self.gate.fresh(segment, self.handler.position(channel))
        if fresh is None:
            return  # Spark handed these again (a retried batch): already processed
        segment = fresh
        if segment.kind is SegmentKind.CONTROL:
            self._handle_control(segment)
            if self.restored.pending:  # a range may end in control records (no data between two barriers)
                self.restored.check(channel)
            return
        self.handler.record_processed(channel, segment.last_offset)
        if self.restored.pending:
            self.restored.check(channel)
        if segment.kind is SegmentKind.SKIP:
            self.counters["skipped_older_generation"] += segment.rows_in_hand().num_rows
        elif segment.kind is SegmentKind.REJECTED:
            self.quarantine.record(channel, segment.rows_in_hand(), segment.reason)
        elif segment.kind is SegmentKind.WATERMARK:
            self.watermarks.observe(channel, segment.rows, None)
            self.processor.watermark_moved(channel)
        else:
            try:
                self.processor.process(channel, segment.rows)
            except SparkAbsError:
                raise
            except Exception as exc:  # say where, for the runner (a failure that repeats at one place)
                raise RecordsFailed(
                    self.spec.name, str(channel), segment.first_offset, segment.last_offset, said(exc)
                ) from exc

    def progress(self) -> Progress:
        """Where the task is: its position on each input channel (the next
        offset it will process) and the records it processed."""
        return Progress(
            task=self.spec.name,
            generation=self.generation,
            positions={str(c): self.handler.position(c) for c in self.spec.inputs},
            records=self.counters["records"],
            set_aside=self.counters["set_aside"],
            sequence=next(self._progress_numbers),
        )

    def _announce_replayed(self, records: int) -> None:
        """Say on the control topic that the restored channel state has been
        processed again: a restore's last step."""
        self.io.publish(
            Replayed(
                task=self.spec.name,
                generation=self.generation,
                checkpoint_id=self.start.checkpoint_id or 0,
                records=records,
                seconds=time.monotonic() - self._started,
            )
        )

    def _decode_control(self, channel: ChannelId, row: pa.Table) -> Barrier | CancelBarrier | None:
        headers = [(h["key"], h["value"]) for h in row["headers"][0].as_py()]
        try:
            return decode(headers, job=self.pipeline.job, key=self.job_key, channel=channel)
        except BarrierRejected as exc:
            self.quarantine.control_record(channel, row, exc)
            return None

    def _handle_control(self, segment: Segment) -> None:
        offset = segment.first_offset
        message = self._decode_control(segment.channel, segment.rows)
        if message is None:  # rejected: already a dead letter; only its position counts
            self.handler.record_processed(segment.channel, offset)
            return
        if isinstance(message, CancelBarrier):
            ignored = self.handler.cancel_received(segment.channel, message, offset)
        else:
            rows = segment.rows
            self.controller.barrier_path(
                message.checkpoint_id,
                appended=kafka_time(rows),
                batch_began=stamp_of(rows, BATCH_BEGAN),
                handed=stamp_of(rows, HANDED),
            )
            ignored = self.handler.barrier_received(segment.channel, message, offset)
        if ignored is not None:
            self.counters[f"ignored_{ignored.reason.name.lower()}"] += 1

    @property
    def watermark(self) -> int | None:
        """The task's event-time watermark (``streaming.engine.task.watermarks``;
        None before the first, and in a task without event time)."""
        return self.watermarks.current

    @property
    def downstream_watermark(self) -> int | None:
        """What the task tells downstream (``RecordProcessor.downstream_watermark``)."""
        return self.processor.downstream_watermark

    # ---------------------------------------------------------------- control

    def on_control(self, event: ControlEvent) -> None:
        """An event of the job's control topic (``streaming.engine.task.inbox``
        says which concern a task, and when they are taken)."""
        if event.belongs_to(self.generation):
            self.inbox.offer(event)

    def tick(self) -> None:
        """Timeouts and control events, when no batch is in hand (a batch in
        hand does both between its segments)."""
        if self._lock.acquire(blocking=False):
            try:
                self.inbox.apply()
                self.handler.tick(self.held_bytes)
            finally:
                self._lock.release()

    def wait_for_uploads(self, timeout_s: float = 60.0) -> None:
        self.controller.uploader.wait(timeout_s)

    def close(self) -> None:
        self.restored.close()
        self.controller.uploader.close()
