"""Kafka records as Arrow: the columns a stage task receives (from a Spark
micro-batch or read straight from Kafka) and header look-ups done in bulk.

Pure Arrow: the engine uses these without Spark."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = [
    "BATCH_COLUMNS",
    "RECORD_SCHEMA",
    "Headers",
    "header_values",
    "WholeNumbers",
    "whole_numbers",
    "Part",
    "PART",
    "ROW",
    "RECORDS",
    "EVENT_TIME",
    "REASON",
    "PARTIAL",
    "is_prepared",
    "part_of",
    "records_in",
    "unreadable_headers",
    "BATCH_BEGAN",
    "HANDED",
    "stamped",
    "stamp_of",
    "kafka_time",
]

# Columns of every batch handed to a task, in this order.
BATCH_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")

# Records read straight from Kafka, in the shape a stage query hands them over.
RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("timestamp", pa.timestamp("ms")),
    ]
)

Headers = Sequence[tuple[str, bytes]]

# when a micro-batch's table was made (wall clock, seconds), kept in its schema's metadata for
# the barrier path a checkpoint reports: Spark began the batch (foreachBatch), the task received it
BATCH_BEGAN = b"abs.batch_began"
HANDED = b"abs.handed"


def stamped(table: pa.Table, key: bytes, wall: float) -> pa.Table:
    """``table`` with ``key`` set to ``wall`` in its schema's metadata (no copy of the data)."""
    return table.replace_schema_metadata({**(table.schema.metadata or {}), key: repr(wall).encode()})


def stamp_of(table: pa.Table, key: bytes) -> float | None:
    """The wall time ``stamped`` set under ``key``, if any."""
    value = (table.schema.metadata or {}).get(key)
    return float(value) if value is not None else None


def kafka_time(table: pa.Table, row: int = 0) -> float | None:
    """The Kafka timestamp of record ``row`` (seconds since the epoch; a
    timestamp without a zone is UTC, as Kafka's are), if it has one."""
    if "timestamp" not in table.column_names:
        return None
    when = table["timestamp"][row].as_py()
    if when is None:
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=dt.UTC)
    return when.timestamp()


class Part(enum.IntEnum):
    """What a row of a *prepared* micro-batch is: one that a stage's Spark
    code made before it reached Python (``streaming.adapters.spark.stage``).
    Every row has the ``topic``, ``partition`` and ``offset`` of the record
    it stands for; the other columns depend on the part."""

    ROW = 0  # a row of the code's output, in ``ROW`` (the record at ``offset`` gave it)
    MARKER = 1  # the end of a run of data records: ``RECORDS`` records, highest ``EVENT_TIME``
    REJECTED = 2  # a record Spark could not decode: its raw columns and ``REASON``
    CONTROL = 3  # a control or watermark record, its raw columns as they came
    # the operator's partial aggregate of one key over a run of records, in ``PARTIAL``, at the
    # run's last offset (every partial of a run there: the task takes them together)
    PARTIAL = 4
    # a data record the stage's Spark code raised on (alone, from the records before it: the
    # rest of its micro-batch was prepared without it): its raw columns and ``REASON``
    RAISED = 5


# the columns of a prepared micro-batch beside the record columns
PART = "_abs_part"
ROW = "_abs_row"
RECORDS = "_abs_records"
EVENT_TIME = "_abs_event_time"
REASON = "_abs_reason"
PARTIAL = "_abs_partial"


def is_prepared(table: pa.Table) -> bool:
    """Whether ``table`` is a prepared micro-batch rather than Kafka records."""
    return PART in table.column_names


def part_of(table: pa.Table, part: Part) -> pa.Table:
    """The rows of a prepared micro-batch that are ``part``."""
    return table.filter(pc.equal(table[PART], pa.scalar(int(part), pa.int8())))


def header_values(table: pa.Table, name: str) -> pa.Array:
    """The value of header ``name`` in each row of a batch (null where absent;
    the first one where repeated), computed without a Python loop over rows."""
    headers = table["headers"].combine_chunks()
    flat = pc.list_flatten(headers)
    hit = pc.equal(flat.field("key"), name)
    rows = pc.filter(pc.list_parent_indices(headers), hit).to_numpy(zero_copy_only=False)
    values = pc.filter(flat.field("value"), hit)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    index = np.full(table.num_rows, -1, dtype=np.int64)
    index[rows[first]] = np.flatnonzero(first)
    return pc.take(values, pa.array(index, mask=index < 0)).cast(pa.binary())


# a header's whole number as the engine writes it: decimal ASCII digits, an optional minus sign,
# within a signed 64-bit integer (the longest has 19 digits)
_WHOLE_NUMBER = r"^-?[0-9]{1,19}$"
_INT64_DIGITS = {False: b"9223372036854775807", True: b"-9223372036854775808"}


@dataclass(frozen=True, slots=True)
class WholeNumbers:
    """Header values read as whole numbers: ``values`` (int64, null where
    the header is absent or malformed) and ``malformed`` (a bool per row:
    the header is there but is no whole number of a signed 64-bit integer)."""

    values: pa.Array
    malformed: np.ndarray


def whole_numbers(values: pa.Array) -> WholeNumbers:
    """``values`` (binary header values, null where absent; see
    ``header_values``) as whole numbers, without an exception for any value
    a writer may have put there: a value that is not one is ``malformed``
    and null in ``values``."""
    text = values.cast(pa.binary())
    shaped = pc.fill_null(pc.match_substring_regex(text, _WHOLE_NUMBER), False)
    # 19 characters of digits (20 with a sign) may pass int64: compared as text with the extreme of its sign
    negative = pc.fill_null(pc.starts_with(text, b"-"), False)
    lengths = pc.fill_null(pc.binary_length(text), 0)
    longest = pc.equal(lengths, pc.if_else(negative, 20, 19))
    within = pc.if_else(
        negative,
        pc.less_equal(text, _INT64_DIGITS[True]),  # "-9…" sorts by its digits, as its magnitude
        pc.less_equal(text, _INT64_DIGITS[False]),
    )
    fits = pc.and_(shaped, pc.or_(pc.invert(longest), pc.fill_null(within, False)))
    present = pc.is_valid(text)
    malformed = pc.and_(present, pc.invert(fits)).to_numpy(zero_copy_only=False)
    readable = pc.if_else(fits, text, pa.scalar(None, pa.binary()))
    return WholeNumbers(pc.cast(pc.cast(readable, pa.string()), pa.int64()), malformed)


def _unreadable_header(name: str, value: bytes | None) -> str:
    """Why a record whose header ``name`` (``abs.wm``, ``abs.gen``) holds
    ``value``, no whole number (``whole_numbers``), cannot be read."""
    value = value or b""  # absent is never unreadable; an empty value is
    shown = repr(value[:40]) + (f"... ({len(value)} bytes)" if len(value) > 40 else "")
    return f"header {name} is {shown}, not a whole number (decimal digits of a signed 64-bit integer)"


def unreadable_headers(table: pa.Table, names: Sequence[str]) -> tuple[dict[int, str], dict[str, WholeNumbers]]:
    """Why records of ``table`` cannot be read: for each whose headers
    ``names`` (``abs.wm``, ``abs.gen``) hold one that is no whole number,
    the first such (row -> ``_unreadable_header``); and each header read,
    by name (one no record has is not read: an ingress's records, as a rule)."""
    reasons: dict[int, str] = {}
    read: dict[str, WholeNumbers] = {}
    for name in names:
        raw = header_values(table, name)
        if raw.null_count == len(raw):
            continue
        read[name] = numbers = whole_numbers(raw)
        for i in np.flatnonzero(numbers.malformed):
            reasons.setdefault(int(i), _unreadable_header(name, raw[int(i)].as_py()))
    return reasons, read


def records_in(table: pa.Table) -> int:
    """How many Kafka records a micro-batch handed to a task stands for."""
    if not is_prepared(table):
        return table.num_rows
    parts = table[PART]
    alone = pc.is_in(parts, pa.array([int(Part.CONTROL), int(Part.RAISED)], pa.int8()))  # records not in a run
    return (pc.sum(alone.cast(pa.int64())).as_py() or 0) + (pc.sum(table[RECORDS]).as_py() or 0)
