"""Event-time session windows: per key, rows less than ``gap`` apart (or
exactly ``gap``) form one session, which ends ``gap`` after its last row
(Spark's ``session_window(ts, gap)``, Flink's ``EventTimeSessionWindows``).
Each session is emitted exactly once, when the watermark passes its end.

Event time comes from an integer column (milliseconds) or a timestamp column
(any unit, any time zone, taken to the millisecond rounding down); the gap
and lateness are whole milliseconds (an ``int``) or a ``timedelta``.  Time
never comes from the clock.

Each row at time ``t`` is the interval ``[t, t + gap)``; a session is the
interval ``[first t, last t + gap)`` of its rows.  A row and a session of its
key merge when they overlap *or touch*: ``t <= end`` and ``t + gap >=
start`` (Flink's ``TimeWindow.intersects``), so a row exactly ``gap`` after
a session's last row joins it; a row may merge several sessions into one.
The sessions of a key are therefore the connected pieces of the union of its
rows' closed intervals ``[t, t + gap]``, which depends only on the set of
rows, not on their order or on how they are cut into batches.

The watermark is the engine's, as for ``TumblingWindowAggregate``: only
``on_watermark`` moves it, rows never do.

``process(batch)``:

1. rows with a null key or a null event time go to the dead letters
   (``null_key``, ``null_event_time``);
2. a row is late when its own interval has closed, ``t + gap +
   allowed_lateness <= watermark``: it goes to the dead letters with reason
   ``late``, never into a result, even if it falls inside a session that is
   still open (Flink merges first and asks whether the merged session is
   late; judging the row alone keeps the output independent of how the rows
   between two watermarks are cut into batches);
3. the other rows are merged into the open sessions of their key.  A row not
   late can touch a session that already closed (when ``t < end <= t +
   gap``): that session is gone, so the row starts a new one, which may
   overlap the one emitted (as in Flink).

``on_watermark(w)``: the watermark becomes ``max(watermark, w)``, and every
session whose end + allowed lateness is <= it closes: its final row is
returned and it leaves the state.

Output: ``key, session_start, session_end, <aggregations>`` ordered by
session start, then key.  ``session_start``/``session_end`` are int64
milliseconds for an integer time column, ``timestamp[ms]`` (with the
column's zone) for a timestamp column.  The aggregations are those of
``operators.aggregations`` (count, sum, min, max): merged sessions combine
their partial results (``agg.combine``)."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import _time as et
from operators import aggregations as agg
from operators._arrow import conform, expect_columns, expect_tables, require_columns
from operators.aggregations import Aggregation
from operators.base import LaterTables
from operators.dead_letters import DeadLetters, Reason
from operators.errors import OperatorConfigError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.state import KeyedState, StateChanges, whole

__all__ = ["SessionWindowAggregate", "SESSION_START", "SESSION_END"]

SESSION_START = "session_start"
SESSION_END = "session_end"


class SessionWindowAggregate:
    """Aggregates per ``key`` over session windows of ``time_column``: rows
    at most ``gap`` apart belong to one session, ``[first t, last t + gap)``;
    each session's final result is emitted once (see the module docstring
    for the rules).

    ``allowed_lateness`` keeps each session open that much longer after the
    watermark passed its end (Flink's ``allowedLateness``), so rows that far
    behind the watermark still count; its one result is emitted then.

    >>> import pyarrow as pa
    >>> from operators import count, sum_
    >>> from operators.session_windows import SessionWindowAggregate
    >>> op = SessionWindowAggregate("k", "t", 5, {"n": count(), "s": sum_("v")})
    >>> op.process(pa.table({"k": ["a", "a", "b", "a"], "t": [1, 4, 2, 20], "v": [1, 2, 3, 4]})).num_rows
    0
    >>> for row in op.on_watermark(10).to_pylist():
    ...     print(row)
    {'k': 'a', 'session_start': 1, 'session_end': 9, 'n': 2, 's': 3}
    {'k': 'b', 'session_start': 2, 'session_end': 7, 'n': 1, 's': 3}
    >>> op.process(pa.table({"k": ["a"], "t": [25], "v": [5]})).num_rows  # touches [20, 25): merges
    0
    >>> op.open_sessions.to_pylist()
    [{'k': 'a', 'session_start': 20, 'session_end': 30, 'n': 2, 's': 9}]

    State: ``{"sessions": open sessions (key, session_start, session_end,
    aggregations), keyed by key and session_start, "watermark": one row,
    int64 ms or null before the first ``on_watermark``}``."""

    SESSIONS = "sessions"
    WATERMARK = "watermark"

    def __init__(
        self,
        key: str,
        time_column: str,
        gap: int | dt.timedelta,
        aggregations: Mapping[str, Aggregation],
        *,
        allowed_lateness: int | dt.timedelta = 0,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.key = key_name(key, name)
        self.time_column = et.time_column(time_column, name)
        self.gap = et.millis(gap, "gap", name, positive=True)
        self.allowed_lateness = et.millis(allowed_lateness, "allowed_lateness", name, positive=False)
        self.aggregations = agg.validate([self.key, SESSION_START, SESSION_END], aggregations, name)
        reserved = {SESSION_START, SESSION_END} & {self.key, *agg.input_columns(self.aggregations)}
        if reserved:
            raise OperatorConfigError(f"{name}: column names {sorted(reserved)} are reserved for the session bounds")
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._sessions = KeyedState([self.key, SESSION_START], [SESSION_END, *self.aggregations], operator=name)
        self._watermark: int | None = None
        # how merged sessions combine: the bounds widen, the aggregations combine
        self._merging = {
            SESSION_START: agg.min_(SESSION_START),
            SESSION_END: agg.max_(SESSION_END),
            **self.aggregations,
        }
        self._label = "__session"
        while self._label in (self.key, *self._merging):
            self._label += "_"

    @property
    def watermark(self) -> int | None:
        """Milliseconds; None until the first ``on_watermark``."""
        return self._watermark

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column that divides the state (``streaming.api.partitioning``)."""
        return {None: self.key}

    @property
    def open_sessions(self) -> pa.Table:
        return self._sessions.table

    def process(self, batch: pa.Table) -> pa.Table:
        name = type(self).__name__
        inputs = agg.input_columns(self.aggregations)
        require_columns(batch, [self.key, self.time_column, *inputs], name)
        bounds_type = et.bounds_type(batch.schema.field(self.time_column).type, self.time_column, name)
        batch = split_null_keys(batch, self.key, self.dead_letters, name)
        batch = et.null_times_out(batch, self.time_column, self.dead_letters, name)
        millis = et.to_millis(batch[self.time_column])
        if self._watermark is not None:
            late = pc.less_equal(pc.add(millis, self.gap + self.allowed_lateness), self._watermark)
            self.dead_letters.add(batch.filter(late), Reason.LATE, name)
            on_time = pc.invert(late)
            batch, millis = batch.filter(on_time), millis.filter(on_time)
        rows = pa.table(
            {
                self.key: batch[self.key],
                SESSION_START: millis,
                **{column: batch[column] for column in inputs if column != self.key},
            }
        )
        # one interval [t, t + gap) per key and time, with its partial aggregates
        partial = agg.partial(rows, [self.key, SESSION_START], self.aggregations)
        ends = pc.add(partial[SESSION_START], self.gap)
        partial = partial.set_column(1, SESSION_START, partial[SESSION_START].cast(bounds_type))
        partial = partial.add_column(2, SESSION_END, ends.cast(bounds_type))
        state = self._sessions.table
        if state.num_rows == 0:
            self._sessions.upsert(self._merge(partial))
            return self._close()
        partial = conform(partial, state.schema, name, "batch")
        touched = pc.is_in(state[self.key], value_set=partial[self.key].combine_chunks())
        merged = self._merge(pa.concat_tables([partial, state.filter(touched)]))
        self._sessions.pop(touched)
        self._sessions.upsert(merged)
        return self._close()

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later, and return the sessions that close."""
        watermark = et.watermark_millis(watermark, type(self).__name__)
        if self._watermark is None or watermark > self._watermark:
            self._watermark = watermark
        return self._close()

    def snapshot(self) -> dict[str, pa.Table]:
        return {
            self.SESSIONS: self._sessions.snapshot(),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def snapshot_later(self) -> LaterTables:
        return {
            self.SESSIONS: self._sessions.snapshot_later(),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def changes(self) -> dict[str, StateChanges]:
        return {
            self.SESSIONS: self._sessions.changes(),
            self.WATERMARK: whole(et.watermark_table(self._watermark, self.WATERMARK)),
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.SESSIONS, self.WATERMARK], name)
        watermark = et.restored_watermark(tables[self.WATERMARK], self.WATERMARK, name)
        sessions = tables[self.SESSIONS]
        expect_columns(sessions, self.SESSIONS, [self.key, SESSION_START, SESSION_END, *self.aggregations], name)
        if sessions.num_rows:
            start_type = sessions.schema.field(SESSION_START).type
            et.check_bounds_type(start_type, SESSION_START, name)
            if sessions.schema.field(SESSION_END).type != start_type:
                raise StateRestoreError(
                    f"{name}: snapshot {SESSION_END} is {sessions.schema.field(SESSION_END).type}, "
                    f"{SESSION_START} is {start_type}: they must have one type"
                )
            et.check_aggregate_types(sessions, self.aggregations, name)
            if sessions[SESSION_END].null_count:
                raise StateRestoreError(f"{name}: snapshot table {self.SESSIONS!r} has null {SESSION_END} values")
            starts = sessions[SESSION_START].cast(pa.int64())
            ends = sessions[SESSION_END].cast(pa.int64())
            if pc.any(pc.less(pc.subtract(ends, starts), self.gap)).as_py():
                raise StateRestoreError(f"{name}: snapshot holds sessions shorter than the gap, {self.gap} ms")
            if watermark is not None and pc.min(ends).as_py() + self.allowed_lateness <= watermark:
                raise StateRestoreError(
                    f"{name}: snapshot holds sessions that should have closed at watermark {watermark}"
                )
            if self._overlapping(sessions):
                raise StateRestoreError(
                    f"{name}: snapshot holds sessions of one key that overlap or touch (they would be one session)"
                )
        self._sessions.restore(sessions, self.SESSIONS)
        self._watermark = watermark

    def _overlapping(self, sessions: pa.Table) -> bool:
        """Whether two sessions of one key overlap or touch."""
        ordered = sessions.sort_by([(self.key, "ascending"), (SESSION_START, "ascending")])
        n = ordered.num_rows
        keys = ordered[self.key]
        starts = ordered[SESSION_START].cast(pa.int64())
        ends = ordered[SESSION_END].cast(pa.int64())
        same_key = pc.equal(keys.slice(1), keys.slice(0, n - 1))
        return bool(pc.any(pc.and_(same_key, pc.less_equal(starts.slice(1), ends.slice(0, n - 1)))).as_py())

    def _merge(self, intervals: pa.Table) -> pa.Table:
        """``intervals`` (key, session_start, session_end, aggregations; rows
        and sessions, in any order) merged into sessions: per key, the
        connected pieces of the union of the closed intervals [start, end],
        their aggregations combined.

        Sorted by key and start, an interval opens a new session when it
        starts after the end of every earlier interval of its key.  That is a
        running maximum of the ends per key, computed as one running maximum
        over (key rank, end rank) pairs encoded as one integer; ranks (dense,
        so equal times stay equal: touching intervals merge) keep the
        encoding small whatever the times."""
        n = intervals.num_rows
        if n == 0:
            return intervals
        ordered = intervals.sort_by([(self.key, "ascending"), (SESSION_START, "ascending")])
        starts = ordered[SESSION_START].cast(pa.int64()).combine_chunks()
        ends = ordered[SESSION_END].cast(pa.int64()).combine_chunks()
        key_rank = pc.rank(ordered[self.key], tiebreaker="dense").cast(pa.int64())
        time_rank = pc.rank(pa.concat_arrays([starts, ends]), tiebreaker="dense").cast(pa.int64())
        offset = pc.multiply_checked(key_rank, 2 * n + 1)  # time ranks are 1 .. 2n
        opening = pc.add_checked(offset, time_rank.slice(0, n))
        reach = pc.cumulative_max(pc.add_checked(offset, time_rank.slice(n)))
        before = pa.concat_arrays([pa.array([-1], pa.int64()), reach.slice(0, n - 1)])
        session = pc.cumulative_sum(pc.greater(opening, before).cast(pa.int64()))
        labelled = ordered.add_column(0, self._label, session)
        merged = agg.combine(labelled, [self._label, self.key], self._merging)
        return merged.drop_columns([self._label])

    def _close(self) -> pa.Table:
        sessions = self._sessions.table
        if self._watermark is None or sessions.num_rows == 0:
            closed = sessions.slice(0, 0)
        else:
            ends = pc.add(sessions[SESSION_END].cast(pa.int64()), self.allowed_lateness)
            closed = self._sessions.pop(pc.less_equal(ends, self._watermark))
        return closed.sort_by([(SESSION_START, "ascending"), (self.key, "ascending")])

    def __repr__(self) -> str:
        specs = ", ".join(f"{n}={a}" for n, a in self.aggregations.items())
        return (
            f"SessionWindowAggregate(key={self.key!r}, time={self.time_column!r}, gap={self.gap}ms, "
            f"lateness={self.allowed_lateness}ms, {specs})"
        )
