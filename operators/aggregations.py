"""Aggregation specs for the keyed and windowed aggregates, and the two
vectorised steps every aggregate takes: a batch is aggregated per key
(``partial``), then combined with the rows the state already has for those
keys (``combine``: counts and sums add, minima and maxima take the smaller
and the larger).

    KeyedAggregate(key="account", aggregations={
        "count": count(), "total": sum_("amount"),
        "lo": min_("amount"), "hi": max_("amount"),
    })

Nulls are skipped as in SQL: ``sum_`` of only nulls is null, ``count(column)``
counts non-null values, ``count()`` counts rows."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum

import pyarrow as pa
import pyarrow.compute as pc

from operators.errors import OperatorConfigError

__all__ = ["AggregateFunction", "Aggregation", "count", "sum_", "min_", "max_"]


class AggregateFunction(StrEnum):
    COUNT = "count"
    SUM = "sum"
    MIN = "min"
    MAX = "max"


# how a state value and a batch's partial value of the same key are combined
_COMBINE = {
    AggregateFunction.COUNT: "sum",
    AggregateFunction.SUM: "sum",
    AggregateFunction.MIN: "min",
    AggregateFunction.MAX: "max",
}


@dataclass(frozen=True, slots=True)
class Aggregation:
    """One aggregate column: ``function`` over ``column`` (``None`` only for
    ``count()``, which counts rows).  Build them with ``count``, ``sum_``,
    ``min_`` and ``max_``."""

    function: AggregateFunction
    column: str | None = None

    def __post_init__(self) -> None:
        if self.column is None and self.function is not AggregateFunction.COUNT:
            raise OperatorConfigError(f"{self.function.value}() needs a column")
        if self.column is not None and not (isinstance(self.column, str) and self.column):
            raise OperatorConfigError(
                f"{self.function.value}(): column must be a non-empty string, got {self.column!r}"
            )

    def __str__(self) -> str:
        return f"{self.function.value}({self.column or ''})"


def count(column: str | None = None) -> Aggregation:
    """Rows per key; with ``column``, the non-null values of that column."""
    return Aggregation(AggregateFunction.COUNT, column)


def sum_(column: str) -> Aggregation:
    """Sum of ``column`` per key (nulls skipped; null if all were null)."""
    return Aggregation(AggregateFunction.SUM, column)


def min_(column: str) -> Aggregation:
    """Smallest value of ``column`` per key (nulls skipped)."""
    return Aggregation(AggregateFunction.MIN, column)


def max_(column: str) -> Aggregation:
    """Largest value of ``column`` per key (nulls skipped)."""
    return Aggregation(AggregateFunction.MAX, column)


def validate(keys: Sequence[str], aggregations: Mapping[str, Aggregation], operator: str) -> dict[str, Aggregation]:
    """The aggregations as a plain dict, or OperatorConfigError on a bad spec."""
    if not isinstance(aggregations, Mapping) or not aggregations:
        raise OperatorConfigError(
            f"{operator}: aggregations must be a non-empty mapping of output column to Aggregation"
        )
    for name, aggregation in aggregations.items():
        if not isinstance(name, str) or not name:
            raise OperatorConfigError(f"{operator}: aggregation names must be non-empty strings, got {name!r}")
        if name in keys:
            raise OperatorConfigError(f"{operator}: aggregation {name!r} has the name of a key column")
        if not isinstance(aggregation, Aggregation):
            raise OperatorConfigError(
                f"{operator}: aggregation {name!r} must be built with count(), sum_(), min_() or max_(), got {aggregation!r}"
            )
    return dict(aggregations)


def input_columns(aggregations: Mapping[str, Aggregation]) -> list[str]:
    """The input columns the aggregations read."""
    return list(dict.fromkeys(a.column for a in aggregations.values() if a.column is not None))


def partial(rows: pa.Table, keys: Sequence[str], aggregations: Mapping[str, Aggregation]) -> pa.Table:
    """One row per distinct key of ``rows`` (in order of first appearance):
    the key columns, then one column per aggregation."""
    columns: dict[str, pa.ChunkedArray] = {f"k{i}": rows[key] for i, key in enumerate(keys)}
    specs: list[tuple] = []
    for i, aggregation in enumerate(aggregations.values()):
        name = f"a{i}"
        if aggregation.function is AggregateFunction.COUNT:
            columns[name] = rows[aggregation.column or keys[0]]
            mode = "only_valid" if aggregation.column else "all"
            specs.append((name, "count", pc.CountOptions(mode=mode)))
        else:
            columns[name] = rows[aggregation.column]
            specs.append((name, aggregation.function.value))
    grouped = pa.table(columns).group_by(list(columns)[: len(keys)], use_threads=False).aggregate(specs)
    out = {key: grouped[f"k{i}"] for i, key in enumerate(keys)}
    for i, (name, spec) in enumerate(zip(aggregations, specs)):
        out[name] = grouped[f"a{i}_{spec[1]}"]
    return pa.table(out)


def combine(rows: pa.Table, keys: Sequence[str], aggregations: Mapping[str, Aggregation]) -> pa.Table:
    """``rows`` (key columns then aggregate columns, several rows per key)
    reduced to one row per key in order of first appearance, types kept."""
    columns = {f"k{i}": rows[key] for i, key in enumerate(keys)}
    columns.update({f"a{i}": rows[name] for i, name in enumerate(aggregations)})
    specs = [(f"a{i}", _COMBINE[a.function]) for i, a in enumerate(aggregations.values())]
    grouped = pa.table(columns).group_by(list(columns)[: len(keys)], use_threads=False).aggregate(specs)
    out = {key: grouped[f"k{i}"] for i, key in enumerate(keys)}
    for i, (name, spec) in enumerate(zip(aggregations, specs)):
        out[name] = grouped[f"a{i}_{spec[1]}"]
    return pa.table(out).cast(rows.schema)


def _add(a: pa.ChunkedArray, b: pa.ChunkedArray) -> pa.ChunkedArray:
    # a sum or count skips nulls: null only where both are
    return pc.coalesce(pc.add(a, b), a, b)


# how combine's grouping folds two values of a key, element by element
_FOLD: dict[AggregateFunction, Callable[[pa.ChunkedArray, pa.ChunkedArray], pa.ChunkedArray]] = {
    AggregateFunction.COUNT: _add,
    AggregateFunction.SUM: _add,
    AggregateFunction.MIN: lambda a, b: pc.min_element_wise(a, b, skip_nulls=True),
    AggregateFunction.MAX: lambda a, b: pc.max_element_wise(a, b, skip_nulls=True),
}


def fold(partial: pa.Table, held: pa.Table, aggregations: Mapping[str, Aggregation]) -> pa.Table | None:
    """What ``combine`` gives for ``partial`` and ``held`` (the same keys, in
    the same order, one row each), computed row by row without grouping: the
    aggregate columns folded.  None where a column is not a number (its
    values are then combined by grouping)."""
    out: dict[str, pa.ChunkedArray] = {}
    for name, aggregation in aggregations.items():
        a, b = partial[name], held[name]
        kind = a.type
        if kind != b.type or not (pa.types.is_integer(kind) or pa.types.is_floating(kind)):
            return None
        out[name] = _FOLD[aggregation.function](a, b).cast(kind)
    return pa.table(out)


def state_type_ok(aggregation: Aggregation, type_: pa.DataType) -> bool:
    """Whether a restored column of ``type_`` can hold ``aggregation``."""
    if aggregation.function is AggregateFunction.COUNT:
        return pa.types.is_integer(type_)
    if aggregation.function is AggregateFunction.SUM:
        return pa.types.is_integer(type_) or pa.types.is_floating(type_) or pa.types.is_decimal(type_)
    return not (pa.types.is_nested(type_) or pa.types.is_null(type_))
