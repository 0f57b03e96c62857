"""An event-time interval join of two streams: ``IntervalJoin`` (Flink's
``KeyedStream.intervalJoin().between(lower, upper)``, Spark's stream-stream
join with a time-range condition and watermarks).

Left row ``l`` and right row ``r`` with equal keys match when

    l.time + lower <= r.time <= l.time + upper

Each side's rows wait in state for rows of the other side that can still
match them, and leave it once the watermark says none can come any more.

Event time comes from an integer column (milliseconds) or a timestamp column
(any unit, any time zone, compared in whole milliseconds, rounded down), as
in ``operators.windows``; ``lower`` and ``upper`` are whole milliseconds (an
``int``) or a ``timedelta``, either may be negative.  The watermark is the
engine's: only ``on_watermark`` moves it, never the rows (docs/architecture/protocol.md,
"Event time")."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import _time as et
from operators._arrow import check_inputs, expect_tables, require_columns, row_index, storable
from operators.dead_letters import DeadLetters, Reason, origin_as_now, without_origin
from operators.errors import InputSchemaError, OperatorConfigError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.rescale import RESCALE_METADATA, rows_by

__all__ = ["IntervalJoin", "INNER", "LEFT_OUTER"]

INNER = "inner"
LEFT_OUTER = "left_outer"

# A state table gets many small chunks from batch-sized appends; past this
# many, they are combined into one (as in operators.state).
_MAX_CHUNKS = 16


def _signed_millis(value: int | dt.timedelta, argument: str, operator: str) -> int:
    """``value`` as whole milliseconds, which may be negative (``et.millis`` takes none)."""
    if isinstance(value, dt.timedelta):
        negative = value < dt.timedelta(0)
    else:
        negative = isinstance(value, int) and not isinstance(value, bool) and value < 0
    if negative:
        return -et.millis(-value, argument, operator, positive=False)
    return et.millis(value, argument, operator, positive=False)


def _time_type_ok(type_: pa.DataType) -> bool:
    return pa.types.is_integer(type_) or pa.types.is_timestamp(type_)


def _append(state: pa.Table, rows: pa.Table, operator: str, side: str) -> pa.Table:
    """``rows`` after ``state``; an empty state's types do not count."""
    if state.num_rows == 0:
        return rows
    if rows.num_rows == 0:
        return state
    try:
        table = pa.concat_tables([state, rows], promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
        raise InputSchemaError(f"{operator}: {side} rows do not fit the {side} rows buffered before: {exc}") from None
    if table.column(0).num_chunks > _MAX_CHUNKS:
        table = table.combine_chunks()
    return table


class IntervalJoin:
    """Joins each left row with every right row of the same key whose event
    time lies in ``[left time + lower, left time + upper]``.

    Every matching pair is emitted exactly once, when the second of the two
    rows is processed.  Within one ``process()`` call the left input is
    applied first, then the right one, so a pair of rows of the same call is
    found once (by the right row).  Pairs come in the order of the row that
    completes them, then of the buffered row it met.

    Rows are checked in this order, on each side: a null key goes to the dead
    letters (``null_key``), a null event time too (``null_event_time``), and
    so does a row whose event time is behind the watermark (``late``): it is
    never stored nor matched.  The other rows are matched, then buffered:
    a left row stays in state until ``left time + upper < watermark``, a right
    row until ``right time - lower < watermark``; after that no on-time row of
    the other side can match it.  Rows leave the state only in
    ``on_watermark``.

    ``how="left_outer"``: a left row that never matched is emitted once, with
    null right columns, by the ``on_watermark`` call that removes it from the
    state (in the order the left rows came).  ``how="inner"`` (default) never
    emits unmatched rows.

    The output's event time is the left row's (``left_time``):
    ``watermark_hold()`` is the earliest buffered left time, so the watermark
    a stage passes on after the join stays behind every row the join may
    still emit (a left-outer row comes ``upper`` after its time).

    Output: the left row's columns, then the right row's columns except its
    key (a name the left already has gets ``right_suffix``), the same columns
    whether or not a batch had matches.  The columns of a side are those of
    its latest batch; before the first right batch they are unknown, so until
    then an output (empty, or a left-outer row) has only the left columns;
    likewise an output before the first left batch has only the left key
    column on the left.

    >>> import pyarrow as pa
    >>> from operators.interval_join import IntervalJoin
    >>> join = IntervalJoin("ad", left_time="shown", right_time="clicked", lower=0, upper=10)
    >>> join.process({"left": pa.table({"ad": [1, 2], "shown": [100, 100]})}).num_rows
    0
    >>> join.process({"right": pa.table({"ad": [1, 1, 2], "clicked": [105, 150, 99]})}).to_pylist()
    [{'ad': 1, 'shown': 100, 'clicked': 105}]
    >>> join.on_watermark(120).num_rows  # the left rows leave the state (100 + 10 < 120)
    0
    >>> join.buffered_left.num_rows, join.buffered_right.to_pylist()
    (0, [{'ad': 1, 'clicked': 150}])

    State: ``{"left": buffered left rows and whether each matched yet (column
    "__matched"), "right": buffered right rows, "watermark": one row, int64 ms
    or null before the first on_watermark}``; the buffered rows divide by
    their key on rescale, the watermark takes the lowest."""

    LEFT = "left"
    RIGHT = "right"
    WATERMARK = "watermark"
    MATCHED = "__matched"

    def __init__(
        self,
        left_key: str,
        right_key: str | None = None,
        *,
        left_time: str,
        right_time: str,
        lower: int | dt.timedelta,
        upper: int | dt.timedelta,
        left: str = "left",
        right: str = "right",
        how: str = INNER,
        right_suffix: str = "_right",
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.left_key = key_name(left_key, name)
        self.right_key = key_name(right_key if right_key is not None else left_key, name)
        for argument, column in (("left_time", left_time), ("right_time", right_time)):
            if not (isinstance(column, str) and column):
                raise OperatorConfigError(f"{name}: {argument} must be a non-empty column name, got {column!r}")
        self.left_time, self.right_time = left_time, right_time
        if self.MATCHED in (self.left_key, self.left_time):
            raise OperatorConfigError(f"{name}: the left column name {self.MATCHED!r} is reserved for the state")
        self.lower = _signed_millis(lower, "lower", name)
        self.upper = _signed_millis(upper, "upper", name)
        if self.lower > self.upper:
            raise OperatorConfigError(f"{name}: lower must be <= upper, got lower={self.lower}, upper={self.upper}")
        if not (isinstance(left, str) and isinstance(right, str) and left and right and left != right):
            raise OperatorConfigError(
                f"{name}: left and right must be two distinct input names, got {left!r}, {right!r}"
            )
        if how not in (INNER, LEFT_OUTER):
            raise OperatorConfigError(f"{name}: how must be {INNER!r} or {LEFT_OUTER!r}, got {how!r}")
        if not (isinstance(right_suffix, str) and right_suffix):
            raise OperatorConfigError(f"{name}: right_suffix must be a non-empty string, got {right_suffix!r}")
        self.left, self.right, self.how, self.right_suffix = left, right, str(how), right_suffix
        self.inputs: tuple[str, ...] = (left, right)
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        # empty buffers' types do not count (the first rows bring theirs); int64 is a placeholder
        self._left = pa.table({self.left_key: pa.array([], pa.int64()), self.MATCHED: pa.array([], pa.bool_())})
        self._right = pa.table({self.right_key: pa.array([], pa.int64())})
        self._watermark: int | None = None

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column of each input that divides the state (``streaming.api.partitioning``)."""
        return {self.left: self.left_key, self.right: self.right_key}

    @property
    def watermark(self) -> int | None:
        """Milliseconds; None until the first ``on_watermark``."""
        return self._watermark

    def watermark_hold(self) -> int | None:
        """The earliest left event time (ms) of a buffered left row, or None:
        rows the join may still emit carry a left time no earlier than it
        (operators.base, ``watermark_hold``), left-outer rows included."""
        if self._left.num_rows == 0:
            return None
        return pc.min(et.to_millis(self._left[self.left_time])).as_py()

    @property
    def buffered_left(self) -> pa.Table:
        """Left rows in state (that on-time right rows can still match)."""
        return self._left.drop_columns([self.MATCHED])

    @property
    def buffered_right(self) -> pa.Table:
        """Right rows in state (that on-time left rows can still match)."""
        return self._right

    def process(self, batches: Mapping[str, pa.Table]) -> pa.Table:
        """Match this call's rows: the left input's first, then the right input's."""
        name = type(self).__name__
        check_inputs(name, self.inputs, batches)
        left = right = None
        if self.left in batches:
            rows = batches[self.left]
            if self.MATCHED in rows.column_names:
                raise InputSchemaError(f"{name}: left input has a column {self.MATCHED!r}, a name the state reserves")
            left = self._admit(rows, self.left_key, self.left_time, "left")
        if self.right in batches:
            right = self._admit(batches[self.right], self.right_key, self.right_time, "right")
            # an output row keeps its left row's origin: the right rows' is not kept
            right = (without_origin(right[0]), right[1])
        out: list[pa.Table] = []
        if left is not None:
            rows, millis = left
            lefts, rights = self._pairs(rows, millis, self._right, by_right=False)
            out.append(self._output(rows.take(lefts), self._right.take(rights)))
            matched = pc.is_in(row_index(rows.num_rows), value_set=lefts)
            self._left = _append(self._left, rows.append_column(self.MATCHED, matched), name, "left")
        if right is not None:
            rows, millis = right
            rights, lefts = self._pairs(rows, millis, self._left, by_right=True)
            out.append(self._output(self._left.take(lefts), rows.take(rights)))
            if len(lefts):
                hit = pc.is_in(row_index(self._left.num_rows), value_set=lefts)
                column = self._left.schema.get_field_index(self.MATCHED)
                self._left = self._left.set_column(column, self.MATCHED, pc.or_(self._left[self.MATCHED], hit))
            self._right = _append(self._right, rows, name, "right")
        filled = [table for table in out if table.num_rows]
        if not filled:
            return self._output(self._left.slice(0, 0), self._right.slice(0, 0))
        return filled[0] if len(filled) == 1 else pa.concat_tables(filled, promote_options="permissive")

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later; rows no on-time row can match any more leave
        the state, and with ``how="left_outer"`` the left ones that never
        matched are returned with null right columns."""
        watermark = et.watermark_millis(watermark, type(self).__name__)
        if self._watermark is None or watermark > self._watermark:
            self._watermark = watermark
        gone = self._left.slice(0, 0)
        if self._left.num_rows:  # an empty buffer may not have the time column yet
            expired = pc.less(pc.add(et.to_millis(self._left[self.left_time]), self.upper), self._watermark)
            gone = self._left.filter(expired)
            if gone.num_rows:
                self._left = self._left.filter(pc.invert(expired))
        if self._right.num_rows:
            expired = pc.less(pc.subtract(et.to_millis(self._right[self.right_time]), self.lower), self._watermark)
            if pc.any(expired).as_py():
                self._right = self._right.filter(pc.invert(expired))
        if self.how == LEFT_OUTER:
            unmatched = gone.filter(pc.invert(gone[self.MATCHED]))
            return self._output(unmatched, self._right.take(pa.nulls(unmatched.num_rows, pa.int32())))
        return self._output(gone.slice(0, 0), self._right.slice(0, 0))

    def snapshot(self) -> dict[str, pa.Table]:
        return {
            self.LEFT: storable(self._left).replace_schema_metadata({RESCALE_METADATA: rows_by(self.left_key)}),
            self.RIGHT: storable(self._right).replace_schema_metadata({RESCALE_METADATA: rows_by(self.right_key)}),
            self.WATERMARK: et.watermark_table(self._watermark, self.WATERMARK),
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.LEFT, self.RIGHT, self.WATERMARK], name)
        watermark = et.restored_watermark(tables[self.WATERMARK], self.WATERMARK, name)
        left = self._check_buffer(tables[self.LEFT], self.LEFT, self.left_key, self.left_time, [self.MATCHED])
        right = self._check_buffer(tables[self.RIGHT], self.RIGHT, self.right_key, self.right_time, [])
        matched = left.schema.get_field_index(self.MATCHED)
        if not pa.types.is_boolean(left.schema.field(matched).type):
            if left.num_rows:
                raise StateRestoreError(
                    f"{name}: snapshot column {self.MATCHED!r} of table 'left' is {left.schema.field(matched).type}, not bool"
                )
            left = left.set_column(matched, self.MATCHED, pa.array([], pa.bool_()))
        if left[self.MATCHED].null_count:
            raise StateRestoreError(f"{name}: snapshot column {self.MATCHED!r} of table 'left' has nulls")
        if left.num_rows and right.num_rows:
            try:
                left[self.left_key].cast(right.schema.field(self.right_key).type)
                right[self.right_key].cast(left.schema.field(self.left_key).type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise StateRestoreError(f"{name}: snapshot keys of 'left' and 'right' differ in type: {exc}") from None
        if watermark is not None:
            # what on_watermark(watermark) leaves, and on-time rows since: see the class docstring
            stale = [
                side
                for side, table, time, oldest in (
                    (self.LEFT, left, self.left_time, watermark - max(self.upper, 0)),
                    (self.RIGHT, right, self.right_time, watermark + min(self.lower, 0)),
                )
                if table.num_rows and pc.min(et.to_millis(table[time])).as_py() < oldest
            ]
            if stale:
                raise StateRestoreError(
                    f"{name}: snapshot table(s) {stale} hold rows that should have left the state at watermark {watermark}"
                )
        self._left = origin_as_now(left.replace_schema_metadata(None))
        self._right = without_origin(right.replace_schema_metadata(None))
        self._watermark = watermark

    def _check_buffer(self, table: pa.Table, table_name: str, key: str, time: str, internal: list[str]) -> pa.Table:
        name = type(self).__name__
        required = (key, time, *internal) if table.num_rows else (key, *internal)
        missing = [column for column in required if column not in table.column_names]
        if missing:
            raise StateRestoreError(
                f"{name}: snapshot table {table_name!r} lacks column(s) {missing} (has {table.column_names})"
            )
        if table[key].null_count:
            raise StateRestoreError(f"{name}: snapshot table {table_name!r} has null keys in {key!r}")
        if table.num_rows and not _time_type_ok(table.schema.field(time).type):
            raise StateRestoreError(
                f"{name}: snapshot time column {time!r} of table {table_name!r} is {table.schema.field(time).type}, "
                "expected integers (ms) or a timestamp"
            )
        if table.num_rows and table[time].null_count:
            raise StateRestoreError(f"{name}: snapshot table {table_name!r} has null event times in {time!r}")
        return table

    def _admit(self, rows: pa.Table, key: str, time: str, side: str) -> tuple[pa.Table, pa.ChunkedArray]:
        """``rows`` that are neither null nor late, and their event times in ms."""
        name = type(self).__name__
        require_columns(rows, [key, time], f"{name} ({side} input)")
        et.bounds_type(rows.schema.field(time).type, time, f"{name} ({side} input)")  # integers or timestamps
        rows = split_null_keys(rows, key, self.dead_letters, name)
        rows = et.null_times_out(rows, time, self.dead_letters, name)
        millis = et.to_millis(rows[time])
        if self._watermark is not None:
            late = pc.less(millis, self._watermark)
            if pc.any(late).as_py():
                self.dead_letters.add(rows.filter(late), Reason.LATE, name)
                on_time = pc.invert(late)
                rows, millis = rows.filter(on_time), millis.filter(on_time)
        return rows, millis

    def _pairs(
        self, rows: pa.Table, millis: pa.ChunkedArray, buffered: pa.Table, *, by_right: bool
    ) -> tuple[pa.Array, pa.Array]:
        """The matching pairs of ``rows`` (this call's rows of one side) and
        ``buffered`` (the other side's state), as two aligned arrays of row
        indices (``rows``'s, ``buffered``'s), in order of ``rows`` then of
        ``buffered``."""
        empty = pa.array([], pa.int64())
        if rows.num_rows == 0 or buffered.num_rows == 0:
            return empty, empty
        row_key, buffered_key, buffered_time = (
            (self.right_key, self.left_key, self.left_time)
            if by_right
            else (self.left_key, self.right_key, self.right_time)
        )
        keys = rows[row_key]
        key_type = buffered.schema.field(buffered_key).type
        if keys.type != key_type:
            try:
                keys = keys.cast(key_type)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                raise InputSchemaError(
                    f"{type(self).__name__}: keys of type {keys.type} do not match the buffered {key_type}: {exc}"
                ) from None
        probe = pa.table({"k": keys, "t": millis, "i": row_index(rows.num_rows)})
        other = pa.table(
            {"k": buffered[buffered_key], "u": et.to_millis(buffered[buffered_time]), "j": row_index(buffered.num_rows)}
        )
        joined = probe.join(other, "k", join_type="inner", use_threads=False)
        # right time - left time must lie in [lower, upper]
        gap = pc.subtract(joined["t"], joined["u"]) if by_right else pc.subtract(joined["u"], joined["t"])
        joined = joined.filter(pc.and_(pc.greater_equal(gap, self.lower), pc.less_equal(gap, self.upper)))
        joined = joined.sort_by([("i", "ascending"), ("j", "ascending")])
        return joined["i"].combine_chunks(), joined["j"].combine_chunks()

    def _output(self, lefts: pa.Table, rights: pa.Table) -> pa.Table:
        """Aligned left and right rows as output rows."""
        out = lefts.drop_columns([self.MATCHED]) if self.MATCHED in lefts.column_names else lefts
        names = set(out.column_names)
        for field in rights.schema:
            if field.name == self.right_key:
                continue
            column = field.name + self.right_suffix if field.name in names else field.name
            if column in names:
                raise InputSchemaError(
                    f"{type(self).__name__}: right column {field.name!r} would be named {column!r}, which the output "
                    "already has; choose another right_suffix"
                )
            names.add(column)
            out = out.append_column(column, rights[field.name])
        return out

    def __repr__(self) -> str:
        return (
            f"IntervalJoin({self.left}.{self.left_key} = {self.right}.{self.right_key}, "
            f"{self.right}.{self.right_time} in {self.left}.{self.left_time} + [{self.lower}, {self.upper}] ms, "
            f"how={self.how})"
        )
