"""Spark code in a stage: what Spark does on the executors with each
micro-batch of a stage given ``spark=`` (``streaming.api.pipeline.Stage``)
before anything reaches Python.

For each micro-batch of the stage's Kafka query, Spark:

1. tells control records (barriers, cancellations, watermark records: the
   ``abs.kind`` header) from data records, and decodes the data records with
   the ingress schema (``from_json``, or ``from_avro`` for an Avro ingress;
   after other stages, ``spark_abs.Runs`` reads their Arrow batches);
   control records, and the records that
   do not decode, go to the task as they came (the latter to the dead
   letters, with their reason);
2. hands the decoded records, with ``_position`` (their topic, partition and
   offset), to the stage's code, a function from DataFrame to DataFrame or a
   SQL query over ``{input}``.  Every row of its output keeps ``_position``:
   the record it came from.  That is what lets a barrier cut a Spark stage
   exactly where it is (rows of records before barrier n belong to
   checkpoint n, the others to n + 1, aligned or unaligned) and keeps
   unaligned channel state an offset range: reading the range again and
   running the code again gives the same rows;
3. adds a *marker* per run of data records between two control records of a
   channel: the run's last offset, its record count and its highest event
   time, taken before the code, so records the code filters out still move
   the channel's position and event time;
4. when the stage's operator is a ``KeyedAggregate`` over the code's
   columns, computes its partial aggregates per channel, run and key, and
   places every row of such a run at the run's end: a partial stands for
   records all through the run, so the task takes the run whole and no
   checkpoint falls inside it (docs/spark-stages.md).

Only the code's output columns (or the partials), the control and
undecodable records and the markers cross to Python (``streaming.adapters.serde.records.Part`` says which
row is which).  Code whose output cannot keep positions (an aggregation,
a window function, a limit, deduplication across records) is refused when
the stage starts, with the reason; stateful work belongs to the stage's
operator, which receives the code's rows."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import logging
import re
from collections.abc import Callable, Iterator, Mapping
from operator import or_
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.errors import PySparkException
from pyspark.errors.exceptions.captured import CapturedException
from pyspark.logger import PySparkLogger
from pyspark.sql import Column, DataFrame, Observation, Row, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType

from barriers.headers import GENERATION_HEADER, KIND_HEADER, WATERMARK_HEADER
from barriers.lineage import Lineage
from barriers.messages import ChannelId
from operators.aggregations import AggregateFunction, Aggregation, input_columns
from operators.isolation import Isolated, SearchBounded, isolate, said
from operators.keyed import KeyedAggregate
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import (
    BATCH_COLUMNS,
    EVENT_TIME,
    PART,
    PARTIAL,
    REASON,
    RECORD_SCHEMA,
    RECORDS,
    ROW,
    Part,
    unreadable_headers,
)
from streaming.adapters.spark.decoding import DECODED, SparkDecoding, StageRows
from streaming.api.pipeline import Ingress, Pipeline, Stage
from streaming.errors import ChannelQueryError, ConfigError, RecordErrorsStop, isolatable
from streaming.waits import poll_until

__all__ = ["POSITION", "SparkStage", "spark_stages"]

log = logging.getLogger(__name__)

# how far the search of a micro-batch for the records its Spark code raises on goes (a try is a Spark
# job): code that raises on more records than this, or for longer, stops the job (RecordErrorsStop)
SEARCH_MOST = 100
SEARCH_S = 300.0

# how the errors of the engine's JVM parts (spark_abs.Runs) begin
_ENGINE_SAYS = "spark-abs: "
# what Spark says when it stops or cancels a job rather than runs the code
_STOPPING = ("SparkContext was shut down", "cancelled", "InterruptedException", "SparkContext has been shutdown")

# the column every row of a stage's Spark code carries: the record it came from
POSITION = "_position"
# and its run: how many control records of its channel came before it in the micro-batch
POSITION_TYPE = StructType(
    [
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("_abs_run", IntegerType(), nullable=False),
    ]
)

_BAD = "_abs_bad"
_CONTROL = "_abs_control"
_RUN = "_abs_run"
# a record an older generation wrote after its channel's restored barrier (spark_abs.Runs skips it)
_STALE = "_abs_stale"

# logical plan nodes whose output rows no longer stand for one input record each
_LOSES_POSITIONS = {
    "Aggregate": "an aggregation combines records",
    "Window": "a window function reads across records",
    "Distinct": "DISTINCT combines records",
    "Deduplicate": "dropDuplicates combines records",
    "DeduplicateWithinWatermark": "dropDuplicatesWithinWatermark combines records",
    "GlobalLimit": "a limit depends on how records fall into micro-batches",
    "LocalLimit": "a limit depends on how records fall into micro-batches",
    "Tail": "a tail depends on how records fall into micro-batches",
    "Offset": "an offset depends on how records fall into micro-batches",
    "Sample": "sampling depends on how records fall into micro-batches",
    "Intersect": "INTERSECT combines records",
    "Except": "EXCEPT combines records",
}
_SPARK_AGGREGATES = {
    AggregateFunction.COUNT: F.count,
    AggregateFunction.SUM: F.sum,
    AggregateFunction.MIN: F.min,
    AggregateFunction.MAX: F.max,
}
# how long Spark may take to hand over what a micro-batch's observations saw, once its job ended
OBSERVED_BOUND_S = 60.0
_OBSERVATIONS = itertools.count()
_NODE = re.compile(r"^[\s:+\-!]*([A-Za-z]+)")


@dataclasses.dataclass(frozen=True)
class _Steps:
    """The column expressions of a prepared micro-batch's plan
    (``SparkStage._plan``): made once per stage, as pyspark makes each
    expression with a call into the JVM."""

    decode: list[Column | str]
    flag: list[Column | str]
    side: list[Column]
    good: Column
    view: list[Column]
    out: list[Column | str]
    rows: list[Column | str]
    # with a keyed aggregate after the code
    keyed: Column | None = None
    unkeyed: Column | None = None
    unkeyed_count: Column | None = None
    group: list[str] = dataclasses.field(default_factory=list)
    aggregates: list[Column] = dataclasses.field(default_factory=list)
    partials: list[Column | str] | None = None


class SparkStage:
    """The Spark code of stage ``stage`` reading ``source`` (an ingress
    topic, or other stages' rows), on session ``spark``: checked when made (``check``), then called with each
    micro-batch of the stage's query (``__call__``) or with Kafka records
    read back in Python (``records``), giving a prepared micro-batch."""

    def __init__(self, spark: SparkSession, stage: Stage, source: Ingress | StageRows):
        if stage.spark is None or source.schema is None:
            raise ConfigError(f"stage {stage.name}: no Spark code, or its input has no schema")
        self.name = stage.name
        self._spark = spark
        self._code = stage.spark
        # how the input records are decoded in Spark, and why one that is not is no row
        self._input = SparkDecoding(stage.name, source, reserved=(POSITION,))
        self._fields = self._input.fields
        # what older generations wrote after their channels' restored barriers (``skip_stale``)
        self._stale: Column | None = None
        self.columns = self.check()
        # the code's rows as Arrow gets them (what Spark code after this stage reads, no operator between)
        self.output_schema: pa.Schema = self._output_schema
        # a keyed aggregate after the code: Spark computes its partials per key and run of records
        self._partial = _partial_spec(stage.make_operator(), self.columns)
        self._steps = self._plan()
        self._no_rows: pa.Table | None = None

    def _plan_writers(self) -> None:
        """With ``registry=True``: the plan again when the registry holds
        writer schemas of the topic's subject that it does not decode yet
        (``SparkDecoding.new_writers``)."""
        readable = self._input.new_writers()
        if readable is not None:
            previous, self._input.writer_ids = self._input.writer_ids, readable
            try:
                self._steps = self._plan()
            except Exception:
                self._input.writer_ids = previous
                raise

    # ------------------------------------------------------------ the code

    def _view_schema(self) -> StructType:
        return StructType([*self._fields.fields, StructField(POSITION, POSITION_TYPE, nullable=False)])

    def _apply(self, view: DataFrame) -> DataFrame:
        what = f"stage {self.name}: its Spark code"
        try:
            # a micro-batch's frame has a session of its own (foreachBatch): the view lives there
            code = self._code
            with _quiet_query_context():
                out = view.sparkSession.sql(code, input=view) if isinstance(code, str) else code(view)
        except PySparkException as exc:
            said = str(exc).splitlines()[0]  # the plan Spark adds after it says less than the schema
            raise ConfigError(f"{what} failed on its input ({_columns(self._view_schema())}): {said}") from exc
        if not isinstance(out, DataFrame):
            raise ConfigError(f"{what} returned {type(out).__name__}, not a DataFrame")
        return out

    def check(self) -> list[str]:
        """Run the code on an empty input: its output keeps ``_position`` and
        has no step that loses it; the output columns (``_position`` aside)."""
        out = self._apply(self._spark.createDataFrame([], self._view_schema()))
        fields = {f.name: f.dataType for f in out.schema.fields}
        if fields.get(POSITION) != POSITION_TYPE:
            found = "drops it" if POSITION not in fields else f"makes it {fields[POSITION].simpleString()}"
            raise ConfigError(
                f"stage {self.name}: the output of its Spark code must keep {POSITION} (the record each row "
                f"came from, so barriers cut the stage exactly), but the code {found}. Select it with the "
                f"columns you keep, e.g. df.select('{POSITION}', ...) or SELECT {POSITION}, ... FROM {{input}}"
            )
        losing = _losing_steps(out)
        if losing:
            raise ConfigError(
                f"stage {self.name}: its Spark code loses the positions of records ({'; '.join(losing)}): "
                "each output row must come from one input record. Do per-record work in Spark "
                "and stateful work (aggregates, windows, deduplication) in the stage's operator"
            )
        columns = [name for name in out.columns if name != POSITION]
        if not columns:
            raise ConfigError(f"stage {self.name}: its Spark code keeps no column besides {POSITION}")
        self._output_schema = to_arrow_schema(out.select(*columns).schema, timezone=_time_zone(out))
        return columns

    # -------------------------------------------------------- micro-batches

    def __call__(self, batch: DataFrame) -> pa.Table:
        """A micro-batch of Kafka records (Spark's Kafka source columns),
        prepared (see the module docstring)."""
        return self.collect(batch)()

    def collect(self, batch: DataFrame) -> Callable[[], pa.Table]:
        """Spark's part of preparing ``batch`` (``_collect``); when the
        stage's code raises on it, the records it raises on, each alone, are
        found and set aside as ``Part.RAISED`` and the rest is prepared
        without them (``_isolating``)."""
        try:
            return self._collect(batch)
        except Exception as exc:
            if not _the_codes(exc):
                raise
            return self._isolating(batch, exc)

    def _isolating(self, batch: DataFrame, failed: Exception) -> Callable[[], pa.Table]:
        """``batch``, on which preparing raised ``failed``, prepared again
        from its records read into Python, without those the stage's code
        raises on alone (``operators.isolation.isolate``; the
        code keeps no state: nothing to put back between tries), each of
        them a ``Part.RAISED`` row with the exception.  When the records
        cannot be read (Kafka is away), ``failed`` is raised: not a record's
        doing."""
        try:
            records = _in_order(batch.select(*BATCH_COLUMNS).toArrow().cast(RECORD_SCHEMA))
        except Exception:
            raise failed from None
        log.warning(
            "stage %s: its Spark code raised %s on a micro-batch of %d records; finding the records it raises on",
            self.name,
            said(failed),
            records.num_rows,
        )
        outputs, isolated = self._search(
            records.num_rows, lambda start, end: self._prepare(_rows(records, start, end)), failed
        )
        raised = []
        for one in isolated:
            record = _rows(records, one.index, one.index + 1)
            rows = self._rows_of(record)
            if rows is None:
                raised.append(_raised(record, self.name, one.error))
                continue
            # a stage's Arrow batch: the rows the code raises on alone go aside, the others on in the record
            output, aside = self._without_raising_rows(record, rows, one.error)
            outputs.append(output)
            raised += aside
        log.warning("stage %s: %d records (or rows) set aside of %d", self.name, len(raised), records.num_rows)
        table = _in_order(pa.concat_tables([*outputs, *raised], promote_options="permissive"))
        return lambda: table

    def _search(
        self, rows: int, attempt: Callable[[int, int], pa.Table], failed: Exception
    ) -> tuple[list[pa.Table], list[Isolated]]:
        """``isolate`` over ``rows`` rows within ``SEARCH_MOST`` and ``SEARCH_S``: past them, the job stops."""
        try:
            return isolate(
                rows, attempt, _unchanged, failed, isolatable=_the_codes, most=SEARCH_MOST, within_s=SEARCH_S
            )
        except SearchBounded as exc:
            raise RecordErrorsStop(
                f"stage {self.name}'s Spark code: {exc}. The job stops: code that raises on so many records "
                "is not a few bad records"
            ) from None

    def _rows_of(self, record: pa.Table) -> pa.Table | None:
        """The rows of ``record`` when it is another stage's Arrow batch of
        more than one row (within the cap), else None: it goes aside whole."""
        if self._input.arrow_cap is None:
            return None
        rows = codec.read_batch(record["value"][0].as_py(), self._input.arrow_cap)
        return rows if isinstance(rows, pa.Table) and rows.num_rows > 1 else None

    def _without_raising_rows(
        self, record: pa.Table, rows: pa.Table, failed: Exception
    ) -> tuple[pa.Table, list[pa.Table]]:
        """``record`` (an Arrow batch of ``rows``, on which the code raised
        ``failed``) prepared without the rows the code raises on alone, and
        each of those as a ``Part.RAISED`` record of its own row."""

        def carrying(part: pa.Table) -> pa.Table:
            [value] = codec.encode_batches(part) or [b""]
            return record.set_column(record.schema.get_field_index("value"), "value", pa.array([value], pa.binary()))

        _, isolated = self._search(
            rows.num_rows, lambda start, end: self._prepare(carrying(rows.slice(start, end - start))), failed
        )
        aside = {one.index for one in isolated}
        kept = rows.filter(pa.array([i not in aside for i in range(rows.num_rows)]))
        raised = [_raised(carrying(rows.slice(one.index, 1)), self.name, one.error) for one in isolated]
        return (self._prepare(carrying(kept)) if kept.num_rows else record.slice(0, 0)), raised

    def _collect(self, batch: DataFrame) -> Callable[[], pa.Table]:
        """Spark's part of preparing ``batch``, done now, in one pass over
        the records: ``spark_abs.Runs`` numbers the runs of each channel and
        ends each with a marker, the markers and the raw records leave by an
        observation on the way, and the good records go on through the code
        (and the partial aggregates) to the result.  A second job runs only
        when the code gave rows without a key for the operator's partials.
        Returns Python's part, which puts the pieces together (a stage
        query runs it on its processing thread, while Spark reads the next
        micro-batch)."""
        if self._input.registered:
            self._plan_writers()
        steps = self._steps
        if self._input.arrow_cap is not None:
            decode = steps.decode if self._stale is None else [*steps.decode, self._stale.alias(_STALE)]
            numbered = _numbered_arrow(batch.select(*decode), self._fields, self._input.arrow_cap)
        else:
            numbered = _numbered(batch.select(*steps.decode).select(*steps.flag))
        side = Observation(f"abs-side-{next(_OBSERVATIONS)}")
        view = numbered.observe(side, *steps.side).filter(steps.good).select(*steps.view)
        out = self._apply(view).select(*steps.out)
        results = self._with_partials(out, steps) if steps.partials else [out.select(*steps.rows).toArrow()]
        seen = _observed(side, self.name)
        return functools.partial(_prepared, results, seen["markers"], seen["raw"], self._input.reasons)

    def skip_stale(self, lineages: Mapping[ChannelId, Lineage]) -> None:
        """Skip, on the channels of ``lineages`` (each with its task's
        lineage), what older generations wrote after the barrier the channel
        was restored at: the new generation writes it again.  Each such
        record counts for its channel's position and gives no rows (as
        Python's ``SKIP`` segments, streaming.engine.task.segments).  Only
        Spark code after other stages reads records that can be stale."""
        if self._input.arrow_cap is not None:
            self._stale = _stale_records(lineages)

    def _with_partials(self, out: DataFrame, steps: _Steps) -> list[pa.Table]:
        """The operator's partial aggregates of the code's rows per channel,
        run and key (``KeyedAggregate.merge_partials`` folds them into its
        state), and the rows whose key is null (the operator names them dead
        letters), fetched by a second job only when there are any."""
        assert steps.keyed is not None and steps.unkeyed is not None and steps.unkeyed_count is not None
        unkeyed = Observation(f"abs-unkeyed-{next(_OBSERVATIONS)}")
        partials = (
            out.observe(unkeyed, steps.unkeyed_count)
            .filter(steps.keyed)
            .groupBy(*steps.group)
            .agg(*steps.aggregates)
            .select(*(steps.partials or ()))
            .toArrow()
        )
        rows = out.filter(steps.unkeyed).select(*steps.rows)
        if not _observed(unkeyed, self.name)["rows"]:
            return [partials, self._empty_rows(rows)]
        return [partials, rows.toArrow()]

    def _empty_rows(self, rows: DataFrame) -> pa.Table:
        if self._no_rows is None:
            self._no_rows = to_arrow_schema(rows.schema, timezone=_time_zone(rows)).empty_table()
        return self._no_rows

    def _plan(self) -> _Steps:
        """The column expressions of every micro-batch's plan, made once."""
        control = F.col(_CONTROL)
        # a record without headers has none: not a control record
        is_control = F.coalesce(F.array_contains(F.col("headers.key"), KIND_HEADER), F.lit(False))
        # Arrow batches: spark_abs.Runs reads them and says which it could not read
        decoding = self._input
        # an ingress record that does not decode, or whose abs.wm or abs.gen is no whole number (as Python's
        # segmenter rejects it: streaming.adapters.serde.records.whole_numbers)
        bad = ~control & (decoding.undecoded() | _unreadable_headers() if decoding.arrow_cap is None else F.lit(False))
        good_time = F.when(~control & ~bad, decoding.event_time) if decoding.event_time is not None else F.lit(None)
        marker = F.col(RECORDS).isNotNull()
        raw = F.struct(
            *(F.col(name) for name in BATCH_COLUMNS[:-1]), F.unix_millis("timestamp").alias("timestamp"), control
        )
        position = [F.col(f"{POSITION}.{name}").alias(name) for name in ("topic", "partition", "offset", _RUN)]
        row_part = F.lit(int(Part.ROW)).cast("tinyint").alias(PART)
        steps = _Steps(
            decode=(
                [*BATCH_COLUMNS, is_control.alias(_CONTROL), decoding.decode().alias(DECODED)]
                if decoding.arrow_cap is None
                else ["topic", "partition", "offset", is_control.alias(_CONTROL), *BATCH_COLUMNS[3:]]
            ),
            flag=[
                "topic",
                "partition",
                "offset",
                _CONTROL,
                good_time.cast("long").alias(EVENT_TIME),
                bad.alias(_BAD),
                # the raw columns only where the record goes to Python as it came: rows stay narrow
                *(F.when(control | bad, F.col(name)).alias(name) for name in BATCH_COLUMNS[3:]),
                DECODED,
            ],
            side=[
                F.collect_list(
                    F.when(marker, F.struct("topic", "partition", "offset", _RUN, RECORDS, EVENT_TIME))
                ).alias("markers"),
                F.collect_list(F.when(~marker & (control | F.col(_BAD)), raw)).alias("raw"),
            ],
            good=~marker & ~control & ~F.col(_BAD),
            view=[
                *(F.col(f"{DECODED}.{name}").alias(name) for name in self._fields.names),
                F.struct("topic", "partition", "offset", _RUN).alias(POSITION),
            ],
            out=[*position, *self.columns],
            # without partials the rows stay at their records (no run is taken whole)
            rows=[
                "topic",
                "partition",
                "offset",
                *([_RUN] if self._partial is not None else []),
                row_part,
                _struct(self.columns).alias(ROW),
            ],
        )
        if self._partial is None:
            return steps
        key, aggregations = self._partial
        aggregates = []
        for name, aggregation in aggregations.items():
            column = F.lit(1) if aggregation.column is None else F.col(aggregation.column)
            aggregates.append(_SPARK_AGGREGATES[aggregation.function](column).alias(name))
        return dataclasses.replace(
            steps,
            keyed=F.col(key).isNotNull(),
            unkeyed=F.col(key).isNull(),
            unkeyed_count=F.count(F.when(F.col(key).isNull(), F.lit(1))).alias("rows"),
            group=["topic", "partition", _RUN, key],
            aggregates=aggregates,
            partials=[
                "topic",
                "partition",
                _RUN,
                F.lit(int(Part.PARTIAL)).cast("tinyint").alias(PART),
                _struct([key, *aggregations]).alias(PARTIAL),
            ],
        )

    def records(self, records: pa.Table) -> pa.Table:
        """Kafka records read in Python (``RECORD_SCHEMA``: channel state
        copied into a snapshot, held records read back), prepared as the
        query would have prepared them."""
        if records.num_rows == 0:
            return records
        ordered = _in_order(records.select(list(BATCH_COLUMNS)).cast(RECORD_SCHEMA))
        # in one partition, in channel and offset order, as a query hands each channel over
        frame = self._spark.createDataFrame(ordered).coalesce(1)
        return _in_order(self(frame))

    def _prepare(self, records: pa.Table) -> pa.Table:
        """``records`` (in order, ``RECORD_SCHEMA``) prepared, without looking
        for records the code raises on: one try of ``_isolating``."""
        if records.num_rows == 0:
            return records
        return _in_order(self._collect(self._spark.createDataFrame(records).coalesce(1))())


def _raised(record: pa.Table, stage: str, error: Exception) -> pa.Table:
    """``record`` as a ``Part.RAISED`` row: stage ``stage``'s Spark code
    raised ``error`` on it (its type and the first line of its message:
    Spark adds the query's context on the lines after it)."""
    reason = f"stage {stage}'s Spark code raised {said(error).splitlines()[0]}"
    return record.append_column(PART, pa.array([int(Part.RAISED)], pa.int8())).append_column(
        REASON, pa.array([reason], pa.string())
    )


def _the_codes(error: BaseException) -> bool:
    """Whether ``error``, met preparing a micro-batch, may be the stage's
    code's on a record: an error Spark raised running the plan and pyspark
    names (``CapturedException``: ``ArithmeticException``,
    ``NumberFormatException``, a ``PythonException`` of a UDF, ...), not one
    of the engine's own (its JVM parts say ``spark-abs:``), nor Spark
    stopping or cancelling the job (a worker that stops, a lost executor:
    an ``InterruptedException`` is no ``CapturedException``), nor an error
    of Python's side (``streaming.errors.isolatable``)."""
    if not (isolatable(error) and isinstance(error, CapturedException)):
        return False
    said = str(error)
    return _ENGINE_SAYS not in said and not any(stop in said for stop in _STOPPING)


def _rows(table: pa.Table, start: int, end: int) -> pa.Table:
    """Rows ``[start, end)`` of ``table`` in arrays of their own: a slice's
    offsets into a null bitmap are more than pyspark's conversion takes
    ("Null bitmap with offsets slice not supported")."""
    return table.take(pa.array(range(start, end), pa.int64()))


def _in_order(table: pa.Table) -> pa.Table:
    """``table``'s rows in channel and offset order (a stable sort: rows of one offset keep theirs)."""
    return table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


def _unchanged() -> Callable[[], None]:
    """A savepoint of Spark code: it keeps no state, there is nothing to put back."""
    return lambda: None


@contextlib.contextmanager
def _quiet_query_context() -> Iterator[None]:
    """pyspark logs a query it refuses with its whole context; the
    ``ConfigError`` made of the refusal says what matters."""
    # pyspark's own logger class: a plain one made here first would be the one pyspark gets, and its
    # errors' logging (keyword arguments a plain logger refuses) would raise a TypeError in their stead
    loggers = [PySparkLogger.getLogger(name) for name in ("SQLQueryContextLogger", "DataFrameQueryContextLogger")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _partial_spec(operator: object, columns: list[str]) -> tuple[str, dict[str, Aggregation]] | None:
    """What of the stage's operator Spark computes per run of records: the
    key and aggregations of a ``KeyedAggregate`` over the code's columns."""
    if not isinstance(operator, KeyedAggregate):
        return None
    if not {operator.key, *input_columns(operator.aggregations)} <= set(columns):
        return None  # the operator will say what it misses
    return operator.key, dict(operator.aggregations)


def _time_zone(frame: DataFrame) -> str:
    """The zone ``toArrow`` gives a timestamp column (the session's)."""
    return frame.sparkSession.conf.get("spark.sql.session.timeZone") or "UTC"


def _struct(columns: list[str]) -> Column:
    """``columns`` as a struct whose fields may all be null: a count or a
    literal is never null in Spark's eyes, but the rows of the other parts
    of a prepared micro-batch have no struct at all, which Arrow refuses
    for a field said never to be null."""
    return F.struct(*(F.when(F.col(c).isNotNull(), F.col(c)).alias(c) for c in columns))


def _at_run_ends(rows: pa.Table, markers: pa.Table) -> pa.Table:
    """``rows`` (partials, and with partials the code's rows) each placed at
    the end of its run (its marker's offset): a partial stands for records
    all through the run, so the task takes a run whole, after it, and a
    checkpoint never falls inside it (where the records before would be in
    neither the state nor the channel state)."""
    at = pc.index_in(_run_keys(rows, markers), value_set=_run_keys(markers, markers))
    if at.null_count:  # every run with a row has its marker
        raise ChannelQueryError(f"{at.null_count} of {rows.num_rows} rows found no end of their run")
    ends = pc.take(markers["offset"], at)
    rows = rows.drop_columns([name for name in ("offset", _RUN) if name in rows.column_names])
    return rows.add_column(2, "offset", ends)


def _run_keys(table: pa.Table, markers: pa.Table) -> pa.Array:
    """A number per row of ``table`` for its channel and run (topics
    numbered in the order ``markers`` names them)."""
    topic = pc.index_in(table["topic"], value_set=pc.unique(markers["topic"])).fill_null(-1)
    key = pc.add(pc.multiply(topic.cast(pa.int64()), 1 << 24), table["partition"].cast(pa.int64()))
    return pc.add(pc.multiply(key, 1 << 24), table[_RUN].cast(pa.int64()))


def _prepared(
    results: list[pa.Table], markers: list[Row], raw: list[Row], reasons: Callable[[pa.ChunkedArray], list[str]]
) -> pa.Table:
    """A prepared micro-batch from what Spark's job gave: its results (rows,
    partials), and the markers and raw records it observed."""
    ends = _markers(markers)
    placed = [_at_run_ends(t, ends) if _RUN in t.column_names else t for t in results]
    prepared = pa.concat_tables([*placed, ends.drop_columns([_RUN])], promote_options="permissive")
    return _assemble(prepared, _raw(raw), reasons)


def _numbered_arrow(records: DataFrame, fields: StructType, max_decoded_bytes: int) -> DataFrame:
    """Kafka records of other stages' output topics (topic, partition,
    offset, control, then the raw columns), numbered by run, each data
    record's Arrow batch read into its rows (``spark_abs.Runs.numberArrow``),
    in the layout ``_numbered`` gives."""
    session = records.sparkSession
    jvm = session.sparkContext._jvm
    assert jvm is not None
    return DataFrame(jvm.spark_abs.Runs.numberArrow(records._jdf, fields.json(), max_decoded_bytes), session)


def _stale_records(lineages: Mapping[ChannelId, Lineage]) -> Column | None:
    """Whether a record is stale (``Lineage.is_stale``), as a column over
    a Kafka micro-batch: written (``abs.gen`` header) by a generation older
    than a restore of its channel, at or after the position it restored;
    None when no channel was restored."""
    written = F.get(F.filter("headers", lambda h: h["key"] == GENERATION_HEADER), 0)["value"]
    generation = written.cast("string").try_cast("bigint")
    offset = F.col("offset")
    channels = []
    for channel, lineage in lineages.items():
        after = [
            (generation < restored) & (offset >= positions.get(channel, 0))
            for restored, positions in lineage.restores
            if restored > 0
        ]
        if after:
            here = (F.col("topic") == channel.topic) & (F.col("partition") == channel.partition)
            channels.append(here & functools.reduce(or_, after))
    return F.coalesce(functools.reduce(or_, channels), F.lit(False)) if channels else None


def _numbered(flagged: DataFrame) -> DataFrame:
    """``flagged`` (topic, partition, offset, control, event time, ...) with
    each record's run and a marker row after each run (``spark_abs.Runs``,
    streaming/adapters/spark/java/Runs.java), in the pass that reads it."""
    session = flagged.sparkSession
    jvm = session.sparkContext._jvm
    assert jvm is not None
    return DataFrame(jvm.spark_abs.Runs.number(flagged._jdf), session)


def _observed(observation: Observation, stage: str) -> dict[str, Any]:
    """What ``observation`` saw in the job that just ran, waiting at most
    ``OBSERVED_BOUND_S`` for Spark to hand it over."""
    future = observation._jo.future() if observation._jo is not None else None
    if future is not None:
        poll_until(
            future.isCompleted,
            OBSERVED_BOUND_S,
            f"stage {stage}: Spark reporting the micro-batch's markers and control records",
            bound="OBSERVED_BOUND_S",
            every_s=0.005,
            error=lambda message: ChannelQueryError(
                f"stage {stage}: Spark did not report the micro-batch's markers and control records "
                f"within {OBSERVED_BOUND_S:.0f} s of its end (observation {observation._name})"
            ),
        )
    return observation.get


_MARKER_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        (_RUN, pa.int32()),
        (RECORDS, pa.int64()),
        (EVENT_TIME, pa.int64()),
    ]
)
_RAW_SCHEMA = pa.schema(
    [*(RECORD_SCHEMA.field(n) for n in BATCH_COLUMNS[:-1]), ("timestamp", pa.int64()), (_CONTROL, pa.bool_())]
)


def _markers(found: list[Row]) -> pa.Table:
    """The markers an observation collected, as ``MARKER`` parts; a channel
    split across partitions (its runs numbered twice) is an error."""
    markers = pa.Table.from_pylist([row.asDict() for row in found], schema=_MARKER_SCHEMA)
    runs = {(m["topic"], m["partition"], m[_RUN]) for m in markers.select(["topic", "partition", _RUN]).to_pylist()}
    if len(runs) != markers.num_rows:
        raise ChannelQueryError(
            "a micro-batch read a channel in more than one partition: its runs of records cannot be numbered"
        )
    return markers.append_column(PART, pa.array([int(Part.MARKER)] * markers.num_rows, pa.int8()))


def _raw(found: list[Row]) -> pa.Table:
    """The control and undecodable records an observation collected, in
    channel and offset order, with Kafka's timestamp."""
    rows = []
    for row in found:
        record = row.asDict()
        record["headers"] = [h.asDict() for h in record["headers"] or ()]
        rows.append(record)
    raw = pa.Table.from_pylist(rows, schema=_RAW_SCHEMA).sort_by(
        [("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")]
    )
    return raw.set_column(6, "timestamp", raw["timestamp"].cast(pa.timestamp("ms")))


def _unreadable_headers() -> Column:
    """Whether a record has an ``abs.wm`` or ``abs.gen`` header that is no
    whole number: decimal digits of a signed 64-bit integer, as
    ``whole_numbers`` reads them in Python."""

    def unreadable(header: Column) -> Column:
        text = header["value"].cast("string")
        whole = text.rlike(r"^[+-]?[0-9]{1,19}$") & text.try_cast("bigint").isNotNull()
        return header["key"].isin(WATERMARK_HEADER, GENERATION_HEADER) & ~F.coalesce(whole, F.lit(False))

    return F.coalesce(F.exists("headers", unreadable), F.lit(False))


def _assemble(prepared: pa.Table, raw: pa.Table, reasons: Callable[[pa.ChunkedArray], list[str]]) -> pa.Table:
    """The Spark side's two results as one table: the code's rows with the
    markers, and the raw records (control records, and undecodable ones
    with the reason: an unreadable header's, or the one the Python decoder
    gives, or Spark's)."""
    control = raw[_CONTROL].to_pylist()
    records = raw.drop_columns([_CONTROL]).cast(RECORD_SCHEMA, safe=False)
    data = records.filter(pc.invert(raw[_CONTROL]))
    unreadable, _ = unreadable_headers(data, (WATERMARK_HEADER, GENERATION_HEADER))
    told = iter(unreadable.get(i, why) for i, why in enumerate(reasons(data["value"])))
    parts = pa.array([Part.CONTROL if c else Part.REJECTED for c in control], pa.int8())
    why = pa.array([None if c else next(told) for c in control], pa.string())
    return pa.concat_tables(
        [prepared, records.append_column(PART, parts).append_column(REASON, why)], promote_options="permissive"
    )


def _columns(schema: StructType) -> str:
    return ", ".join(f"{f.name} {f.dataType.simpleString()}" for f in schema.fields)


def _losing_steps(out: DataFrame) -> list[str]:
    """The steps of ``out``'s analysed plan after which a row no longer
    stands for one input record."""
    plan = out._jdf.queryExecution().analyzed().treeString()
    found: list[str] = []
    for line in plan.splitlines():
        match = _NODE.match(line)
        if match and match.group(1) in _LOSES_POSITIONS:
            why = f"{match.group(1)}: {_LOSES_POSITIONS[match.group(1)]}"
            if why not in found:
                found.append(why)
    return found


def spark_stages(
    spark: SparkSession, pipeline: Pipeline, names: list[str], max_decoded_bytes: int
) -> dict[str, SparkStage]:
    """The ``SparkStage`` of every stage of ``pipeline`` among ``names``
    that has Spark code.  Spark code after other stages reads their rows
    with the schema each declares, or the one its own Spark code gives."""
    made: dict[str, SparkStage] = {}

    def rows_of(name: str) -> pa.Schema:
        upstream = pipeline.stage(name)
        if upstream.schema is not None:
            return upstream.schema
        if name not in made:  # a stage of Spark code without an operator (Pipeline's check)
            made[name] = SparkStage(spark, upstream, source_of(upstream))
        return made[name].output_schema

    def source_of(stage: Stage) -> Ingress | StageRows:
        ingress = pipeline.ingress_named(stage.inputs[0])
        if ingress is not None:
            return ingress
        schemas = {name: rows_of(name) for name in stage.inputs}
        first = next(iter(schemas.values()))
        if any(not schema.equals(first) for schema in schemas.values()):
            said = "; ".join(f"{n}: {s.to_string(show_schema_metadata=False)}" for n, s in schemas.items())
            raise ConfigError(f"stage {stage.name}: Spark code over several stages needs one schema ({said})")
        return StageRows(stage.inputs, first, max_decoded_bytes)

    for name in names:
        stage = pipeline.stage(name)
        if stage.spark is not None and name not in made:
            made[name] = SparkStage(spark, stage, source_of(stage))
    return {name: made[name] for name in names if name in made}
