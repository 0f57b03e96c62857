"""Event-time windows per key: sliding (hopping) windows of ``size`` that
start every ``slide``, ``[s, s + size)`` for every multiple ``s`` of
``slide``, so that each row counts in ``size / slide`` windows (Spark's
``window(ts, size, slide)``, Flink's ``SlidingEventTimeWindows``), and
tumbling windows, the sliding ones with ``slide == size`` (Spark's
``window(ts, size)``).  Each window is emitted exactly once, when the
watermark passes its end.

Event time comes from an integer column (milliseconds) or a timestamp column
(any unit, any time zone, taken to the millisecond rounding down); sizes and
lateness are whole milliseconds (an ``int``) or a ``timedelta``.  Time never
comes from the clock: the output depends only on the sequence of batches
(and ``on_watermark`` calls), not on how rows are cut into batches.

The watermark is the engine's: the stage task calls ``on_watermark`` each
time the minimum over its event-time inputs moves on (docs/architecture/protocol.md,
"Event time"; out-of-orderness is declared on the ``Ingress``).  Rows never
move it.  Used on its own, call ``on_watermark`` where event time moved.

``process(batch)``:

1. rows with a null key or a null event time go to the dead letters
   (``null_key``, ``null_event_time``);
2. a row counts in each of its windows that is still open (window end +
   allowed lateness > watermark); a row none of whose windows is open (its
   latest window has closed) is late: it goes to the dead letters with
   reason ``late``, never into a result;
3. nothing closes: the watermark did not move.

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
from operators._arrow import expect_columns, expect_tables, require_columns, row_index
from operators.aggregations import Aggregation
from operators.base import LaterTables
from operators.dead_letters import DeadLetters, Reason
from operators.errors import OperatorConfigError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.state import KeyedState, StateChanges, whole

__all__ = ["TumblingWindowAggregate", "SlidingWindowAggregate", "WINDOW_START", "WINDOW_END"]

WINDOW_START = "window_start"
WINDOW_END = "window_end"


class SlidingWindowAggregate:
    """Aggregates per ``key`` over sliding windows of ``size`` starting every
    ``slide`` on ``time_column`` (``size`` a multiple of ``slide``), each
    window's final result emitted once (see the module docstring for the
    rules).

    ``allowed_lateness`` keeps each window open that much longer after the
    watermark passed its end (Flink's ``allowedLateness``), so rows that far
    behind the watermark still count in it; its one result is emitted then.
    Each row is aggregated into ``size / slide`` windows: a large ratio
    costs that many times the work (and state) of a tumbling window.

    >>> import pyarrow as pa
    >>> from operators import count
    >>> from operators import SlidingWindowAggregate
    >>> op = SlidingWindowAggregate("k", "t", 10, 5, {"n": count()})
    >>> op.process(pa.table({"k": ["a", "a"], "t": [3, 7]})).num_rows
    0
    >>> for row in op.on_watermark(10).to_pylist():
    ...     print(row)
    {'k': 'a', 'window_start': -5, 'window_end': 5, 'n': 1}
    {'k': 'a', 'window_start': 0, 'window_end': 10, 'n': 2}
    >>> op.open_windows.to_pylist()
    [{'k': 'a', 'window_start': 5, 'n': 1}]

    State: ``{"windows": open windows (key, window_start, aggregations),
    "watermark": one row, int64 ms or null before the first
    ``on_watermark``}``."""

    WINDOWS = "windows"
    WATERMARK = "watermark"
    _step = "slide"  # what window starts are multiples of, in messages

    def __init__(
        self,
        key: str,
        time_column: str,
        size: int | dt.timedelta,
        slide: int | dt.timedelta,
        aggregations: Mapping[str, Aggregation],
        *,
        allowed_lateness: int | dt.timedelta = 0,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.key = key_name(key, name)
        self.time_column = et.time_column(time_column, name)
        self.size = et.millis(size, "size", name, positive=True)
        self.slide = et.millis(slide, "slide", name, positive=True)
        if self.size % self.slide:
            raise OperatorConfigError(
                f"{name}: size must be a multiple of slide, got size {self.size} ms and slide {self.slide} ms"
            )
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
        """The column that divides the state (``streaming.api.partitioning``)."""
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
        # the latest window of each row; the others start 1, 2, ... slides before it
        latest = pc.multiply(et.floor_div(et.to_millis(batch[self.time_column]), self.slide), self.slide)
        if self._watermark is not None:
            late = pc.less_equal(pc.add(latest, self.size + self.allowed_lateness), self._watermark)
            self.dead_letters.add(batch.filter(late), Reason.LATE, name)
            on_time = pc.invert(late)
            batch, latest = batch.filter(on_time), latest.filter(on_time)
        # one (row, window) pair per row and window: pair p is row p // per_row's window p % per_row
        per_row = self.size // self.slide
        pairs = row_index(batch.num_rows * per_row)
        rows_of = pc.divide(pairs, per_row)
        starts = pc.subtract(
            latest.take(rows_of), pc.multiply(pc.subtract(pairs, pc.multiply(rows_of, per_row)), self.slide)
        )
        if self._watermark is not None:
            still_open = pc.greater(pc.add(starts, self.size + self.allowed_lateness), self._watermark)
            rows_of, starts = rows_of.filter(still_open), starts.filter(still_open)
        rows = pa.table(
            {
                self.key: batch[self.key].take(rows_of),
                WINDOW_START: starts.cast(window_type),
                **{column: batch[column].take(rows_of) for column in inputs if column != self.key},
            }
        )
        partial = agg.partial(rows, [self.key, WINDOW_START], self.aggregations)
        self._windows.merge(partial, lambda r: agg.combine(r, [self.key, WINDOW_START], self.aggregations))
        return self._close()

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later, and return the windows that close."""
        watermark = et.watermark_millis(watermark, type(self).__name__)
        if self._watermark is None or watermark > self._watermark:
            self._watermark = watermark
        return self._close()

    def snapshot(self) -> dict[str, pa.Table]:
        return {
            self.WINDOWS: self._windows.snapshot(),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def snapshot_later(self) -> LaterTables:
        return {
            self.WINDOWS: self._windows.snapshot_later(),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def changes(self) -> dict[str, StateChanges]:
        return {
            self.WINDOWS: self._windows.changes(),
            self.WATERMARK: whole(et.watermark_table(self._watermark, self.WATERMARK)),
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.WINDOWS, self.WATERMARK], name)
        watermark = et.restored_watermark(tables[self.WATERMARK], self.WATERMARK, name)
        windows = tables[self.WINDOWS]
        expect_columns(windows, self.WINDOWS, [self.key, WINDOW_START, *self.aggregations], name)
        if windows.num_rows:
            et.check_bounds_type(windows.schema.field(WINDOW_START).type, WINDOW_START, name)
            et.check_aggregate_types(windows, self.aggregations, name)
            starts = windows[WINDOW_START].cast(pa.int64())
            if watermark is not None and pc.min(starts).as_py() + self.size + self.allowed_lateness <= watermark:
                raise StateRestoreError(
                    f"{name}: snapshot holds windows that should have closed at watermark {watermark}"
                )
            if pc.any(pc.not_equal(pc.multiply(et.floor_div(starts, self.slide), self.slide), starts)).as_py():
                raise StateRestoreError(
                    f"{name}: snapshot window starts are not multiples of {self._step} {self.slide} ms"
                )
        self._windows.restore(windows, self.WINDOWS)
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
            f"SlidingWindowAggregate(key={self.key!r}, time={self.time_column!r}, size={self.size}ms, "
            f"slide={self.slide}ms, lateness={self.allowed_lateness}ms, {specs})"
        )


class TumblingWindowAggregate(SlidingWindowAggregate):
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
    "watermark": one row, int64 ms or null before the first ``on_watermark``}``."""

    _step = "size"

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
        super().__init__(
            key,
            time_column,
            size,
            size,
            aggregations,
            allowed_lateness=allowed_lateness,
            dead_letters=dead_letters,
        )

    def __repr__(self) -> str:
        specs = ", ".join(f"{n}={a}" for n, a in self.aggregations.items())
        return (
            f"TumblingWindowAggregate(key={self.key!r}, time={self.time_column!r}, size={self.size}ms, "
            f"lateness={self.allowed_lateness}ms, {specs})"
        )
