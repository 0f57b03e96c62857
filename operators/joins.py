"""Two-input operators: ``Union`` and the keyed ``LatestValueJoin``.

Both are ``MultiInputOperator``s: ``process(batches)`` takes one table per
input name for the same micro-batch (a missing name means no rows from that
input) and returns one table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from operators._arrow import check_inputs, concat, expect_tables, require_columns, storable
from operators.base import LaterTables, Stateless
from operators.dead_letters import DeadLetters, Reason, origin_as_now, without_origin
from operators.errors import InputSchemaError, OperatorConfigError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.rescale import RESCALE_METADATA, rows_by
from operators.state import KeyedState, StateChanges, latest_per_key, whole

__all__ = ["Union", "LatestValueJoin", "Unmatched"]


class Union(Stateless):
    """The inputs' rows one after the other, in the order of ``inputs``,
    each tagged with its input's name in ``tag_column`` (None: no tag).
    Schemas are unified: a column one input lacks is null in its rows,
    numeric types widen.  Stateless."""

    def __init__(self, inputs: Sequence[str], *, tag_column: str | None = "input"):
        self.inputs: tuple[str, ...] = tuple(inputs)
        if (
            len(self.inputs) < 2
            or len(set(self.inputs)) != len(self.inputs)
            or not all(isinstance(name, str) and name for name in self.inputs)
        ):
            raise OperatorConfigError(f"Union: inputs must be two or more distinct names, got {inputs!r}")
        if tag_column is not None and not (isinstance(tag_column, str) and tag_column):
            raise OperatorConfigError(f"Union: tag_column must be a column name or None, got {tag_column!r}")
        self.tag_column = tag_column

    def process(self, batches: Mapping[str, pa.Table]) -> pa.Table:
        check_inputs("Union", self.inputs, batches)
        tables = [self._tagged(name, batches[name]) for name in self.inputs if name in batches]
        if not tables:
            return pa.table({self.tag_column: pa.array([], pa.string())}) if self.tag_column else pa.table({})
        try:
            return pa.concat_tables(tables, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InputSchemaError(f"Union: the inputs' schemas cannot be unified: {exc}") from None

    def _tagged(self, name: str, table: pa.Table) -> pa.Table:
        if self.tag_column is None:
            return table
        if self.tag_column in table.column_names:
            raise InputSchemaError(f"Union: input {name!r} already has a column {self.tag_column!r} (the tag column)")
        return table.append_column(self.tag_column, pa.array([name] * table.num_rows, pa.string()))

    def __repr__(self) -> str:
        return f"Union({', '.join(self.inputs)})"


class Unmatched(StrEnum):
    """What ``LatestValueJoin`` does with a left row whose key has no right value yet."""

    BUFFER = "buffer"
    """Keep it in state; emit it, enriched, when its key's right row arrives (default)."""
    EMIT_NULLS = "emit_nulls"
    """Emit it at once with null right columns (a left outer join)."""
    DEAD_LETTER = "dead_letter"
    """Send it to the dead letters with reason ``no_match``."""


class LatestValueJoin:
    """Enriches each left row with the latest right row seen for its key (a
    stream-table join: the right input is a changelog, the left a stream).

    Output: the left row's columns, then the right row's columns except its
    key (a name the left already has gets ``right_suffix``).

    Within one ``process()`` call the right input is applied first, so left
    rows see right rows of the same micro-batch (the last right row of a key
    wins).  Then left rows buffered earlier whose key now has a value are
    emitted, in arrival order, then this batch's left rows.  A left row whose
    key has no right value yet is handled by ``unmatched``: by default
    (``Unmatched.BUFFER``) it waits in state and is emitted as soon as its
    key's right row arrives, so every left row is enriched exactly once, as
    a stream user expects; buffered rows are visible as ``pending``, and a
    key whose right row never comes keeps its left rows in state (choose
    ``EMIT_NULLS`` or ``DEAD_LETTER`` where that can happen).  Null keys on
    either side go to the dead letters (``null_key``).

    On an event-time path give the left rows' ``time_column``: the join then
    holds the watermark it passes downstream at the earliest buffered row
    (``watermark_hold``), so a window after it never finds those rows late
    when their key's right row comes.

    State: ``{"right": latest right row per key, "pending": buffered left rows}``."""

    RIGHT = "right"
    PENDING = "pending"

    def __init__(
        self,
        left_key: str,
        right_key: str | None = None,
        *,
        left: str = "left",
        right: str = "right",
        unmatched: Unmatched | str = Unmatched.BUFFER,
        right_suffix: str = "_right",
        time_column: str | None = None,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.left_key = key_name(left_key, name)
        if time_column is not None and not (isinstance(time_column, str) and time_column):
            raise OperatorConfigError(f"{name}: time_column must be a column name or None, got {time_column!r}")
        self.time_column = time_column
        self.right_key = key_name(right_key if right_key is not None else left_key, name)
        if not (isinstance(left, str) and isinstance(right, str) and left and right and left != right):
            raise OperatorConfigError(
                f"{name}: left and right must be two distinct input names, got {left!r}, {right!r}"
            )
        try:
            self.unmatched = Unmatched(unmatched)
        except ValueError:
            raise OperatorConfigError(
                f"{name}: unmatched must be one of {[u.value for u in Unmatched]}, got {unmatched!r}"
            ) from None
        if not (isinstance(right_suffix, str) and right_suffix):
            raise OperatorConfigError(f"{name}: right_suffix must be a non-empty string, got {right_suffix!r}")
        self.left, self.right, self.right_suffix = left, right, right_suffix
        self.inputs: tuple[str, ...] = (left, right)
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._latest = KeyedState([self.right_key], operator=name)
        self._pending = pa.table({self.left_key: pa.array([], pa.int64())})

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column of each input that divides the state (``streaming.api.partitioning``)."""
        return {self.left: self.left_key, self.right: self.right_key}

    @property
    def latest(self) -> pa.Table:
        """The latest right row per key."""
        return self._latest.table

    def watermark_hold(self) -> int | None:
        """The earliest event time (ms) of a buffered left row, with ``time_column``."""
        if self.time_column is None or self._pending.num_rows == 0:
            return None
        times = self._pending[self.time_column]
        if pa.types.is_timestamp(times.type):
            times = times.cast(pa.timestamp("ms", times.type.tz)).cast(pa.int64())
        earliest = pc.min(times).as_py()
        return None if earliest is None else int(earliest)

    @property
    def pending(self) -> pa.Table:
        """Left rows waiting for their key's right row (``Unmatched.BUFFER``)."""
        return self._pending

    def process(self, batches: Mapping[str, pa.Table]) -> pa.Table:
        name = type(self).__name__
        check_inputs(name, self.inputs, batches)
        out: list[pa.Table] = []
        if self.right in batches:
            rows = batches[self.right]
            require_columns(rows, [self.right_key], f"{name} (right input)")
            # an output row is its left row: the right row's origin is not kept
            rows = without_origin(split_null_keys(rows, self.right_key, self.dead_letters, name))
            self._latest.upsert(latest_per_key(rows, [self.right_key]))
            if self._pending.num_rows:
                joined, matched = self._join(self._pending)
                self._pending = self._pending.filter(pc.invert(matched))
                out.append(joined.filter(matched))
        if self.left in batches:
            rows = batches[self.left]
            require_columns(rows, [self.left_key, *filter(None, [self.time_column])], f"{name} (left input)")
            rows = split_null_keys(rows, self.left_key, self.dead_letters, name)
            joined, matched = self._join(rows)
            if self.unmatched is Unmatched.EMIT_NULLS:
                out.append(joined)
            else:
                out.append(joined.filter(matched))
                unmatched = rows.filter(pc.invert(matched))
                if self.unmatched is Unmatched.BUFFER:
                    self._pending = concat([self._pending, unmatched])
                else:
                    self.dead_letters.add(unmatched, Reason.NO_MATCH, name)
        if not out:
            out.append(self._join(self._pending.slice(0, 0))[0])
        return concat(out)

    def snapshot(self) -> dict[str, pa.Table]:
        return {self.RIGHT: self._latest.snapshot(), self.PENDING: self._pending_table()}

    def snapshot_later(self) -> LaterTables:
        return {self.RIGHT: self._latest.snapshot_later(), self.PENDING: self._pending_table()}

    def changes(self) -> dict[str, StateChanges]:
        return {self.RIGHT: self._latest.changes(), self.PENDING: whole(self._pending_table())}

    def _pending_table(self) -> pa.Table:
        return storable(self._pending).replace_schema_metadata({RESCALE_METADATA: rows_by(self.left_key)})

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.RIGHT, self.PENDING], name)
        pending = tables[self.PENDING]
        if self.left_key not in pending.column_names:
            raise StateRestoreError(
                f"{name}: snapshot table 'pending' lacks the left key {self.left_key!r} (has {pending.column_names})"
            )
        if pending[self.left_key].null_count:
            raise StateRestoreError(f"{name}: snapshot table 'pending' has null keys")
        if pending.num_rows and self.time_column and self.time_column not in pending.column_names:
            raise StateRestoreError(
                f"{name}: snapshot table 'pending' lacks the time column {self.time_column!r} (has {pending.column_names})"
            )
        if pending.num_rows and self.unmatched is not Unmatched.BUFFER:
            raise StateRestoreError(
                f"{name}: snapshot has {pending.num_rows} buffered rows but unmatched={self.unmatched.value} never buffers"
            )
        probe = KeyedState([self.right_key], operator=name)
        probe.restore(tables[self.RIGHT], self.RIGHT)
        if pending.num_rows and len(probe):
            try:
                waiting = probe.lookup(pending[self.left_key])[self.right_key]
            except InputSchemaError as exc:
                raise StateRestoreError(
                    f"{name}: snapshot keys of 'pending' and 'right' differ in type: {exc}"
                ) from None
            if waiting.null_count != pending.num_rows:
                raise StateRestoreError(f"{name}: snapshot has buffered rows whose key already has a right value")
        self._latest = probe
        self._pending = origin_as_now(pending.replace_schema_metadata(None))

    def _join(self, rows: pa.Table) -> tuple[pa.Table, pa.ChunkedArray | pa.Array]:
        """``rows`` with the right columns appended, and which rows matched."""
        if len(self._latest) == 0:
            right = self._latest.table.take(pa.nulls(rows.num_rows, pa.int32()))
        else:
            right = self._latest.lookup(rows[self.left_key])
        matched = pc.is_valid(right[self.right_key])
        joined = rows
        for field in right.schema:
            if field.name == self.right_key:
                continue
            column = field.name + self.right_suffix if field.name in rows.column_names else field.name
            joined = joined.append_column(column, right[field.name])
        return joined, matched

    def __repr__(self) -> str:
        return (
            f"LatestValueJoin({self.left}.{self.left_key} = {self.right}.{self.right_key}, "
            f"unmatched={self.unmatched.value})"
        )
