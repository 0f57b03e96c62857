"""Dropping duplicate rows within an event-time bound: ``Deduplicate``
(Spark's ``dropDuplicatesWithinWatermark``).

The first row of each key is emitted and its key remembered; later rows of
a remembered key are dropped.  A key is forgotten once the watermark is
``within`` past the event time of its first row, so the state stays bounded;
a row that old would no longer be recognised as a duplicate, so it is late.

Event time and durations are read as in ``operators.windows`` (integer
milliseconds or a timestamp column; an ``int`` of milliseconds or a
``timedelta``).  The watermark is the engine's: only ``on_watermark`` moves
it (docs/architecture/protocol.md, "Event time")."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from operators import _time as et
from operators._arrow import conform, expect_columns, expect_tables, plain, require_columns, row_index
from operators.base import LaterTables
from operators.dead_letters import DeadLetters, Reason
from operators.errors import OperatorConfigError, StateRestoreError
from operators.keyed import key_name
from operators.state import KeyedState, StateChanges, whole

__all__ = ["Deduplicate"]


class Deduplicate:
    """Emits the first row of each key (the values of ``columns``; one
    column name may be given as a string) and drops later rows of the same
    key while the key is remembered: until the watermark reaches the first
    row's event time plus ``within``.

    ``process(batch)``, rows in batch order:

    1. a row with a null in any key column goes to the dead letters
       (``null_key``), one with a null event time too (``null_event_time``);
    2. a row whose ``time + within <= watermark`` is late (dead letter
       ``late``): its key may have been forgotten, so it cannot be told apart
       from a duplicate;
    3. a row whose key is remembered is dropped and counted in
       ``duplicates``; any other row is emitted (unchanged, in batch order)
       and its key remembered with its event time.  Within one batch the
       first row of a key wins.

    ``on_watermark(w)``: the watermark becomes ``max(watermark, w)`` and every
    key whose ``first time + within <= watermark`` is forgotten.  It releases
    no rows: it returns an empty table without columns.

    A row up to ``within`` behind the watermark is still emitted, so
    ``watermark_hold()`` is ``watermark - within + 1``: the watermark a stage
    passes on after the operator stays at or behind every row it may still
    emit, and an event-time operator after it never finds them late.

    ``duplicates`` counts the rows dropped by this instance; it is a metric,
    not state (a restored operator counts from 0).  The state is keyed by all
    of ``columns`` but ``state_keys`` names the first: a stage with several
    tasks must route its input by ``columns[0]`` (rows of one key then meet
    in one task), and a rescale divides the state by it.

    >>> import pyarrow as pa
    >>> from operators.dedup import Deduplicate
    >>> dedup = Deduplicate("id", "t", 100)
    >>> dedup.process(pa.table({"id": [1, 1, 2], "t": [5, 7, 9]})).to_pylist()
    [{'id': 1, 't': 5}, {'id': 2, 't': 9}]
    >>> dedup.duplicates
    1
    >>> dedup.on_watermark(105).num_rows  # forgets id 1 (5 + 100 <= 105), not id 2
    0
    >>> dedup.process(pa.table({"id": [1, 2], "t": [110, 111]})).to_pylist()
    [{'id': 1, 't': 110}]

    State: ``{"seen": one row per remembered key (the key columns, then
    "__first_time", int64 ms), "watermark": one row, int64 ms or null before
    the first on_watermark}``."""

    SEEN = "seen"
    WATERMARK = "watermark"
    FIRST_TIME = "__first_time"

    def __init__(
        self,
        columns: str | Sequence[str],
        time_column: str,
        within: int | dt.timedelta,
        *,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        if isinstance(columns, str):
            columns = [columns]
        if not isinstance(columns, Sequence) or not columns:
            raise OperatorConfigError(f"{name}: columns must be a column name or a non-empty list of them")
        self.columns: tuple[str, ...] = tuple(key_name(column, name) for column in columns)
        if len(set(self.columns)) != len(self.columns):
            raise OperatorConfigError(f"{name}: columns must be distinct, got {list(self.columns)}")
        if self.FIRST_TIME in self.columns:
            raise OperatorConfigError(f"{name}: the column name {self.FIRST_TIME!r} is reserved for the state")
        self.time_column = et.time_column(time_column, name)
        self.within = et.millis(within, "within", name, positive=True)
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.duplicates = 0
        self._seen = KeyedState(self.columns, [self.FIRST_TIME], operator=name)
        self._watermark: int | None = None

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column that divides the state (``streaming.api.partitioning``): the
        first key column."""
        return {None: self.columns[0]}

    @property
    def watermark(self) -> int | None:
        """Milliseconds; None until the first ``on_watermark``."""
        return self._watermark

    def watermark_hold(self) -> int | None:
        """The earliest event time (ms) a row emitted from now on may have
        (operators.base, ``watermark_hold``); None before the first watermark."""
        return None if self._watermark is None else self._watermark - self.within + 1

    @property
    def seen(self) -> pa.Table:
        """The remembered keys and the event time (ms) of each one's first row."""
        return self._seen.table

    def process(self, batch: pa.Table) -> pa.Table:
        name = type(self).__name__
        require_columns(batch, [*self.columns, self.time_column], name)
        et.bounds_type(batch.schema.field(self.time_column).type, self.time_column, name)  # integers or timestamps
        rows = self._split_null_keys(batch)
        rows = et.null_times_out(rows, self.time_column, self.dead_letters, name)
        millis = et.to_millis(rows[self.time_column])
        if self._watermark is not None:
            late = pc.less_equal(pc.add(millis, self.within), self._watermark)
            if pc.any(late).as_py():
                self.dead_letters.add(rows.filter(late), Reason.LATE, name)
                on_time = pc.invert(late)
                rows, millis = rows.filter(on_time), millis.filter(on_time)
        if rows.num_rows == 0:
            return rows
        keys = pa.table({column: plain(rows[column]) for column in self.columns})
        if len(self._seen):
            key_schema = pa.schema([self._seen.schema.field(column) for column in self.columns])
            keys = conform(keys, key_schema, name, "batch keys")
        names = [f"k{i}" for i in range(len(self.columns))]
        probe = keys.rename_columns(names).append_column("i", row_index(rows.num_rows))
        firsts = probe.group_by(names, use_threads=False).aggregate([("i", "min")])["i_min"]
        if len(self._seen):  # keys seen before, looked up by key (not a pass over the whole state)
            firsts = firsts.filter(pa.array(~self._seen.contains(keys.take(firsts))))
        index = firsts.take(pc.sort_indices(firsts)).combine_chunks()
        self.duplicates += rows.num_rows - len(index)
        fresh = keys.take(index).append_column(self.FIRST_TIME, millis.take(index))
        self._seen.upsert(fresh)
        return rows.take(index)

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later and forget the keys it puts out of reach.
        Returns an empty table (nothing is released)."""
        watermark = et.watermark_millis(watermark, type(self).__name__)
        if self._watermark is None or watermark > self._watermark:
            self._watermark = watermark
        if len(self._seen):
            first = self._seen.table[self.FIRST_TIME]
            self._seen.pop(pc.less_equal(pc.add(first, self.within), self._watermark))
        return pa.table({})

    def snapshot(self) -> dict[str, pa.Table]:
        return {self.SEEN: self._seen.snapshot(), self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK)}

    def snapshot_later(self) -> LaterTables:
        return {
            self.SEEN: self._seen.snapshot_later(),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def changes(self) -> dict[str, StateChanges]:
        return {
            self.SEEN: self._seen.changes(),
            self.WATERMARK: whole(et.watermark_table(self._watermark, self.WATERMARK)),
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.SEEN, self.WATERMARK], name)
        watermark = et.restored_watermark(tables[self.WATERMARK], self.WATERMARK, name)
        seen = tables[self.SEEN]
        expect_columns(seen, self.SEEN, [*self.columns, self.FIRST_TIME], name)
        if seen.num_rows:
            first = seen[self.FIRST_TIME]
            if not pa.types.is_integer(first.type) or first.null_count:
                raise StateRestoreError(
                    f"{name}: snapshot column {self.FIRST_TIME!r} must be integer milliseconds without nulls, "
                    f"got {first.type} with {first.null_count} null(s)"
                )
            if watermark is not None and pc.min(first).as_py() + self.within <= watermark:
                raise StateRestoreError(
                    f"{name}: snapshot remembers keys that should have been forgotten at watermark {watermark}"
                )
        probe = KeyedState(self.columns, [self.FIRST_TIME], operator=name)
        probe.restore(seen, self.SEEN)
        self._seen = probe
        self._watermark = watermark

    def _split_null_keys(self, batch: pa.Table) -> pa.Table:
        """``batch`` without the rows with a null in a key column (dead letters)."""
        nulls = None
        for column in self.columns:
            if batch[column].null_count:
                missing = pc.is_null(batch[column])
                nulls = missing if nulls is None else pc.or_(nulls, missing)
        if nulls is None:
            return batch
        self.dead_letters.add(batch.filter(nulls), Reason.NULL_KEY, type(self).__name__)
        return batch.filter(pc.invert(nulls))

    def __repr__(self) -> str:
        return f"Deduplicate(columns={list(self.columns)}, time={self.time_column!r}, within={self.within}ms)"
