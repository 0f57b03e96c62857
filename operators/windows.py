"""Tumbling event-time windows: per key, aggregates over fixed, adjacent
windows ``[floor(t / size) * size, + size)``, each emitted exactly once, when
the watermark passes its end.

Event time comes from an integer column (milliseconds) or a timestamp column
(any unit, any time zone); sizes and lateness are whole milliseconds (an
``int``) or a ``timedelta``.  Time never comes from the clock: the output
depends only on the sequence of batches (and ``on_watermark`` calls).

The watermark is the engine's: the stage task calls ``on_watermark`` each
time the minimum over its event-time inputs moves on (docs/architecture.md,
"Event time"; out-of-orderness is declared on the ``Ingress``).  Rows never
move it.  Used on its own, call ``on_watermark`` where event time moved.

``process(batch)``:

1. rows with a null key or a null event time go to the dead letters
   (``null_key``, ``null_event_time``);
2. rows whose window has already closed (window end + allowed lateness <=
   watermark) are late: they go to the dead letters with reason ``late``,
   never into a result;
3. the other rows are aggregated into their open windows.

``on_watermark(w)``: the watermark becomes ``max(watermark, w)``, and every
window whose end + allowed lateness is <= it closes: its final row is
returned and it leaves the state.

Output: ``key, window_start, window_end, <aggregations>`` ordered by window
start, then key.  ``window_start``/``window_end`` are int64 milliseconds for
an integer time column, ``timestamp[ms]`` (with the column's zone) for a
timestamp column."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import _time as et
from operators import aggregations as agg
from operators._arrow import expect_columns, expect_tables, require_columns
from operators.aggregations import Aggregation
from operators.dead_letters import DeadLetters, Reason
from operators.errors import OperatorConfigError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.rescale import MIN, RESCALE_METADATA
from operators.state import KeyedState

__all__ = ["TumblingWindowAggregate", "WINDOW_START", "WINDOW_END"]

WINDOW_START = "window_start"
WINDOW_END = "window_end"


class TumblingWindowAggregate:
    """Aggregates per ``key`` over tumbling windows of ``size`` on
    ``time_column``, each window's final result emitted once (see the
    module docstring for the rules).

    ``allowed_lateness`` keeps each window open that much longer after the
    watermark passed its end (Flink's ``allowedLateness``), so rows that far
    behind the watermark still count; its one result is emitted then.

    >>> import pyarrow as pa
    >>> from operators import TumblingWindowAggregate, count
    >>> op = TumblingWindowAggregate("k", "t", 10, {"n": count()})
    >>> op.process(pa.table({"k": ["a", "a", "b"], "t": [1, 12, 5]})).num_rows
    0
    >>> op.on_watermark(10).to_pylist()
    [{'k': 'a', 'window_start': 0, 'window_end': 10, 'n': 1}, {'k': 'b', 'window_start': 0, 'window_end': 10, 'n': 1}]

    State: ``{"windows": open windows (key, window_start, aggregations),
    "watermark": one row, int64 ms or null before the first row}``."""

    WINDOWS = "windows"
    WATERMARK = "watermark"

    def __init__(
        self,
        key: str,
        time_column: str,
        size: int | dt.timedelta,
        aggregations: Mapping[str, Aggregation],
        *,
        allowed_lateness: int | dt.timedelta = 0,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.key = key_name(key, name)
        if not (isinstance(time_column, str) and time_column):
            raise OperatorConfigError(f"{name}: time_column must be a non-empty column name, got {time_column!r}")
        self.time_column = time_column
        self.size = et.millis(size, "size", name, positive=True)
        self.allowed_lateness = et.millis(allowed_lateness, "allowed_lateness", name, positive=False)
        self.aggregations = agg.validate([self.key, WINDOW_START, WINDOW_END], aggregations, name)
        reserved = {WINDOW_START, WINDOW_END} & {self.key, *agg.input_columns(self.aggregations)}
        if reserved:
            raise OperatorConfigError(f"{name}: column names {sorted(reserved)} are reserved for the window bounds")
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._windows = KeyedState([self.key, WINDOW_START], list(self.aggregations), operator=name)
        self._watermark: int | None = None

    @property
    def watermark(self) -> int | None:
        """Milliseconds; None until the first ``on_watermark``."""
        return self._watermark

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column that divides the state (``streaming.api.layout``)."""
        return {None: self.key}

    @property
    def open_windows(self) -> pa.Table:
        return self._windows.table

    def process(self, batch: pa.Table) -> pa.Table:
        name = type(self).__name__
        inputs = agg.input_columns(self.aggregations)
        require_columns(batch, [self.key, self.time_column, *inputs], name)
        window_type = et.bounds_type(batch.schema.field(self.time_column).type, self.time_column, name)
        batch = split_null_keys(batch, self.key, self.dead_letters, name)
        batch = et.null_times_out(batch, self.time_column, self.dead_letters, name)
        millis = et.to_millis(batch[self.time_column])
        starts = pc.multiply(et.floor_div(millis, self.size), self.size)
        if self._watermark is not None:
            late = pc.less_equal(pc.add(starts, self.size + self.allowed_lateness), self._watermark)
            self.dead_letters.add(batch.filter(late), Reason.LATE, name)
            on_time = pc.invert(late)
            batch, millis, starts = batch.filter(on_time), millis.filter(on_time), starts.filter(on_time)
        rows = pa.table(
            {
                self.key: batch[self.key],
                WINDOW_START: starts.cast(window_type),
                **{column: batch[column] for column in inputs if column != self.key},
            }
        )
        partial = agg.partial(rows, [self.key, WINDOW_START], self.aggregations)
        self._windows.merge(partial, lambda r: agg.combine(r, [self.key, WINDOW_START], self.aggregations))
        return self._close()

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later, and return the windows that closes."""
        self._advance(et.watermark_millis(watermark, type(self).__name__))
        return self._close()

    def snapshot(self) -> dict[str, pa.Table]:
        return {
            self.WINDOWS: self._windows.snapshot(),
            # after a rescale every task starts from the lowest: no window closes early
            self.WATERMARK: pa.table({self.WATERMARK: pa.array([self._watermark], pa.int64())}).replace_schema_metadata(
                {RESCALE_METADATA: MIN}
            ),
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.WINDOWS, self.WATERMARK], name)
        marks = tables[self.WATERMARK]
        expect_columns(marks, self.WATERMARK, [self.WATERMARK], name)
        if marks.num_rows != 1 or not pa.types.is_integer(marks.schema.field(0).type):
            raise StateRestoreError(
                f"{name}: snapshot table 'watermark' must be one integer row, got {marks.num_rows} of {marks.schema.field(0).type}"
            )
        watermark = marks.column(0)[0].as_py()
        windows = tables[self.WINDOWS]
        expect_columns(windows, self.WINDOWS, [self.key, WINDOW_START, *self.aggregations], name)
        if windows.num_rows:
            start_type = windows.schema.field(WINDOW_START).type
            if not (start_type == pa.int64() or (pa.types.is_timestamp(start_type) and start_type.unit == "ms")):
                raise StateRestoreError(
                    f"{name}: snapshot window_start is {start_type}, expected int64 or timestamp[ms]"
                )
            for column, aggregation in self.aggregations.items():
                if not agg.state_type_ok(aggregation, windows.schema.field(column).type):
                    raise StateRestoreError(
                        f"{name}: snapshot column {column!r} is {windows.schema.field(column).type}, which cannot hold {aggregation}"
                    )
            starts = windows[WINDOW_START].cast(pa.int64())
            if watermark is not None and pc.min(starts).as_py() + self.size + self.allowed_lateness <= watermark:
                raise StateRestoreError(
                    f"{name}: snapshot holds windows that should have closed at watermark {watermark}"
                )
            if pc.any(pc.not_equal(pc.multiply(et.floor_div(starts, self.size), self.size), starts)).as_py():
                raise StateRestoreError(f"{name}: snapshot window starts are not multiples of size {self.size} ms")
        self._windows.restore(windows, self.WINDOWS)
        self._watermark = watermark

    def _advance(self, watermark: int) -> None:
        if self._watermark is None or watermark > self._watermark:
            self._watermark = watermark

    def _close(self) -> pa.Table:
        windows = self._windows.table
        if self._watermark is None or windows.num_rows == 0:
            closed = windows.slice(0, 0)
        else:
            ends = pc.add(windows[WINDOW_START].cast(pa.int64()), self.size + self.allowed_lateness)
            closed = self._windows.pop(pc.less_equal(ends, self._watermark))
        closed = closed.sort_by([(WINDOW_START, "ascending"), (self.key, "ascending")])
        start_type = closed.schema.field(WINDOW_START).type
        ends = pc.add(closed[WINDOW_START].cast(pa.int64()), self.size).cast(start_type)
        return closed.add_column(2, WINDOW_END, ends)

    def __repr__(self) -> str:
        specs = ", ".join(f"{n}={a}" for n, a in self.aggregations.items())
        return (
            f"TumblingWindowAggregate(key={self.key!r}, time={self.time_column!r}, size={self.size}ms, "
            f"lateness={self.allowed_lateness}ms, {specs})"
        )
