"""A task's data path: the records of a data segment decoded as their channel
is read (an ingress topic's JSON or Avro, a stage's Arrow batches, or rows
the stage's Spark code prepared), each row traced to the ingress record it
came from, run through the operator (the rows it raises on set aside,
``record_errors``), and what comes out sent on (``output``) or to the dead
letters (``quarantine``); and the task's event time followed: the operator
told when the watermark moved, what that releases sent on, and downstream
told how far event time got."""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import ChannelId
from operators import concat
from operators.base import WatermarkAware, savepoint_of, takes_origin
from operators.dead_letters import ORIGIN, ORIGIN_TYPE, DeadLetter, without_origin
from operators.errors import InputSchemaError
from operators.isolation import SearchBounded, isolate, said
from operators.keyed import KeyedAggregate
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import EVENT_TIME, PARTIAL, REASON, RECORDS, ROW, Part, is_prepared, part_of
from streaming.api.pipeline import Pipeline, TaskSpec
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.output import TaskOutput
from streaming.engine.task.quarantine import Quarantine
from streaming.engine.task.record_errors import RecordErrors
from streaming.engine.task.watermarks import WatermarkTracker
from streaming.errors import RecordErrorsStop, isolatable

__all__ = ["RecordProcessor"]

# how records of a channel the task does not know are read: as an ingress's, no Arrow batch taken
_UNKNOWN_CHANNEL = codec.ChannelReading.ingress(None)


class RecordProcessor:
    """The data path of task ``spec`` (see the module docstring) through its
    ``operator``; ``open_inputs`` says which input channels are still open
    (the handler knows), for the watermark; ``errors``, what rows the
    operator raises on do (``record_errors.RecordErrors``)."""

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
        errors: RecordErrors | None = None,
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
        # what a row the operator raises on does (``record_errors``): the job's record_errors and its brake
        self.errors = errors or RecordErrors(spec.name)
        self._multi_input = bool(getattr(operator, "inputs", None))
        # how each input channel's records are read: an ingress topic's as its schema says (JSON
        # or Avro, never an Arrow batch), a stage's output topic's as Arrow batches within the cap
        self._readings = {channel: self._reading(name, max_decoded_bytes) for channel, name in spec.inputs.items()}
        # rows go to the operator with the record each came from (operators.dead_letters.ORIGIN),
        # so its dead letters name it; an operator of one's own gets them as the input has them
        self._origins = takes_origin(operator)
        # a stage's Spark code gives each row at its record's offset, unless Spark computes the partial
        # aggregates of a KeyedAggregate after it (rows placed at their run's end)
        self._prepared_at_records = not isinstance(operator, KeyedAggregate)

    def _is_ingress(self, channel: ChannelId) -> bool:
        return self._readings.get(channel, _UNKNOWN_CHANNEL).max_decoded_bytes is None

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
        ingress = self._is_ingress(channel)
        aside: list[int] = []  # rows the operator raised on, set aside
        if decoded.table.num_rows:
            batch = self._traced(channel, rows, decoded)
            set_aside = (
                self._record_aside(channel, rows, decoded.index) if ingress else self._row_aside(channel, batch, rows)
            )
            try:
                output, aside = self._operate(channel, batch, rows, set_aside)
            except InputSchemaError as exc:
                # records the operator cannot take at all: quarantined, with the reason
                for index in sorted(set(decoded.index)):
                    self.quarantine.record(channel, rows.slice(index, 1), str(exc), counted_as="refused")
                output = None
            given_up = self.quarantine.from_operator(channel, self.operator, rows)
            aside = sorted({*aside, *_given_up(batch, given_up)}) if given_up else aside
            self.output.emit(output, watermark)
        # rows set aside, and rows the operator gave up on (dead letters it chose), do not move
        # event time: as if they had not been there
        self.watermarks.observe(channel, *_without(aside, rows, decoded, ingress=ingress))
        self.watermark_moved(channel)
        self.counters["records"] += rows.num_rows
        self.metrics.records_in[channel].inc(rows.num_rows)

    def _apply(self, channel: ChannelId, batch: pa.Table) -> pa.Table:
        if self._multi_input:
            return self.operator.process({self.spec.inputs[channel]: batch})
        return self.operator.process(batch)

    def _operate(
        self, channel: ChannelId, batch: pa.Table, records: pa.Table, set_aside: Callable[[int, str], int]
    ) -> tuple[pa.Table, list[int]]:
        """``batch`` (rows read from ``records`` of ``channel``) through the
        operator: its output, and the rows set aside.  When it raises, the
        operator is put back and the rows it raises on alone are set aside
        (``record_errors``): ``set_aside(i, reason)`` sends row i to the dead
        letters and says the offset of its record."""
        self.errors.processed(batch.num_rows)
        back = savepoint_of(self.operator)
        try:
            return self._apply(channel, batch), []
        except InputSchemaError:
            back()
            self.errors.rolled_back = True
            raise
        except Exception as exc:
            if not isolatable(exc):
                raise
            back()
            self.errors.rolled_back = True
            self.errors.met(channel, records["offset"].to_pylist(), exc, self.spec.stage)
            failed = exc
        try:
            outputs, isolated = isolate(
                batch.num_rows,
                lambda start, end: self._apply(channel, batch.slice(start, end - start)),
                lambda: savepoint_of(self.operator),
                failed,
                isolatable=isolatable,
                most=self.errors.max_records,
            )
        except SearchBounded as exc:  # more in this run alone than the brake lets through
            raise RecordErrorsStop(
                f"task {self.spec.name}: stage {self.spec.stage}: {exc}: more than max_isolated_records "
                f"({self.errors.max_records}) in one run of records; the job stops rather than send the stream "
                "to the dead letters"
            ) from None
        for one in isolated:
            offset = set_aside(one.index, f"stage {self.spec.stage} raised {said(one.error)}")
            self.errors.isolate(channel, offset, one.error)
        return (concat(outputs) if outputs else pa.table({})), [one.index for one in isolated]

    def _record_aside(
        self, channel: ChannelId, records: pa.Table, record_of: Sequence[int]
    ) -> Callable[[int, str], int]:
        """Row i to the dead letters as the record it was read from (``record_of[i]`` of ``records``)."""

        def set_aside(index: int, reason: str) -> int:
            record = records.slice(record_of[index], 1)
            self.quarantine.record(channel, record, reason, counted_as="raised")
            return int(record["offset"][0].as_py())

        return set_aside

    def _row_aside(
        self, channel: ChannelId, batch: pa.Table, records: pa.Table | None, origins: pa.Table | None = None
    ) -> Callable[[int, str], int]:
        """Row i of ``batch`` to the dead letters as the ingress record its
        origin names (``ORIGIN``, or row i of ``origins``: topic, partition,
        offset), read back from ``records`` or Kafka, or else as the row."""

        def set_aside(index: int, reason: str) -> int:
            row = batch.slice(index, 1).to_pylist()[0]
            if origins is not None:
                row[ORIGIN] = origins.slice(index, 1).to_pylist()[0]
            self.quarantine.letters(channel, [DeadLetter(row, reason, "")], records, counted_as="raised")
            origin = row.get(ORIGIN)
            offset = origin.get("offset") if isinstance(origin, dict) else None
            return offset if isinstance(offset, int) else -1

        return set_aside

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
        ingress = self._is_ingress(channel)
        carried = None if position < 0 or ingress else table[ORIGIN]
        if carried is not None and carried.type == ORIGIN_TYPE and carried.null_count == 0:
            return table  # every row names its ingress record
        n = table.num_rows
        index = decoded.index
        if ingress and len(index) == rows.num_rows:
            offsets = rows["offset"]  # an ingress record is one row at most: none was rejected
        else:
            offsets = rows["offset"].take(pa.array(index, pa.int64()))
        here = _origin(channel.topic, pa.repeat(pa.scalar(channel.partition, pa.int32()), n), offsets)
        if position < 0:
            return table.append_column(ORIGIN, here)
        if carried is None or carried.type != ORIGIN_TYPE:
            # an ingress record's own field of that name, or a column of another type: not an origin
            return table.set_column(position, ORIGIN, here)
        return table.set_column(position, ORIGIN, pc.coalesce(carried, here))

    def _process_prepared(self, channel: ChannelId, rows: pa.Table) -> None:
        """A run of a micro-batch the stage's Spark code prepared: its rows go
        to the operator, then the partial aggregates Spark computed for it
        (``merge_partials``), the records Spark could not decode, and those
        its code raised on, to the dead letters, and the run's markers say how many records it had and how far
        their event time got (``streaming.adapters.spark.stage``)."""
        rejected = part_of(rows, Part.REJECTED)
        for index, reason in enumerate(rejected[REASON].to_pylist()):
            self.quarantine.record(channel, rejected.slice(index, 1), reason)
        raised = part_of(rows, Part.RAISED)
        if raised.num_rows:
            self._raised_in_spark(channel, raised)
        watermark = self.downstream_watermark
        made = part_of(rows, Part.ROW)
        batch = pa.Table.from_struct_array(made[ROW].combine_chunks())
        if batch.num_rows and self._origins and self._prepared_at_records and self._is_ingress(channel):
            # each row stands at the ingress record it came from: its origin, as a Python stage's rows have it
            batch = batch.append_column(ORIGIN, _origin(channel.topic, made["partition"], made["offset"]))
        excluded: list[int] = []  # rows the operator raised on or gave up on
        if batch.num_rows:
            set_aside = self._row_aside(channel, batch, None, made.select(["topic", "partition", "offset"]))
            try:
                output, excluded = self._operate(channel, batch, made, set_aside)
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
            given_up = self.quarantine.from_operator(channel, self.operator)
            excluded = sorted({*excluded, *_given_up(batch, given_up)}) if given_up else excluded
            self.output.emit(output, watermark)
        partials = part_of(rows, Part.PARTIAL)
        if partials.num_rows:
            self.output.emit(self.operator.merge_partials(pa.Table.from_struct_array(partials[PARTIAL])), watermark)
        markers = part_of(rows, Part.MARKER)
        highest = pc.max(markers[EVENT_TIME]).as_py()
        if excluded:
            # rows set aside or given up on do not move event time, as on the Python path: the run
            # moves it as far as the rows kept, where they carry the event-time column (the records
            # the code filtered out then move it with the next run's); otherwise as Spark measured it
            kept = np.ones(batch.num_rows, dtype=bool)
            kept[excluded] = False
            carried, in_kept = self.watermarks.event_time_of(channel, batch.filter(pa.array(kept)))
            highest = in_kept if carried else highest
        self.watermarks.observe_event_time(channel, highest)
        self.watermark_moved(channel)
        records = (pc.sum(markers[RECORDS]).as_py() or 0) + raised.num_rows
        self.counters["records"] += records
        self.metrics.records_in[channel].inc(records)

    def _raised_in_spark(self, channel: ChannelId, raised: pa.Table) -> None:
        """Records the stage's Spark code raised on, set aside by Spark
        (``Part.RAISED``), to the dead letters: an ingress record as it came;
        a row of another stage's Arrow batch (a record of its own row) as the
        ingress record its origin names, as an operator's dead letter is."""
        offsets, reasons = raised["offset"].to_pylist(), raised[REASON].to_pylist()
        self.errors.met(channel, offsets, reasons[0], self.spec.stage)
        self.errors.processed(raised.num_rows)
        cap = self._readings.get(channel, _UNKNOWN_CHANNEL).max_decoded_bytes
        for index, (offset, reason) in enumerate(zip(offsets, reasons)):
            record = raised.slice(index, 1)
            row = codec.read_batch(record["value"][0].as_py(), cap) if cap is not None else None
            if isinstance(row, pa.Table) and row.num_rows == 1:
                self.quarantine.letters(channel, [DeadLetter(row.to_pylist()[0], reason, "")], counted_as="raised")
            else:
                self.quarantine.record(channel, record, reason, counted_as="raised")
            self.errors.isolate(channel, offset, reason)

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


def _given_up(batch: pa.Table, origins: set[tuple[ChannelId, int]]) -> list[int]:
    """The rows of ``batch`` whose origin is among ``origins`` (those the operator gave up on)."""
    if ORIGIN not in batch.column_names:
        return []
    found = []
    for index, origin in enumerate(batch[ORIGIN].to_pylist()):
        if isinstance(origin, dict) and origin.get("offset") is not None:
            named = (ChannelId(str(origin["topic"]), int(origin["partition"])), int(origin["offset"]))
            if named in origins:
                found.append(index)
    return found


def _without(aside: list[int], rows: pa.Table, decoded: codec.Decoded, *, ingress: bool) -> tuple[pa.Table, pa.Table]:
    """``rows`` and their decoded table without the rows ``aside`` (those
    the operator raised on; an ingress record goes with its row)."""
    if not aside:
        return rows, decoded.table
    kept = np.ones(decoded.table.num_rows, dtype=bool)
    kept[aside] = False
    if ingress:
        records = np.ones(rows.num_rows, dtype=bool)
        records[[decoded.index[i] for i in aside]] = False
        rows = rows.filter(pa.array(records))
    return rows, decoded.table.filter(pa.array(kept))


def _origin(topic: str, partitions: pa.Array | pa.ChunkedArray, offsets: pa.Array | pa.ChunkedArray) -> pa.StructArray:
    """The origin (``ORIGIN_TYPE``) of rows read from ``topic`` at ``partitions`` and ``offsets``."""

    def whole(values: pa.Array | pa.ChunkedArray, type_: pa.DataType) -> pa.Array:
        values = values.cast(type_)
        return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values

    n = len(offsets)
    return pa.StructArray.from_arrays(
        [
            pa.DictionaryArray.from_arrays(pa.nulls(n, pa.int32()).fill_null(0), pa.array([topic])),
            whole(partitions, pa.int32()),
            whole(offsets, pa.int64()),
        ],
        fields=list(ORIGIN_TYPE),
    )
