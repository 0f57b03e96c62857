"""Stateless operators: batch-at-a-time transforms on Arrow tables with
``pyarrow.compute``.  Their snapshot is empty; a resumed run needs nothing
but the input.

Predicates and column values are either a ``pyarrow.compute`` expression
(``pc.field("amount") > 0``) or a function of the whole batch returning an
Arrow array, never a function called row by row."""

from __future__ import annotations

from collections.abc import Callable
from typing import Union

import pyarrow as pa
import pyarrow.compute as pc

from operators._arrow import evaluate, require_columns
from operators.base import Stateless
from operators.dead_letters import ORIGIN, without_origin
from operators.errors import InputSchemaError, OperatorConfigError, OperatorError

__all__ = [
    "Passthrough",
    "MapBatches",
    "FilterRows",
    "FlatMap",
    "map_batches",
    "filter_rows",
    "flat_map",
    "select",
    "with_column",
]

ColumnValue = Union[pc.Expression, Callable[[pa.Table], "pa.Array | pa.ChunkedArray"]]  # noqa: UP007 - a runtime alias


def _name(fn: object) -> str:
    return getattr(fn, "__qualname__", None) or repr(fn)


def _column_of(batch: pa.Table, value: ColumnValue, operator: str) -> pa.Array | pa.ChunkedArray:
    if isinstance(value, pc.Expression):
        try:
            result = evaluate(batch, value)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InputSchemaError(f"{operator}: cannot evaluate {value} on this batch: {exc}") from None
    else:
        result = value(without_origin(batch))  # a function sees the rows as the stage's input has them
    if not isinstance(result, (pa.Array, pa.ChunkedArray)):
        raise OperatorError(f"{operator}: expected a pyarrow array, the function returned {type(result).__name__}")
    if len(result) != batch.num_rows:
        raise OperatorError(f"{operator}: got {len(result)} values for a batch of {batch.num_rows} rows")
    return result


class Passthrough(Stateless):
    """The batch as it came (a stage whose work is all Spark code)."""

    def process(self, batch: pa.Table) -> pa.Table:
        return batch

    def __repr__(self) -> str:
        return "passthrough()"


class MapBatches(Stateless):
    """``fn(batch)`` as the output: any table, any number of rows (``fn``
    gets the rows without their origin, ``operators.dead_letters.ORIGIN``,
    and the rows it returns have none)."""

    def __init__(self, fn: Callable[[pa.Table], pa.Table], name: str | None = None):
        if not callable(fn):
            raise OperatorConfigError(f"map_batches: fn must be callable, got {fn!r}")
        self.fn = fn
        self.name = name or _name(fn)

    def process(self, batch: pa.Table) -> pa.Table:
        # the function sees the rows as the stage's input has them, and its rows name no origin
        result = self.fn(without_origin(batch))
        if not isinstance(result, pa.Table):
            raise OperatorError(f"map_batches({self.name}): fn returned {type(result).__name__}, not a pyarrow.Table")
        return result

    def __repr__(self) -> str:
        return f"map_batches({self.name})"


class FilterRows(Stateless):
    """The rows for which ``predicate`` is true (false and null drop the row)."""

    def __init__(self, predicate: ColumnValue):
        if not (isinstance(predicate, pc.Expression) or callable(predicate)):
            raise OperatorConfigError(
                f"filter_rows: predicate must be a pyarrow.compute expression or a function, got {predicate!r}"
            )
        self.predicate = predicate

    def process(self, batch: pa.Table) -> pa.Table:
        mask = _column_of(batch, self.predicate, repr(self))
        if not pa.types.is_boolean(mask.type):
            raise OperatorError(f"{self!r}: the predicate gave {mask.type} values, not booleans")
        return batch.filter(mask, null_selection_behavior="drop")

    def __repr__(self) -> str:
        shown = self.predicate if isinstance(self.predicate, pc.Expression) else _name(self.predicate)
        return f"filter_rows({shown})"


class FlatMap(Stateless):
    """One row per element of a list column (the other columns repeated;
    empty and null lists give no row), or ``fn(batch)`` for any other
    one-to-many mapping."""

    def __init__(self, explode: str | Callable[[pa.Table], pa.Table]):
        if isinstance(explode, str):
            self.column: str | None = explode
            self.fn: MapBatches | None = None
        elif callable(explode):
            self.column, self.fn = None, MapBatches(explode)
        else:
            raise OperatorConfigError(f"flat_map: expected a list column name or a function, got {explode!r}")

    def process(self, batch: pa.Table) -> pa.Table:
        if self.fn is not None:
            return self.fn.process(batch)
        column = self.column
        if column is None:  # the constructor sets a column or a function
            raise OperatorConfigError(f"{self!r}: neither a list column nor a function")
        require_columns(batch, [column], repr(self))
        values = batch[column]
        if not (
            pa.types.is_list(values.type)
            or pa.types.is_large_list(values.type)
            or pa.types.is_fixed_size_list(values.type)
        ):
            raise OperatorError(f"{self!r}: column {column!r} is {values.type}, not a list")
        values = values.combine_chunks()
        parents = pc.list_parent_indices(values)
        out = batch.take(parents)
        return out.set_column(out.schema.get_field_index(column), column, pc.list_flatten(values))

    def __repr__(self) -> str:
        return f"flat_map({self.fn.name})" if self.fn is not None else f"flat_map({self.column!r})"


class _Select(Stateless):
    def __init__(self, columns: tuple[str, ...]):
        if not columns or not all(isinstance(c, str) for c in columns):
            raise OperatorConfigError(f"select: give one or more column names, got {columns!r}")
        self.columns = columns

    def process(self, batch: pa.Table) -> pa.Table:
        require_columns(batch, self.columns, repr(self))
        # the row's origin stays with it (operators.dead_letters)
        keep = [ORIGIN] if ORIGIN in batch.column_names and ORIGIN not in self.columns else []
        return batch.select([*self.columns, *keep])

    def __repr__(self) -> str:
        return f"select({', '.join(map(repr, self.columns))})"


class _WithColumn(Stateless):
    def __init__(self, name: str, value: ColumnValue):
        if not (isinstance(name, str) and name):
            raise OperatorConfigError(f"with_column: name must be a non-empty string, got {name!r}")
        if not (isinstance(value, pc.Expression) or callable(value)):
            raise OperatorConfigError(
                f"with_column: value must be a pyarrow.compute expression or a function, got {value!r}"
            )
        self.name, self.value = name, value

    def process(self, batch: pa.Table) -> pa.Table:
        column = _column_of(batch, self.value, repr(self))
        position = batch.schema.get_field_index(self.name)
        if position >= 0:
            return batch.set_column(position, self.name, column)
        return batch.append_column(self.name, column)

    def __repr__(self) -> str:
        return f"with_column({self.name!r})"


def map_batches(fn: Callable[[pa.Table], pa.Table], name: str | None = None) -> MapBatches:
    """Replace each batch by ``fn(batch)``."""
    return MapBatches(fn, name)


def filter_rows(predicate: ColumnValue) -> FilterRows:
    """Keep the rows where ``predicate`` (an expression, or a function of the
    batch returning a boolean array) is true."""
    return FilterRows(predicate)


def flat_map(explode: str | Callable[[pa.Table], pa.Table]) -> FlatMap:
    """Explode the list column ``explode`` into one row per element, or apply
    a function that returns any number of rows for the batch."""
    return FlatMap(explode)


def select(*columns: str) -> Stateless:
    """Keep only ``columns``, in that order (and the rows' origin,
    ``operators.dead_letters.ORIGIN``, when they have one)."""
    return _Select(columns)


def with_column(name: str, value: ColumnValue) -> Stateless:
    """Add (or replace) column ``name`` computed from the whole batch."""
    return _WithColumn(name, value)
