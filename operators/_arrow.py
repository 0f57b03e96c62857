"""Arrow helpers shared by the operators (private): input and restore checks,
expression evaluation, concatenation and casts with operator-named errors."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence

import pyarrow as pa
import pyarrow.acero as acero
import pyarrow.compute as pc

from operators.dead_letters import ORIGIN
from operators.errors import InputSchemaError, OperatorError, StateRestoreError

__all__ = [
    "require_columns",
    "expect_tables",
    "expect_columns",
    "storable",
    "concat",
    "conform",
    "evaluate",
    "plain",
    "row_index",
    "check_inputs",
]


def require_columns(batch: pa.Table, columns: Iterable[str], operator: str) -> None:
    """Fail with InputSchemaError naming the first column ``batch`` lacks."""
    names = set(batch.column_names)
    for column in columns:
        if column not in names:
            # the rows' origin is the engine's, not the input's (operators.dead_letters)
            shown = [name for name in batch.column_names if name != ORIGIN]
            raise InputSchemaError(
                f"{operator}: input has no column {column!r} (columns: {', '.join(shown) or 'none'})"
            )


def expect_tables(state: Mapping[str, pa.Table], names: Sequence[str], operator: str) -> dict[str, pa.Table]:
    """The tables ``names`` of a snapshot, or StateRestoreError if the snapshot
    has a table missing, one too many, or something that is not a table."""
    if not isinstance(state, Mapping):
        raise StateRestoreError(
            f"{operator}: state must be a mapping of table name to pyarrow.Table, got {type(state).__name__}"
        )
    missing = [name for name in names if name not in state]
    extra = sorted(str(name) for name in state if name not in names)
    if missing or extra:
        raise StateRestoreError(
            f"{operator}: snapshot tables do not match: missing {missing or 'none'}, unexpected {extra or 'none'}"
            f" (expected {list(names)})"
        )
    for name in names:
        if not isinstance(state[name], pa.Table):
            raise StateRestoreError(
                f"{operator}: snapshot table {name!r} is a {type(state[name]).__name__}, not a pyarrow.Table"
            )
    return {name: state[name] for name in names}


def expect_columns(table: pa.Table, table_name: str, columns: Sequence[str], operator: str) -> None:
    """StateRestoreError unless ``table`` has exactly ``columns``, in that order."""
    if table.column_names != list(columns):
        raise StateRestoreError(
            f"{operator}: snapshot table {table_name!r} has columns {table.column_names}, expected {list(columns)}"
        )


def storable(table: pa.Table) -> pa.Table:
    """``table`` made safe to store: an empty column of Arrow's null type does
    not survive a Parquet round trip (pyarrow 26 aborts at exit after reading
    one back), so an empty table gets int64 there; an empty state's types are
    not used anyway (the next batch's types are)."""
    if table.num_rows or not any(pa.types.is_null(field.type) for field in table.schema):
        return table
    return table.cast(
        pa.schema([field.with_type(pa.int64()) if pa.types.is_null(field.type) else field for field in table.schema])
    )


def concat(tables: Sequence[pa.Table]) -> pa.Table:
    """Tables one after the other, schemas unified (missing columns become
    null, numeric types widen); empty tables only count when all are empty."""
    filled = [table for table in tables if table.num_rows]
    if not filled:
        return tables[0]
    if len(filled) == 1:
        return filled[0]
    return pa.concat_tables(filled, promote_options="permissive")


def conform(rows: pa.Table, schema: pa.Schema, operator: str, what: str) -> pa.Table:
    """``rows`` with the columns and types of ``schema`` (safe casts only)."""
    if rows.column_names != schema.names:
        try:
            rows = rows.select(schema.names)
        except KeyError:
            raise InputSchemaError(
                f"{operator}: {what} has columns {rows.column_names}, the state has {schema.names}"
            ) from None
    if rows.schema.equals(schema):
        return rows
    try:
        return rows.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputSchemaError(
            f"{operator}: {what} cannot be cast to the state's types ({rows.schema} -> {schema}): {exc}"
        ) from None


def evaluate(table: pa.Table, expression: pc.Expression) -> pa.ChunkedArray:
    """The value of ``expression`` for every row of ``table``, in row order."""
    plan = acero.Declaration.from_sequence(
        [
            acero.Declaration("table_source", acero.TableSourceNodeOptions(table)),
            acero.Declaration("project", acero.ProjectNodeOptions([expression], ["value"])),
        ]
    )
    return plan.to_table(use_threads=False).column(0)


def plain(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """A key column with dictionary encoding removed (keys compare by value)."""
    if pa.types.is_dictionary(column.type):
        return column.cast(column.type.value_type)
    return column


def row_index(n: int) -> pa.Array:
    """0, 1, ..., n-1 as int64."""
    return pc.subtract(pc.cumulative_sum(pa.nulls(n, pa.int64()).fill_null(1)), 1)


def check_inputs(operator: str, inputs: tuple[str, ...], batches: Mapping[str, pa.Table]) -> None:
    """OperatorError unless ``batches`` maps some of ``inputs`` to tables (a multi-input ``process``)."""
    if not isinstance(batches, Mapping):
        raise OperatorError(
            f"{operator}: process() takes a mapping of input name to table, got {type(batches).__name__}"
        )
    for name, table in batches.items():
        if name not in inputs:
            raise OperatorError(f"{operator}: unknown input {name!r} (inputs: {', '.join(inputs)})")
        if not isinstance(table, pa.Table):
            raise OperatorError(f"{operator}: input {name!r} is a {type(table).__name__}, not a pyarrow.Table")
