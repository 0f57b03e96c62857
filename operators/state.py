"""Keyed state: one Arrow table with one row per key, the state of every
keyed operator (aggregates, windows, the join's right side) and of custom
operators users write.

Rows are replaced, never changed in place: a table handed out by ``table``
or ``snapshot()`` never changes afterwards, which is what makes a snapshot an
immutable copy without copying.  An empty state has no fixed types (the
first rows that arrive bring theirs), so an operator behaves the same
whether its empty state is fresh or restored."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from operators._arrow import concat, conform, plain, row_index, storable
from operators.errors import InputSchemaError, OperatorConfigError, StateRestoreError

__all__ = ["KeyedState", "latest_per_key", "KEYS_METADATA"]

# the schema metadata naming a stored state table's key columns (a JSON list)
KEYS_METADATA = b"spark-abs.keys"

# A state table gets many small chunks from batch-sized updates; past this
# many, they are combined into one.
_MAX_CHUNKS = 16


def latest_per_key(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The last row of ``rows`` for each key, in the order of those last rows."""
    if rows.num_rows == 0:
        return rows
    index = pa.table({**{f"k{i}": rows[key] for i, key in enumerate(keys)}, "i": row_index(rows.num_rows)})
    last = index.group_by([f"k{i}" for i in range(len(keys))], use_threads=False).aggregate([("i", "max")])
    return rows.take(last.sort_by("i_max")["i_max"])


class KeyedState:
    """A table with one row per key: key columns and value columns.

    ``merge`` folds per-key partial results into the state (aggregates),
    ``upsert`` replaces whole rows (latest value per key), ``lookup`` reads
    rows for a column of keys, ``pop`` takes rows out.  Keys are never null."""

    __slots__ = ("keys", "operator", "_table")

    def __init__(self, keys: Sequence[str], value_columns: Sequence[str] = (), *, operator: str = "KeyedState"):
        if not keys:
            raise OperatorConfigError(f"{operator}: keyed state needs at least one key column")
        self.keys: tuple[str, ...] = tuple(keys)
        self.operator = operator
        # an empty state's types do not count; int64 is only a placeholder
        self._table = pa.table({name: pa.array([], pa.int64()) for name in (*self.keys, *value_columns)})

    @property
    def table(self) -> pa.Table:
        """The state as it is now (an immutable table)."""
        return self._table

    def __len__(self) -> int:
        return self._table.num_rows

    def merge(self, partial: pa.Table, combine: Callable[[pa.Table], pa.Table]) -> pa.Table:
        """Fold ``partial`` (at most one row per key, the state's columns) into
        the state and return the new rows of the keys it holds, in its order.

        ``combine`` gets the partial rows followed by the state's rows for the
        same keys and returns one row per key in order of first appearance."""
        if self._table.num_rows == 0:
            self._table = partial
            return partial
        partial = conform(partial, self._table.schema, self.operator, "batch")
        touched = self._mask(partial)
        combined = combine(pa.concat_tables([partial, self._table.filter(touched)]))
        self._replace(self._table.filter(pc.invert(touched)), combined)
        return combined

    def upsert(self, rows: pa.Table) -> None:
        """Make ``rows`` (at most one per key) the rows of their keys; other
        keys keep theirs.  Columns missing on either side become null."""
        if self._table.num_rows == 0:
            self._table = rows
            return
        self._replace(self._table.filter(pc.invert(self._mask(rows))), rows)

    def lookup(self, keys: pa.ChunkedArray | pa.Array) -> pa.Table:
        """The state's row for each of ``keys`` (single key column only), in
        the same order; a row of nulls where the state has none."""
        if len(self.keys) != 1:
            raise OperatorConfigError(f"{self.operator}: lookup needs a single key column, the state has {self.keys}")
        key_type = self._table.schema.field(self.keys[0]).type
        found = pc.index_in(self._same_type(keys, key_type), value_set=self._key_values())
        return self._table.take(found)

    def pop(self, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
        """Take the rows where ``mask`` is true out of the state and return them."""
        taken = self._table.filter(mask)
        if taken.num_rows:
            self._table = self._table.filter(pc.invert(mask))
        return taken

    def snapshot(self) -> pa.Table:
        """The state to store, its key columns named in the schema's metadata
        (``spark-abs.keys``, what ``spark-abs checkpoints diff`` compares by)."""
        return storable(self._table).replace_schema_metadata({KEYS_METADATA: json.dumps(list(self.keys))})

    def restore(self, table: pa.Table, table_name: str) -> None:
        """Take ``table`` as the state, after checking it has the key columns,
        no null key and no key twice (StateRestoreError otherwise)."""
        missing = [key for key in self.keys if key not in table.column_names]
        if missing:
            raise StateRestoreError(
                f"{self.operator}: snapshot table {table_name!r} lacks key column(s) {missing} (has {table.column_names})"
            )
        for key in self.keys:
            if table[key].null_count:
                raise StateRestoreError(f"{self.operator}: snapshot table {table_name!r} has null keys in {key!r}")
        if table.num_rows:
            distinct = table.group_by(list(self.keys), use_threads=False).aggregate([]).num_rows
            if distinct != table.num_rows:
                raise StateRestoreError(
                    f"{self.operator}: snapshot table {table_name!r} holds {table.num_rows - distinct} duplicate key(s)"
                )
        # the stored key names stay in the store: rows taken from the state must not carry them downstream
        self._table = table.replace_schema_metadata(None)

    def _replace(self, kept: pa.Table, new: pa.Table) -> None:
        table = concat([kept, new])
        if table.num_rows and table.column(0).num_chunks > _MAX_CHUNKS:
            table = table.combine_chunks()
        self._table = table

    def _key_values(self) -> pa.Array:
        return plain(self._table.column(self.keys[0])).combine_chunks()

    def _same_type(self, values: pa.ChunkedArray | pa.Array, type_: pa.DataType) -> pa.ChunkedArray | pa.Array:
        values = plain(values) if isinstance(values, pa.ChunkedArray) else values
        if values.type == type_:
            return values
        try:
            return values.cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputSchemaError(
                f"{self.operator}: keys of type {values.type} do not match the state's {type_}: {exc}"
            ) from None

    def _mask(self, rows: pa.Table) -> pa.ChunkedArray | pa.Array:
        """True for each state row whose key is among ``rows``' keys."""
        if len(self.keys) == 1:
            key = self.keys[0]
            values = self._same_type(rows[key], self._table.schema.field(key).type)
            return pc.is_in(
                self._table[key], value_set=values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values
            )
        probe = conform(rows.select(list(self.keys)), self._table.select(list(self.keys)).schema, self.operator, "keys")
        indexed = self._table.select(list(self.keys)).append_column("__row", row_index(self._table.num_rows))
        hits = indexed.join(probe, list(self.keys), join_type="left semi")["__row"]
        return pc.is_in(row_index(self._table.num_rows), value_set=hits.combine_chunks())
