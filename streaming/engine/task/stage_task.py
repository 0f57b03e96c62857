"""A stage task: the barrier handler of ``barriers`` driven by the micro-batches
of one Structured Streaming query.

Each micro-batch goes through the task's input gate (``gate``: segments per
channel, handed out round-robin from the channels the handler has not
blocked, so a blocked channel's records are held while the others go on).
Data segments are decoded (malformed records go to the dead-letter topic with
their reason), run through the operator, and the output goes on
(``output``: routed to the task's output partitions, or kept for the sink's
current epoch).  Control segments (barriers, cancellations) go to the
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
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from barriers.handler import BarrierHandler
from barriers.lineage import Lineage
from barriers.messages import (
    Barrier,
    BarrierRejected,
    CancelBarrier,
    ChannelId,
    decode,
)
from operators.base import WatermarkAware, takes_origin
from operators.dead_letters import ORIGIN, ORIGIN_TYPE, without_origin
from operators.errors import InputSchemaError
from streaming.adapters.kafka.control.events import ControlEvent, Progress, Replayed
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import (
    BATCH_BEGAN,
    EVENT_TIME,
    HANDED,
    PARTIAL,
    REASON,
    RECORDS,
    ROW,
    Part,
    is_prepared,
    kafka_time,
    part_of,
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
from streaming.engine.task.quarantine import Quarantine
from streaming.engine.task.replay import RUN_RECORDS as REPLAY_RUN_RECORDS
from streaming.engine.task.replay import CopiedReplay
from streaming.engine.task.segments import Segment, Segmenter, SegmentKind, SegmentPace
from streaming.engine.task.uploads import Incremental, SnapshotUploader
from streaming.engine.task.watermarks import WatermarkTracker, event_time_inputs
from streaming.errors import TaskError

__all__ = ["StageTask", "TaskStart", "TaskIO", "TaskOptions"]

log = logging.getLogger(__name__)

# how records of a channel the task does not know are read: as an ingress's, no Arrow batch taken
_UNKNOWN_CHANNEL = codec.ChannelReading.ingress(None)


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
    # the job's key: barriers and control events signed and checked with it (None: unsigned)
    job_key: bytes | None = None
    # the most bytes one Arrow record of an internal topic may take decompressed (JobSettings.max_decoded_bytes)
    max_decoded_bytes: int = JobSettings.default("max_decoded_bytes")


@dataclass
class TaskIO:
    """What a task talks to, given to it so the processing core stays testable:
    ``send(channel, key, value, headers)`` for output records, ``append_barrier``
    (channels, headers) -> offsets, ``publish(ControlEvent)``, ``dead_letter``
    (channel, offset, key, value, headers, reason), ``write_snapshot`` (the
    store's ``write_task``), ``stage_epoch(epoch, table)`` for sink tasks."""

    send: Callable[[ChannelId, bytes | None, bytes, list[tuple[str, bytes]]], None]
    append_barrier: Callable[[tuple[ChannelId, ...], list[tuple[str, bytes]]], Mapping[ChannelId, int]]
    publish: Callable[[ControlEvent], Any]
    dead_letter: Callable[[ChannelId, int, bytes | None, bytes | None, list[tuple[str, bytes]], str], None]
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
        options: TaskOptions | None = None,
        clock: Callable[[], float] = time.monotonic,
        upload: concurrent.futures.Executor | None = None,
    ):
        options = options or TaskOptions()
        self.pipeline = pipeline
        self.spec = spec
        self.io = io
        self.start = start or TaskStart()
        self.generation = self.start.generation
        self.job_key = options.job_key
        self.operator = pipeline.stage(spec.stage).make_operator()
        self._multi_input = bool(getattr(self.operator, "inputs", None))
        # how each input channel's records are read: an ingress topic's as its schema says (JSON
        # or Avro, never an Arrow batch), a stage's output topic's as Arrow batches within the cap
        self._readings = {channel: self._reading(name, options) for channel, name in spec.inputs.items()}
        self.lineage = self.start.lineage
        self.counters: collections.Counter = collections.Counter()
        # what Prometheus sees of the task's data path (streaming.engine.metrics)
        self.metrics = TaskMetrics(pipeline.job, spec.name, spec.inputs, spec.outputs)
        self.gate = self._input_gate(options, clock)
        self.watermarks = WatermarkTracker(event_time_inputs(pipeline, spec), self.start.watermarks, clock=clock)
        self.quarantine = Quarantine(
            spec.name, io, self.counters, self.metrics, ingress_topics={i.topic: i.partitions for i in pipeline.ingress}
        )
        # rows go to the operator with the record each came from (operators.dead_letters.ORIGIN),
        # so its dead letters name it; an operator of one's own gets them as the input has them
        self._origins = takes_origin(self.operator)
        self.output = TaskOutput(pipeline, spec, io, self.generation, self.counters, self.metrics)
        self.controller = self._controller(options, upload)
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
        self.inbox = ControlInbox(spec.name, pipeline.job, spec.inputs, self.handler, self._lock, self.job_key)
        self._started = time.monotonic()
        # channel state still to process again: each channel up to this offset (``recover``)
        self._replaying: dict[ChannelId, int] = {}
        # the copied part of it, handed over in runs (``start_replay``, and ahead of every batch)
        self.copied: CopiedReplay | None = None
        self._replay_run_records = options.replay_run_records
        self._replayer: threading.Thread | None = None
        self._closing = threading.Event()
        # what stopped the replay of copied channel state (the worker stops on it)
        self.replay_error: BaseException | None = None
        self.replay_records = 0
        self._recovered = False

    def _reading(self, name: str, options: TaskOptions) -> codec.ChannelReading:
        ingress = self.pipeline.ingress_named(name)
        if ingress is not None:
            return codec.ChannelReading.ingress(ingress.value_schema)
        return codec.ChannelReading.internal(options.max_decoded_bytes)

    def _input_gate(self, options: TaskOptions, clock: Callable[[], float]) -> InputGate:
        max_segment_records, segment_ms = options.max_segment_records, options.segment_ms
        segmenter = Segmenter(
            (self.pipeline.topic_of(s.name) for s in self.pipeline.stages),
            self.generation,
            self.lineage,
            max_records=max_segment_records,
        )
        read_range = source = self.io.read_range
        prepare = self.io.prepare
        if source is not None and prepare is not None:
            read_range = lambda channel, start, end: prepare(source(channel, start, end))  # noqa: E731
        return InputGate(
            self.spec.name,
            self.spec.inputs,
            segmenter,
            self.counters,
            read_range=read_range,
            held_memory_bytes=options.held_memory_bytes,
            pace=SegmentPace(segment_ms / 1000, max_segment_records) if segment_ms is not None else None,
            clock=clock,
        )

    def _controller(self, options: TaskOptions, upload: concurrent.futures.Executor | None) -> TaskController:
        uploader = SnapshotUploader(
            self.spec.name,
            self.generation,
            self.io,
            self.lineage,
            self.counters,
            copy_in_flight=options.copy_in_flight,
            executor=upload,
            incremental=options.incremental,
        )
        return TaskController(
            self.spec.name,
            self.generation,
            self.io,
            TaskWiring(self.operator, self.gate, self.output, self.watermarks, uploader, self._forward_watermark),
            self.counters,
            job_key=self.job_key,
        )

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
        copied = CopiedReplay(self.start.replay, self._replay_run_records, resume=self.start.resume)
        if copied.records:
            self.copied = self.controller.copied = copied
        ends = {**self.start.replay_until, **copied.ends}
        self._replaying = {c: end for c, end in ends.items() if self.handler.position(c) < end}
        self.replay_records = sum(end - self.handler.position(c) for c, end in self._replaying.items())

    def start_replay(self) -> None:
        """Replay the copied channel state on a thread of the task's own, once
        the worker said the task is ready (the worker's own thread keeps
        reading the control topic, so announcements reach the task between
        the segments of each run); a batch that comes first hands over what
        is left itself, before its own records."""
        if self.copied is None or not self.copied.handing or self._replayer is not None:
            return
        self._replayer = threading.Thread(target=self._replay, name=f"replay-{self.spec.name}", daemon=True)
        self._replayer.start()

    def wait_for_replay(self, timeout_s: float = 60.0) -> None:
        """Until the replay started by ``start_replay`` ended (done, failed or closed)."""
        if self._replayer is not None:
            self._replayer.join(timeout_s)

    def _replay(self) -> None:
        try:
            while not self._closing.is_set() and self.replay_run():
                pass
        except Exception as exc:  # the worker stops on it (``replay_error``)
            log.error("%s: replaying the restored channel state failed: %s", self.spec.name, exc)
            self.replay_error = exc

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
            self._follow_event_time()
            watermarks = self.watermarks
            self.metrics.batch(
                time.perf_counter() - began, self.held_bytes, watermarks.current, watermarks.idle_inputs(self._inputs)
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
            if self._replaying:  # a range may end in control records (no data between two barriers)
                self._check_replayed(channel)
            return
        self.handler.record_processed(channel, segment.last_offset)
        if self._replaying:
            self._check_replayed(channel)
        if segment.kind is SegmentKind.SKIP:
            self.counters["skipped_older_generation"] += segment.rows_in_hand().num_rows
        elif segment.kind is SegmentKind.WATERMARK:
            self.watermarks.observe(channel, segment.rows, None)
            self._watermark_moved(channel)
        else:
            self._process(channel, segment.rows)

    def progress(self) -> Progress:
        """Where the task is: its position on each input channel (the next
        offset it will process) and the records it processed."""
        return Progress(
            task=self.spec.name,
            generation=self.generation,
            positions={str(c): self.handler.position(c) for c in self.spec.inputs},
            records=self.counters["records"],
        )

    def _check_replayed(self, channel: ChannelId) -> None:
        """Say on the control topic when the restored channel state (offset
        ranges) has been read and processed again: a restore's last step."""
        end = self._replaying.get(channel)
        if end is None or self.handler.position(channel) < end:
            return
        del self._replaying[channel]
        if self.copied is not None:
            self.copied.forget({channel: self.handler.position(channel)})
        if self._replaying:
            return
        self.io.publish(
            Replayed(
                task=self.spec.name,
                generation=self.generation,
                checkpoint_id=self.start.checkpoint_id or 0,
                records=self.replay_records,
                seconds=time.monotonic() - self._started,
            )
        )

    def _decode_control(self, channel: ChannelId, row: pa.Table) -> Barrier | CancelBarrier | None:
        headers = [(h["key"], h["value"]) for h in row["headers"][0].as_py()]
        try:
            return decode(headers, job=self.pipeline.job, key=self.job_key)
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

    def _process(self, channel: ChannelId, rows: pa.Table) -> None:
        if is_prepared(rows):
            self._process_prepared(channel, rows)
            return
        decoded = codec.decode_records(rows, self._readings.get(channel, _UNKNOWN_CHANNEL))
        for index, reason in decoded.rejected:
            self.quarantine.record(channel, rows.slice(index, 1), reason)
        # outputs of this segment carry the watermark from before it: no record
        # of the segment is older than that
        watermark = self.downstream_watermark
        if decoded.table.num_rows:
            batch = self._traced(channel, rows, decoded)
            try:
                if self._multi_input:
                    output = self.operator.process({self.spec.inputs[channel]: batch})
                else:
                    output = self.operator.process(batch)
            except InputSchemaError as exc:
                # records the operator cannot take at all: quarantined, with the reason
                for index in sorted(set(decoded.index)):
                    self.quarantine.record(channel, rows.slice(index, 1), str(exc), counted_as="refused")
                output = None
            self.quarantine.from_operator(channel, self.operator, rows)
            self.output.emit(output, watermark)
        self.watermarks.observe(channel, rows, decoded.table)
        self._watermark_moved(channel)
        self.counters["records"] += rows.num_rows
        self.metrics.records_in[channel].inc(rows.num_rows)

    def _traced(self, channel: ChannelId, rows: pa.Table, decoded: codec.Decoded) -> pa.Table:
        """The decoded rows of ``rows`` (records of ``channel``), each with
        its origin: the ingress record it came from, as an earlier stage's
        rows carry it, or else the record of ``channel`` it was read from.
        Without ``_origins``, the rows as they are (an origin from an earlier
        stage removed)."""
        table = decoded.table
        if not self._origins:
            return without_origin(table)
        position = table.schema.get_field_index(ORIGIN)
        ingress = self._readings.get(channel, _UNKNOWN_CHANNEL).max_decoded_bytes is None
        carried = None if position < 0 or ingress else table[ORIGIN]
        if carried is not None and carried.type == ORIGIN_TYPE and carried.null_count == 0:
            return table  # every row names its ingress record
        n = table.num_rows
        index = decoded.index
        if ingress and len(index) == rows.num_rows:
            offsets = rows["offset"]  # an ingress record is one row at most: none was rejected
        else:
            offsets = rows["offset"].take(pa.array(index, pa.int64()))
        offsets = offsets.cast(pa.int64())
        here = pa.StructArray.from_arrays(
            [
                pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()).fill_null(0), pa.array([channel.topic])),
                pa.repeat(pa.scalar(channel.partition, pa.int32()), n),
                offsets.combine_chunks() if isinstance(offsets, pa.ChunkedArray) else offsets,
            ],
            fields=list(ORIGIN_TYPE),
        )
        if position < 0:
            return table.append_column(ORIGIN, here)
        if carried is None or carried.type != ORIGIN_TYPE:
            # an ingress record's own field of that name, or a column of another type: not an origin
            return table.set_column(position, ORIGIN, here)
        return table.set_column(position, ORIGIN, pc.coalesce(carried, here))

    def _process_prepared(self, channel: ChannelId, rows: pa.Table) -> None:
        """A run of a micro-batch the stage's Spark code prepared: its rows go
        to the operator, then the partial aggregates Spark computed for it
        (``merge_partials``), the records Spark could not decode to the dead
        letters, and the run's markers say how many records it had and how far
        their event time got (``streaming.adapters.spark.stage``)."""
        rejected = part_of(rows, Part.REJECTED)
        for index, reason in enumerate(rejected[REASON].to_pylist()):
            self.quarantine.record(channel, rejected.slice(index, 1), reason)
        watermark = self.downstream_watermark
        batch = pa.Table.from_struct_array(part_of(rows, Part.ROW)[ROW].combine_chunks())
        if batch.num_rows:
            try:
                output = self.operator.process(batch)
            except InputSchemaError as exc:
                # rows the operator cannot take at all: quarantined as the code gave them, with the reason
                output = None
                for value in codec.encode(batch):
                    self.quarantine.row(
                        channel,
                        value,
                        f"the stage's operator cannot take the rows its Spark code gives: {exc}",
                        counted_as="refused",
                    )
            self.quarantine.from_operator(channel, self.operator)
            self.output.emit(output, watermark)
        partials = part_of(rows, Part.PARTIAL)
        if partials.num_rows:
            self.output.emit(self.operator.merge_partials(pa.Table.from_struct_array(partials[PARTIAL])), watermark)
        markers = part_of(rows, Part.MARKER)
        self.watermarks.observe_event_time(channel, pc.max(markers[EVENT_TIME]).as_py())
        self._watermark_moved(channel)
        records = pc.sum(markers[RECORDS]).as_py() or 0
        self.counters["records"] += records
        self.metrics.records_in[channel].inc(records)

    @property
    def _inputs(self):
        return self.handler.open_inputs or self.spec.inputs.keys()

    @property
    def watermark(self) -> int | None:
        """The task's event-time watermark (``streaming.engine.task.watermarks``;
        None before the first, and in a task without event time)."""
        return self.watermarks.current

    @property
    def downstream_watermark(self) -> int | None:
        """What the task tells downstream: its watermark, held back by the
        rows its operator buffers (``watermark_hold``)."""
        watermark = self.watermarks.current
        hold = getattr(self.operator, "watermark_hold", None)
        held = hold() if callable(hold) and watermark is not None else None
        return watermark if held is None else min(watermark, held)

    def _watermark_moved(self, channel: ChannelId) -> None:
        """When the task's watermark moved on, the operator follows it (a
        window closes, a timer fires) and what that releases goes on."""
        moved = self.watermarks.update(self._inputs)
        if moved is not None and isinstance(self.operator, WatermarkAware):
            released = self.operator.on_watermark(moved)
            self.output.emit(released, self.downstream_watermark)
            self.quarantine.from_operator(channel, self.operator)

    def _forward_watermark(self) -> None:
        """Tell every output channel how far event time got, and when the
        task went idle, once per batch when that changed, so downstream
        windows close even where no row goes."""
        if not self.spec.outputs:
            return
        unsent = self.watermarks.take_unsent(self._inputs, self.downstream_watermark)
        if unsent is not None:
            self.output.watermark(*unsent)

    def _follow_event_time(self) -> None:
        """After a batch: what it changed of idleness (a batch without a
        partition's records, ``WatermarkTracker.batch``), then what goes
        downstream."""
        if self.watermarks.has_event_time:
            self._watermark_moved(min(self.spec.inputs))
            self._forward_watermark()

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
        self._closing.set()
        if self._replayer is not None:
            self._replayer.join(timeout=30)
        self.controller.uploader.close()
