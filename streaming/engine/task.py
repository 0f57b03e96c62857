"""A stage task: the barrier handler of ``barriers`` driven by the micro-batches
of one Structured Streaming query.

Each micro-batch (all channels of the task, ordered by channel and offset)
is cut into segments per channel: runs of data records, and single control
records (barriers, cancellations).  Segments wait in per-channel queues; the
task takes them round-robin from the channels the handler has not blocked,
so a blocked channel's records are held (alignment) while the others go on.
Data segments are decoded (malformed records go to the dead-letter topic with
their reason), run through the operator, and the output is routed to the
task's output partitions, or kept for the sink's current epoch.

At barrier n the handler calls back (``Controller``): ``snapshot`` takes the
operator's state (immutable Arrow tables) and closes the sink epoch,
``forward_barrier`` appends barrier n to every output partition, and
``acknowledge`` hands the snapshot to the ``SnapshotUploader``, which uploads
it in the background and then acknowledges on the job's control topic, so
processing never waits for the upload.  A failed upload declines the
checkpoint; the job goes on.

Beside the task: ``segments`` (cutting batches, skipping what an older
generation wrote after a restore), ``watermarks`` (event-time progress) and
``uploads`` (the asynchronous phase of a snapshot)."""

from __future__ import annotations

import collections
import concurrent.futures
import json
import logging
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barriers.failures import CheckpointFailure
from barriers.handler import BarrierHandler, TaskCheckpoint
from barriers.lineage import Lineage
from barriers.messages import (
    GENERATION_HEADER,
    Alignment,
    Barrier,
    BarrierRejected,
    CancelBarrier,
    ChannelId,
    decode,
    encode,
)
from operators.base import WatermarkAware
from operators.dead_letters import DeadLetters as OperatorDeadLetters
from operators.errors import InputSchemaError
from streaming.adapters import codec
from streaming.adapters.control import ControlEvent, ControlKind, announced_barrier, announced_headers
from streaming.adapters.records import BATCH_COLUMNS
from streaming.api.pipeline import Pipeline, TaskSpec, route
from streaming.engine import faults
from streaming.engine.segments import Segment, Segmenter, SegmentKind
from streaming.engine.uploads import SnapshotUploader, TakenSnapshot
from streaming.engine.watermarks import WATERMARK_HEADER, WatermarkTracker, watermark_headers
from streaming.errors import TaskError

__all__ = ["StageTask", "TaskStart", "TaskIO"]

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
    # (channel, start, end) -> the records at [start, end), read from Kafka in bulk
    read_range: Callable[[ChannelId, int, int], pa.Table] | None = None


class StageTask:
    """One task of a stage (see the module docstring).  ``process_batch`` is
    the ``foreachBatch`` body; ``on_control`` takes the control topic's events."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: TaskSpec,
        io: TaskIO,
        *,
        start: TaskStart | None = None,
        max_concurrent: int = 1,
        clock: Callable[[], float] = time.monotonic,
        upload: concurrent.futures.Executor | None = None,
        job_key: bytes | None = None,
        copy_in_flight: bool = False,
        max_segment_records: int = 50_000,
        held_memory_bytes: int = 256 << 20,
    ):
        self.pipeline = pipeline
        self.spec = spec
        self.stage = pipeline.stage(spec.stage)
        self.downstream = pipeline.downstream(spec.stage)
        self.io = io
        self.start = start or TaskStart()
        self.generation = self.start.generation
        self.job_key = job_key
        self.operator = self.stage.operator()
        if self.start.state:
            self.operator.restore(dict(self.start.state))
        self._multi_input = bool(getattr(self.operator, "inputs", None))
        self._schemas = {i.topic: i.schema for i in pipeline.ingress}
        self.handler = BarrierHandler(
            self,
            spec.inputs,
            positions=self.start.positions,
            generation=self.generation,
            max_concurrent=max_concurrent,
            clock=clock,
            newest_started=self.start.checkpoint_id or 0,
        )
        self.lineage = self.start.lineage
        self._segmenter = Segmenter(
            (pipeline.topic_of(s.name) for s in pipeline.stages),
            self.generation,
            self.lineage,
            max_records=max_segment_records,
        )
        self.watermarks = WatermarkTracker(
            {i.topic: i.event_time for i in pipeline.ingress if i.event_time}, self.start.watermarks
        )
        self._queues: dict[ChannelId, collections.deque[Segment]] = {c: collections.deque() for c in spec.inputs}
        self._lock = threading.RLock()
        # held records past this many bytes are let go and read again from Kafka
        self._held_memory = held_memory_bytes
        # control events wait here until the processing thread is between segments
        self._inbox: collections.deque[ControlEvent] = collections.deque()
        self.counters = collections.Counter()
        self._uploader = SnapshotUploader(
            spec.name, self.generation, io, self.lineage, self.counters, copy_in_flight=copy_in_flight, executor=upload
        )
        # output of the sink epoch in progress, and what each started checkpoint took
        self._epoch_rows: list[pa.Table] = []
        self._taken: dict[int, TakenSnapshot] = {}
        self._held_max = 0
        # channel state copied into the restored snapshot goes first
        self._started = time.monotonic()
        self._replaying: dict[ChannelId, int] = {}
        for _channel, table in sorted(self.start.replay.items()):
            if table.num_rows:
                self.counters["replayed_in_flight"] += table.num_rows
                self.process_batch(table)
        # channel state kept as ranges: replayed once the query read past these offsets
        self._replaying = {c: end for c, end in self.start.replay_until.items() if self.handler.position(c) < end}
        self.replay_records = sum(end - self.handler.position(c) for c, end in self._replaying.items())

    # ------------------------------------------------------------------ input

    def process_batch(self, table: pa.Table, batch_id: int = -1) -> None:
        """One micro-batch, ordered by channel and offset (``ChannelQuery`` order)."""
        with self._lock:
            for segment in self._segmenter.cut(table):
                self._queues[segment.channel].append(segment)
            self._drain()
            self._forward_watermark()

    def _decode_control(self, channel: ChannelId, row: pa.Table) -> Barrier | CancelBarrier | None:
        headers = [(h["key"], h["value"]) for h in row["headers"][0].as_py()]
        try:
            return decode(headers, job=self.pipeline.job, key=self.job_key)
        except BarrierRejected as exc:
            offset = int(row["offset"][0].as_py())
            self.counters["rejected_control_records"] += 1
            log.warning("%s: control record at %s offset %d rejected: %s", self.spec.name, channel, offset, exc)
            self.io.dead_letter(
                channel,
                offset,
                row["key"][0].as_py(),
                row["value"][0].as_py(),
                headers,
                f"rejected control record: {exc.reason}",
            )
            return None

    def _drain(self) -> None:
        progress = True
        while progress:
            progress = False
            for channel in sorted(self._queues):
                self._between_segments()
                queue = self._queues[channel]
                if queue and not self.handler.is_blocked(channel):
                    self._handle(queue.popleft())
                    progress = True
        self._between_segments()

    def _between_segments(self) -> None:
        """Control events that came in, and the handler's clock (timeouts, budget)."""
        self._apply_control()
        held = self.held_bytes
        self._held_max = max(self._held_max, held)
        self.handler.tick(held)
        if held > self._held_memory:
            self._spill_held()

    @property
    def held_bytes(self) -> int:
        """Bytes of the records alignment holds (spilled ones included)."""
        return sum(s.nbytes for c in self.handler.blocked for s in self._queues[c])

    def _spill_held(self) -> None:
        """Called when more than ``held_memory_bytes`` are held: past that the
        newest held runs let go of their records, which are read again from
        Kafka by offset range when their channel is released (as unaligned
        channel state is), so alignment memory stays bounded."""
        if self.io.read_range is None:
            return
        in_memory = sum(s.nbytes for c in self.handler.blocked for s in self._queues[c] if not s.spilled)
        for channel in sorted(self.handler.blocked):
            for segment in reversed(self._queues[channel]):
                if in_memory <= self._held_memory:
                    return
                if not segment.spilled:
                    segment.spill()
                    if segment.spilled:
                        in_memory -= segment.nbytes
                        self.counters["spilled_segments"] += 1

    def _handle(self, segment: Segment) -> None:
        channel = segment.channel
        position = self.handler.position(channel)
        if segment.last_offset < position:
            return  # Spark handed these again (a retried batch): already processed
        if segment.spilled:
            segment = self._read_back(segment)
        if segment.first_offset < position:
            segment = Segment(
                channel, segment.rows.filter(pc.greater_equal(segment.rows["offset"], position)), segment.kind
            )
        if segment.kind is SegmentKind.CONTROL:
            self._handle_control(segment)
            if self._replaying:  # a range may end in control records (no data between two barriers)
                self._check_replayed(channel)
            return
        self.handler.record_processed(channel, segment.last_offset)
        if self._replaying:
            self._check_replayed(channel)
        if segment.kind is SegmentKind.SKIP:
            self.counters["skipped_older_generation"] += segment.rows.num_rows
        elif segment.kind is SegmentKind.WATERMARK:
            self._advance_watermark(channel, segment.rows, None)
        else:
            self._process(channel, segment.rows)

    def progress(self) -> ControlEvent:
        """Where the task is: its position on each input channel (the next
        offset it will process) and the records it processed."""
        return ControlEvent(
            ControlKind.PROGRESS,
            0,
            self.spec.name,
            {
                "generation": self.generation,
                "positions": {str(c): self.handler.position(c) for c in self.spec.inputs},
                "records": self.counters["records"],
            },
        )

    def _check_replayed(self, channel: ChannelId) -> None:
        """Say on the control topic when the restored channel state (offset
        ranges) has been read and processed again: a restore's last step."""
        end = self._replaying.get(channel)
        if end is None or self.handler.position(channel) < end:
            return
        del self._replaying[channel]
        if self._replaying:
            return
        self.io.publish(
            ControlEvent(
                ControlKind.REPLAYED,
                self.start.checkpoint_id or 0,
                self.spec.name,
                {
                    "generation": self.generation,
                    "records": self.replay_records,
                    "seconds": time.monotonic() - self._started,
                },
            )
        )

    def _read_back(self, segment: Segment) -> Segment:
        rows = self.io.read_range(segment.channel, segment.first_offset, segment.last_offset + 1)
        offsets = rows["offset"]
        if (
            rows.num_rows == 0
            or offsets[0].as_py() != segment.first_offset
            or offsets[-1].as_py() != segment.last_offset
        ):
            raise TaskError(
                f"{self.spec.name}: held records [{segment.first_offset}, {segment.last_offset}] of "
                f"{segment.channel} could not be read back from Kafka ({rows.num_rows} records came back)"
            )
        self.counters["read_back_segments"] += 1
        return Segment(segment.channel, rows.select(list(BATCH_COLUMNS)), segment.kind)

    def _handle_control(self, segment: Segment) -> None:
        offset = segment.first_offset
        message = self._decode_control(segment.channel, segment.rows)
        if message is None:  # rejected: already a dead letter; only its position counts
            self.handler.record_processed(segment.channel, offset)
            return
        if isinstance(message, CancelBarrier):
            ignored = self.handler.cancel_received(segment.channel, message, offset)
        else:
            ignored = self.handler.barrier_received(segment.channel, message, offset)
        if ignored is not None:
            self.counters[f"ignored_{ignored.reason.name.lower()}"] += 1

    def _process(self, channel: ChannelId, rows: pa.Table) -> None:
        decoded = codec.decode_records(rows, self._schemas.get(channel.topic))
        for index, reason in decoded.rejected:
            self._dead_letter(channel, rows.slice(index, 1), reason)
        # outputs of this segment carry the watermark from before it: no record
        # of the segment is older than that
        watermark = self.watermark
        if decoded.table.num_rows:
            batch = decoded.table
            try:
                if self._multi_input:
                    output = self.operator.process({self.spec.inputs[channel]: batch})
                else:
                    output = self.operator.process(batch)
            except InputSchemaError as exc:
                # records the operator cannot take at all: quarantined, with the reason
                for index in sorted(set(decoded.index)):
                    self._dead_letter(channel, rows.slice(index, 1), str(exc))
                output = None
            self._collect_dead_letters(channel)
            self._emit(output, watermark)
        self._advance_watermark(channel, rows, decoded.table)
        self.counters["records"] += rows.num_rows

    @property
    def _inputs(self):
        return self.handler.open_inputs or self.spec.inputs.keys()

    @property
    def watermark(self) -> int | None:
        """The minimum over open inputs of each channel's watermark (None until all have one)."""
        return self.watermarks.current(self._inputs)

    def _advance_watermark(self, channel: ChannelId, rows: pa.Table, decoded: pa.Table | None) -> None:
        moved = self.watermarks.advance(channel, rows, decoded, self._inputs)
        if moved is not None and isinstance(self.operator, WatermarkAware):
            self._emit(self.operator.on_watermark(moved), moved)
            self._collect_dead_letters(channel)

    def _dead_letter(self, channel: ChannelId, row: pa.Table, reason: str) -> None:
        self.counters["dead_letters"] += 1
        headers = [(h["key"], h["value"]) for h in (row["headers"][0].as_py() or [])]
        self.io.dead_letter(
            channel, int(row["offset"][0].as_py()), row["key"][0].as_py(), row["value"][0].as_py(), headers, reason
        )

    def _collect_dead_letters(self, channel: ChannelId) -> None:
        letters = getattr(self.operator, "dead_letters", None)
        if not isinstance(letters, OperatorDeadLetters) or not len(letters):
            return
        for letter in letters.drain():
            self.counters["dead_letters"] += 1
            value = json.dumps(letter.row, default=str, separators=(",", ":")).encode()
            self.io.dead_letter(channel, -1, None, value, [], f"{letter.operator}: {letter.reason}")

    # ----------------------------------------------------------------- output

    def _forward_watermark(self) -> None:
        """Tell every output channel how far event time got, once per batch
        when it moved, so downstream windows close even where no row goes."""
        if not self.spec.outputs:
            return
        watermark = self.watermarks.take_unsent(self._inputs)
        if watermark is None:
            return
        for channel in self.spec.outputs:
            self.io.send(channel, None, b"", watermark_headers(watermark, self.generation))

    def _emit(self, output: pa.Table | None, watermark: int | None) -> None:
        if output is None or output.num_rows == 0:
            return
        self.counters["output_rows"] += output.num_rows
        if self.downstream is None:
            self._epoch_rows.append(output)
            return
        targets = route(output, self.stage.key, len(self.spec.outputs)).to_numpy()
        headers = [(GENERATION_HEADER, str(self.generation).encode()), (codec.FORMAT_HEADER, codec.ARROW_FORMAT)]
        if watermark is not None:
            headers.append((WATERMARK_HEADER, str(watermark).encode()))
        # one Arrow record (or a few, below the message size) per output partition
        for target in np.unique(targets):
            part = output.take(pa.array(np.flatnonzero(targets == target)))
            for value in codec.encode_batches(part):
                self.io.send(self.spec.outputs[int(target)], None, value, headers)

    # ------------------------------------------------------------- controller

    def block(self, channel: ChannelId) -> None:
        log.debug("%s: %s blocked", self.spec.name, channel)
        faults.point(self.spec.name, "during_alignment", self.handler.newest_started)

    def release(self, channel: ChannelId) -> None:
        log.debug("%s: %s released", self.spec.name, channel)

    def snapshot(self, barrier: Barrier) -> None:
        began = time.perf_counter()
        state = self.operator.snapshot()
        self._taken[barrier.checkpoint_id] = TakenSnapshot(
            state, self._epoch_rows, time.perf_counter() - began, time.time(), self._held_max
        )
        self._epoch_rows = []
        self._held_max = 0

    def forward_barrier(self, barrier: Barrier) -> None:
        if not self.spec.outputs:
            return
        self._forward_watermark()  # event-time progress before the barrier belongs to its epoch
        self.io.flush()
        headers = encode(barrier, key=self.job_key)
        offsets = self.io.append_barrier(self.spec.outputs, headers)
        self.io.publish(
            ControlEvent(
                ControlKind.ANNOUNCE,
                barrier.checkpoint_id,
                self.spec.name,
                {
                    "generation": self.generation,
                    "barrier": announced_barrier(headers),
                    "offsets": {str(c): o for c, o in offsets.items()},
                },
            )
        )

    def record_in_flight(self, checkpoint_id: int, channel: ChannelId, start: int, end: int) -> None:
        log.debug("%s: checkpoint %d: %s in flight [%d, %d)", self.spec.name, checkpoint_id, channel, start, end)

    def acknowledge(self, checkpoint: TaskCheckpoint) -> None:
        self._uploader.submit(checkpoint, self._taken.pop(checkpoint.checkpoint_id), self.watermarks.snapshot())

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str) -> None:
        taken = self._taken.pop(checkpoint_id, None)
        # the output of an aborted epoch belongs to the next one
        if taken is not None:
            self._epoch_rows = taken.epoch + self._epoch_rows
        self.counters["aborted"] += 1
        self.io.publish(
            ControlEvent(
                ControlKind.DECLINE,
                checkpoint_id,
                self.spec.name,
                {"generation": self.generation, "reason": reason.name, "detail": detail},
            )
        )

    # ---------------------------------------------------------------- control

    def on_control(self, event: ControlEvent) -> None:
        """Events of the job's control topic that concern tasks: the
        coordinator's abort of a checkpoint, and barrier positions announced
        by the injector (``trigger``) and by upstream tasks (``announce``),
        which let an unaligned checkpoint (or an aligned one whose timeout
        passed) start before the backlog in front of its barrier is read.
        Taken at once when the task is idle, else by the processing thread
        between two segments of the batch in hand (a large batch does not
        delay an unaligned snapshot)."""
        if event.payload.get("generation") != self.generation:
            return
        self._inbox.append(event)
        if self._lock.acquire(blocking=False):
            try:
                self._apply_control()
            finally:
                self._lock.release()

    def _apply_control(self) -> None:
        while self._inbox:
            event = self._inbox.popleft()
            if event.kind in (ControlKind.TRIGGER, ControlKind.ANNOUNCE) and event.payload.get("barrier"):
                self._announced(event)
            elif (
                event.kind is ControlKind.ABORT
                and event.task != self.spec.name
                and event.checkpoint_id in self.handler.pending
            ):
                self.handler.abort(
                    event.checkpoint_id,
                    CheckpointFailure.parse(event.payload.get("reason"), CheckpointFailure.USER),
                    str(event.payload.get("detail", "aborted by the coordinator")),
                )

    def _announced(self, event: ControlEvent) -> None:
        try:
            barrier = decode(announced_headers(event.payload["barrier"]), job=self.pipeline.job, key=self.job_key)
        except BarrierRejected as exc:
            log.warning("%s: announcement of checkpoint %d ignored: %s", self.spec.name, event.checkpoint_id, exc)
            return
        if not isinstance(barrier, Barrier) or (
            barrier.options.alignment is not Alignment.UNALIGNED and barrier.options.alignment_timeout_ms is None
        ):
            return  # aligned without a timeout and at-least-once checkpoints wait for the barriers themselves
        for name, offset in sorted((event.payload.get("offsets") or {}).items()):
            channel = ChannelId.parse(name)
            if channel in self.spec.inputs:
                self.handler.announcement_received(channel, barrier, int(offset))

    def tick(self) -> None:
        """Timeouts and control events, when no batch is in hand (a batch in
        hand does both between its segments)."""
        if self._lock.acquire(blocking=False):
            try:
                self._apply_control()
                self.handler.tick(self.held_bytes)
            finally:
                self._lock.release()

    def wait_for_uploads(self, timeout_s: float = 60.0) -> None:
        self._uploader.wait(timeout_s)

    def close(self) -> None:
        self._uploader.close()
