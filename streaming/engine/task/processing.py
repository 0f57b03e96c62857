"""A task's data path: the records of a data segment decoded as their channel
is read (an ingress topic's JSON or Avro, a stage's Arrow batches, or rows
the stage's Spark code prepared), each row traced to the ingress record it
came from, run through the operator, and what comes out sent on
(``output``) or to the dead letters (``quarantine``); and the task's event
time followed: the operator told when the watermark moved, what that
releases sent on, and downstream told how far event time got."""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection

import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import ChannelId
from operators.base import WatermarkAware, takes_origin
from operators.dead_letters import ORIGIN, ORIGIN_TYPE, without_origin
from operators.errors import InputSchemaError
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import EVENT_TIME, PARTIAL, REASON, RECORDS, ROW, Part, is_prepared, part_of
from streaming.api.pipeline import Pipeline, TaskSpec
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.output import TaskOutput
from streaming.engine.task.quarantine import Quarantine
from streaming.engine.task.watermarks import WatermarkTracker

__all__ = ["RecordProcessor"]

# how records of a channel the task does not know are read: as an ingress's, no Arrow batch taken
_UNKNOWN_CHANNEL = codec.ChannelReading.ingress(None)


class RecordProcessor:
    """The data path of task ``spec`` (see the module docstring) through its
    ``operator``; ``open_inputs`` says which input channels are still open
    (the handler knows), for the watermark."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: TaskSpec,
        operator,
        *,
        max_decoded_bytes: int,
        quarantine: Quarantine,
        output: TaskOutput,
        watermarks: WatermarkTracker,
        counters: collections.Counter,
        metrics: TaskMetrics,
        open_inputs: Callable[[], Collection[ChannelId]],
    ):
        self.pipeline = pipeline
        self.spec = spec
        self.operator = operator
        self.quarantine = quarantine
        self.output = output
        self.watermarks = watermarks
        self.counters = counters
        self.metrics = metrics
        self._open_inputs = open_inputs
        self._multi_input = bool(getattr(operator, "inputs", None))
        # how each input channel's records are read: an ingress topic's as its schema says (JSON
        # or Avro, never an Arrow batch), a stage's output topic's as Arrow batches within the cap
        self._readings = {channel: self._reading(name, max_decoded_bytes) for channel, name in spec.inputs.items()}
        # rows go to the operator with the record each came from (operators.dead_letters.ORIGIN),
        # so its dead letters name it; an operator of one's own gets them as the input has them
        self._origins = takes_origin(operator)

    def _reading(self, name: str, max_decoded_bytes: int) -> codec.ChannelReading:
        ingress = self.pipeline.ingress_named(name)
        if ingress is not None:
            return codec.ChannelReading.ingress(ingress.value_schema)
        return codec.ChannelReading.internal(max_decoded_bytes)

    # ------------------------------------------------------------------ records

    def process(self, channel: ChannelId, rows: pa.Table) -> None:
        """A data segment's ``rows`` (records of ``channel``, in offset order)."""
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
        self.watermark_moved(channel)
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
        self.watermark_moved(channel)
        records = pc.sum(markers[RECORDS]).as_py() or 0
        self.counters["records"] += records
        self.metrics.records_in[channel].inc(records)

    # ------------------------------------------------------------------ event time

    @property
    def inputs(self) -> Collection[ChannelId]:
        """The input channels the watermark follows: the open ones (all, once none is)."""
        return self._open_inputs() or self.spec.inputs.keys()

    @property
    def downstream_watermark(self) -> int | None:
        """What the task tells downstream: its watermark, held back by the
        rows its operator buffers (``watermark_hold``)."""
        watermark = self.watermarks.current
        hold = getattr(self.operator, "watermark_hold", None)
        held = hold() if callable(hold) and watermark is not None else None
        return watermark if held is None else min(watermark, held)

    def watermark_moved(self, channel: ChannelId) -> None:
        """When the task's watermark moved on, the operator follows it (a
        window closes, a timer fires) and what that releases goes on."""
        moved = self.watermarks.update(self.inputs)
        if moved is not None and isinstance(self.operator, WatermarkAware):
            released = self.operator.on_watermark(moved)
            self.output.emit(released, self.downstream_watermark)
            self.quarantine.from_operator(channel, self.operator)

    def forward_watermark(self) -> None:
        """Tell every output channel how far event time got, and when the
        task went idle, once per batch when that changed, so downstream
        windows close even where no row goes."""
        if not self.spec.outputs:
            return
        unsent = self.watermarks.take_unsent(self.inputs, self.downstream_watermark)
        if unsent is not None:
            self.output.watermark(*unsent)

    def follow_event_time(self) -> None:
        """After a batch: what it changed of idleness (a batch without a
        partition's records, ``WatermarkTracker.batch``), then what goes
        downstream."""
        if self.watermarks.has_event_time:
            self.watermark_moved(min(self.spec.inputs))
            self.forward_watermark()
