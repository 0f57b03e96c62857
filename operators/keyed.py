"""The keyed aggregate: running aggregates per key, kept as one Arrow table
and updated a batch at a time.

Each batch is aggregated per key (``group_by().aggregate()``), combined with
the state's rows for the same keys (counts and sums add, minima and maxima
combine) and the result replaces them.  ``process()`` returns the updated
aggregate of every key the batch touched: an update stream, one row per key
per batch, in order of each key's first row in the batch."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import aggregations as agg
from operators._arrow import expect_columns, expect_tables, plain, require_columns
from operators.aggregations import Aggregation
from operators.base import LaterTables
from operators.dead_letters import DeadLetters, Reason
from operators.errors import OperatorConfigError, StateRestoreError
from operators.state import KeyedState, StateChanges

__all__ = ["KeyedAggregate"]


def key_name(key: object, operator: str) -> str:
    if not (isinstance(key, str) and key):
        raise OperatorConfigError(f"{operator}: key must be a non-empty column name, got {key!r}")
    return key


def split_null_keys(batch: pa.Table, key: str, dead_letters: DeadLetters, operator: str) -> pa.Table:
    """``batch`` without its null-key rows, which go to the dead letters; the
    key column comes back without dictionary encoding."""
    column = plain(batch[key])
    if column is not batch[key]:
        batch = batch.set_column(batch.schema.get_field_index(key), key, column)
    if column.null_count:
        dead_letters.add(batch.filter(pc.is_null(column)), Reason.NULL_KEY, operator)
        batch = batch.filter(pc.is_valid(column))
    return batch


class KeyedAggregate:
    """Running aggregates per value of ``key`` (strings, integers, any
    hashable Arrow type).

    ``aggregations`` maps output column names to specs (``count()``,
    ``sum_("amount")``, ``min_``, ``max_``).  Output and state columns: the
    key, then the aggregations in the order given.  Rows with a null key are
    not aggregated: they go to ``dead_letters`` with reason ``null_key``.

    State: ``{"state": table}`` with one row per key seen."""

    TABLE = "state"

    def __init__(self, key: str, aggregations: Mapping[str, Aggregation], *, dead_letters: DeadLetters | None = None):
        name = type(self).__name__
        self.key = key_name(key, name)
        self.aggregations = agg.validate([self.key], aggregations, name)
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self._state = KeyedState([self.key], list(self.aggregations), operator=name)

    @property
    def state(self) -> pa.Table:
        """The aggregate of every key seen so far."""
        return self._state.table

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column that divides the state (``streaming.api.partitioning``)."""
        return {None: self.key}

    def process(self, batch: pa.Table) -> pa.Table:
        name = type(self).__name__
        require_columns(batch, [self.key, *agg.input_columns(self.aggregations)], name)
        batch = split_null_keys(batch, self.key, self.dead_letters, name)
        partial = agg.partial(batch, [self.key], self.aggregations)
        return self._state.merge(partial, self._combine, self._fold)

    def merge_partials(self, partials: pa.Table) -> pa.Table:
        """Partial aggregates computed elsewhere (a stage's Spark code
        computes them per key over a run of records): the key, then the
        aggregate columns as ``process`` computes them from rows, one row per
        key.  Folded into the state; returns what ``process`` returns."""
        name = type(self).__name__
        require_columns(partials, [self.key, *self.aggregations], name)
        partials = split_null_keys(partials.select([self.key, *self.aggregations]), self.key, self.dead_letters, name)
        if pc.count_distinct(partials[self.key]).as_py() < partials.num_rows:  # a key of several runs
            partials = self._combine(partials)
        return self._state.merge(partials, self._combine, self._fold)

    def _combine(self, rows: pa.Table) -> pa.Table:
        return agg.combine(rows, [self.key], self.aggregations)

    def _fold(self, partial: pa.Table, held: pa.Table) -> pa.Table | None:
        return agg.fold(partial, held, self.aggregations)

    def snapshot(self) -> dict[str, pa.Table]:
        return {self.TABLE: self._state.snapshot()}

    def snapshot_later(self) -> LaterTables:
        return {self.TABLE: self._state.snapshot_later()}

    def changes(self) -> dict[str, StateChanges]:
        return {self.TABLE: self._state.changes()}

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        table = expect_tables(state, [self.TABLE], name)[self.TABLE]
        expect_columns(table, self.TABLE, [self.key, *self.aggregations], name)
        if table.num_rows:
            for column, aggregation in self.aggregations.items():
                if not agg.state_type_ok(aggregation, table.schema.field(column).type):
                    raise StateRestoreError(
                        f"{name}: snapshot column {column!r} is {table.schema.field(column).type}, "
                        f"which cannot hold {aggregation}"
                    )
        self._state.restore(table, self.TABLE)

    def __repr__(self) -> str:
        specs = ", ".join(f"{n}={a}" for n, a in self.aggregations.items())
        return f"{type(self).__name__}(key={self.key!r}, {specs})"
