"""Event time for the operators that follow it: durations and watermarks
as milliseconds, time columns (integer ms or timestamps) as int64
milliseconds, window bounds' types, and the watermark row of a snapshot."""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping

import pyarrow as pa
import pyarrow.compute as pc

from operators import aggregations as agg
from operators._arrow import expect_columns
from operators.aggregations import Aggregation
from operators.dead_letters import DeadLetters, Reason
from operators.errors import InputSchemaError, OperatorConfigError, StateRestoreError
from operators.rescale import MIN, RESCALE_METADATA

__all__ = [
    "EPOCH",
    "floor_div",
    "millis",
    "time_column",
    "watermark_millis",
    "bounds_type",
    "to_millis",
    "null_times_out",
    "restored_watermark",
    "watermark_table",
    "check_bounds_type",
    "check_aggregate_types",
]

PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def floor_div(values: pa.Array | pa.ChunkedArray, divisor: int) -> pa.Array | pa.ChunkedArray:
    """Integer division rounding down (Arrow's rounds toward zero)."""
    quotient = pc.divide(values, divisor)
    return pc.if_else(pc.greater(pc.multiply(quotient, divisor), values), pc.subtract(quotient, 1), quotient)


def millis(value: int | dt.timedelta, argument: str, operator: str, *, positive: bool) -> int:
    """``value`` as whole milliseconds, or OperatorConfigError naming ``argument``."""
    if isinstance(value, dt.timedelta):
        whole, rest = divmod(value, dt.timedelta(milliseconds=1))
        if rest:
            raise OperatorConfigError(f"{operator}: {argument} must be whole milliseconds, got {value}")
        value = whole
    if isinstance(value, bool) or not isinstance(value, int):
        raise OperatorConfigError(f"{operator}: {argument} must be an int (ms) or a timedelta, got {value!r}")
    if value < 0 or (positive and value == 0):
        raise OperatorConfigError(f"{operator}: {argument} must be {'> 0' if positive else '>= 0'}, got {value}")
    return value


def time_column(name: object, operator: str) -> str:
    if not (isinstance(name, str) and name):
        raise OperatorConfigError(f"{operator}: time_column must be a non-empty column name, got {name!r}")
    return name


def watermark_millis(watermark: int | dt.datetime, operator: str) -> int:
    """An ``on_watermark`` argument as milliseconds (a naive datetime is UTC)."""
    if isinstance(watermark, dt.datetime):
        moment = watermark if watermark.tzinfo else watermark.replace(tzinfo=dt.UTC)
        watermark = (moment - EPOCH) // dt.timedelta(milliseconds=1)
    if isinstance(watermark, bool) or not isinstance(watermark, int):
        raise OperatorConfigError(f"{operator}: watermark must be an int (ms) or a datetime, got {watermark!r}")
    return watermark


def bounds_type(time_type: pa.DataType, time_column: str, operator: str) -> pa.DataType:
    """The type of window bounds for a time column of ``time_type``."""
    if pa.types.is_integer(time_type):
        return pa.int64()
    if pa.types.is_timestamp(time_type):
        return pa.timestamp("ms", time_type.tz)
    raise InputSchemaError(
        f"{operator}: time column {time_column!r} is {time_type}; expected integer milliseconds or a timestamp"
    )


def to_millis(times: pa.ChunkedArray) -> pa.ChunkedArray:
    """Integer or timestamp values as int64 milliseconds (rounding down)."""
    if pa.types.is_integer(times.type):
        return times.cast(pa.int64())
    units = times.cast(pa.int64())
    per_ms = PER_MS[times.type.unit]
    return pc.multiply(units, 1000) if per_ms is None else floor_div(units, per_ms) if per_ms > 1 else units


def null_times_out(batch: pa.Table, time_column: str, dead_letters: DeadLetters, operator: str) -> pa.Table:
    """``batch`` without its rows of null event time, which go to the dead letters."""
    times = batch[time_column]
    if times.null_count:
        dead_letters.add(batch.filter(pc.is_null(times)), Reason.NULL_EVENT_TIME, operator)
        batch = batch.filter(pc.is_valid(times))
    return batch


def restored_watermark(marks: pa.Table, table_name: str, operator: str) -> int | None:
    expect_columns(marks, table_name, [table_name], operator)
    if marks.num_rows != 1 or not pa.types.is_integer(marks.schema.field(0).type):
        raise StateRestoreError(
            f"{operator}: snapshot table {table_name!r} must be one integer row, got {marks.num_rows} of {marks.schema.field(0).type}"
        )
    return marks.column(0)[0].as_py()


def watermark_table(watermark: int | None, table_name: str) -> pa.Table:
    # after a rescale every task starts from the lowest: no window closes early
    return pa.table({table_name: pa.array([watermark], pa.int64())}).replace_schema_metadata({RESCALE_METADATA: MIN})


def check_bounds_type(type_: pa.DataType, column: str, operator: str) -> None:
    if not (type_ == pa.int64() or (pa.types.is_timestamp(type_) and type_.unit == "ms")):
        raise StateRestoreError(f"{operator}: snapshot {column} is {type_}, expected int64 or timestamp[ms]")


def check_aggregate_types(table: pa.Table, aggregations: Mapping[str, Aggregation], operator: str) -> None:
    for column, aggregation in aggregations.items():
        if not agg.state_type_ok(aggregation, table.schema.field(column).type):
            raise StateRestoreError(
                f"{operator}: snapshot column {column!r} is {table.schema.field(column).type}, which cannot hold {aggregation}"
            )
