"""Record values on the wire.

Ingress topics (what users produce) and the Kafka sink carry one JSON object
per Kafka record, or for an ingress given an Avro schema one Avro record
(``streaming.adapters.avro``).  ``decode`` turns a batch of values into an Arrow table in
bulk (pyarrow's JSON reader) and, only when the bulk read fails, finds the
records that cannot be rows, so each malformed record is reported with its
reason and none is dropped silently.  ``encode`` is the way back.

Internal topics (stage to stage) carry columns: each Kafka record is one
compressed Arrow IPC stream of many rows (``encode_batches``, split below
the broker's message size), marked by the header ``abs.fmt: arrow``.
``decode_records`` reads a run of records of either kind, in order."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from streaming.adapters import avro
from streaming.adapters.records import header_values

__all__ = [
    "Decoded",
    "decode",
    "encode",
    "encode_batches",
    "decode_records",
    "FORMAT_HEADER",
    "ARROW_FORMAT",
    "MAX_BATCH_BYTES",
]

# the header that marks a record whose value is an Arrow IPC stream
FORMAT_HEADER = "abs.fmt"
ARROW_FORMAT = b"arrow"
# below the broker's and the producer's default message size (1 MiB), headers included
MAX_BATCH_BYTES = 900_000
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")


@dataclass(frozen=True, slots=True)
class Decoded:
    """The rows that decoded (``table``, in input order), the input index of
    each (``index``: the record it came from, so several rows of one Arrow
    record share it), and ``(input index, reason)`` for every record that did not."""

    table: pa.Table
    index: list[int]
    rejected: list[tuple[int, str]]


def _bulk(values: pa.Array, schema: pa.Schema | None) -> pa.Table:
    options = (
        pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        if schema is not None
        else pajson.ParseOptions()
    )
    # every value and a newline, joined without a Python loop: the array's own data buffer
    lines = pc.binary_join_element_wise(values, pa.nulls(len(values), pa.binary()).fill_null(b""), b"\n")
    offsets = np.frombuffer(lines.buffers()[1], dtype=np.int32, count=len(lines) + 1, offset=lines.offset * 4)
    data = lines.buffers()[2][int(offsets[0]) : int(offsets[-1])]
    return pajson.read_json(
        pa.BufferReader(data),
        parse_options=options,
        read_options=pajson.ReadOptions(use_threads=False, block_size=max(1 << 20, min(1 << 30, data.size + 1))),
    )


def _bulk_ok(values: pa.Array) -> bool:
    """Whether every value can be one line of NDJSON: present, not empty, no newline."""
    if values.null_count:
        return False
    if not pc.all(pc.greater(pc.binary_length(values), 0)).as_py():
        return False
    return not pc.any(pc.greater(pc.count_substring(values, "\n"), 0)).as_py()


# how an ingress's values are read: JSON (its rows' schema, or None: inferred), or Avro
ValueSchema: TypeAlias = pa.Schema | avro.AvroSchema | None


def decode(values: Sequence[bytes | None] | pa.Array, schema: ValueSchema = None) -> Decoded:
    """Decode JSON object values; with ``schema`` the columns and types are
    fixed (missing fields are null, extra fields are ignored).  With an
    ``AvroSchema``, Avro records of it."""
    array = values if isinstance(values, pa.Array | pa.ChunkedArray) else pa.array(values, pa.binary())
    if isinstance(array, pa.ChunkedArray):
        array = array.combine_chunks()
    array = array.cast(pa.binary())
    if isinstance(schema, avro.AvroSchema):
        return Decoded(*avro.decode(array, schema))
    if len(array) == 0:
        return Decoded(_empty(schema), [], [])
    if _bulk_ok(array):
        try:
            table = _bulk(array, schema)
            if table.num_rows == len(array):
                return Decoded(table, list(range(len(array))), [])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    rows: list[dict] = []
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for i, value in enumerate(array.to_pylist()):
        reason = _check(value, schema, rows)
        if reason is None:
            index.append(i)
        else:
            rejected.append((i, reason))
    if schema is not None:
        table = pa.Table.from_pylist(rows, schema=schema)
    else:
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            # without a schema, types that disagree between records cannot be one table
            return Decoded(
                pa.table({}), [], [(i, f"value types disagree within the batch: {exc}") for i in range(len(array))]
            )
    return Decoded(table, index, rejected)


def _check(value: bytes | None, schema: pa.Schema | None, rows: list[dict]) -> str | None:
    if value is None:
        return "record has no value"
    try:
        row = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"value is not JSON: {exc}"
    if not isinstance(row, dict):
        return f"value is JSON {type(row).__name__}, not an object"
    if schema is not None:
        row = {name: row.get(name) for name in schema.names}
        try:
            pa.Table.from_pylist([row], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            return f"value does not fit the schema ({schema.to_string(show_schema_metadata=False)!r}): {exc}"
    rows.append(row)
    return None


def encode(table: pa.Table) -> list[bytes]:
    """One compact JSON object per row, written by polars in bulk (timestamps
    as ``YYYY-MM-DD HH:MM:SS``, nulls as ``null``)."""
    if table.num_rows == 0:
        return []
    # a table makes a DataFrame (polars' overloads cannot tell, pyarrow being untyped here)
    lines = cast(pl.DataFrame, pl.from_arrow(table)).write_ndjson().encode()
    # JSON escapes newlines inside strings: every newline ends a row
    return lines.split(b"\n")[: table.num_rows]


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=_IPC_OPTIONS) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def encode_batches(table: pa.Table, max_bytes: int = MAX_BATCH_BYTES) -> list[bytes]:
    """``table`` as compressed Arrow IPC streams, in row order, each at most
    ``max_bytes`` (a single row larger than that is one value of its own)."""
    out: list[bytes] = []

    def write(part: pa.Table) -> None:
        data = _ipc(part)
        if len(data) <= max_bytes or part.num_rows <= 1:
            out.append(data)
            return
        pieces = -(-len(data) * 5 // (max_bytes * 4))  # aim a fifth below the limit
        step = max(1, -(-part.num_rows // pieces))
        for start in range(0, part.num_rows, step):
            write(part.slice(start, step))

    if table.num_rows:
        write(table)
    return out


def _empty(schema: ValueSchema) -> pa.Table:
    if schema is None:
        return pa.table({})
    return (schema.arrow if isinstance(schema, avro.AvroSchema) else schema).empty_table()


def _read_ipc(value: bytes | None) -> pa.Table:
    if not value:
        raise pa.ArrowInvalid("record has no value")
    with pa.ipc.open_stream(value) as reader:
        return reader.read_all()


def decode_records(records: pa.Table, schema: ValueSchema = None) -> Decoded:
    """Decode the values of ``records`` (Kafka records with ``value`` and
    ``headers`` columns): JSON objects, and Arrow IPC streams where the
    ``abs.fmt`` header says so, each run in its own way, rows in record order."""
    arrow = pc.fill_null(pc.equal(header_values(records, FORMAT_HEADER), ARROW_FORMAT), False)
    values = records["value"].combine_chunks()
    if not pc.any(arrow).as_py():
        return decode(values, schema)
    flags = arrow.to_numpy(zero_copy_only=False)
    bounds = [0, *np.flatnonzero(flags[1:] != flags[:-1]) + 1, len(flags)]
    tables: list[pa.Table] = []
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        if not flags[begin]:
            part = decode(values.slice(begin, end - begin), schema)
            tables.append(part.table)
            index += [begin + i for i in part.index]
            rejected += [(begin + i, reason) for i, reason in part.rejected]
            continue
        for i in range(begin, end):
            try:
                table = _read_ipc(values[i].as_py())
            except (pa.ArrowInvalid, OSError) as exc:
                rejected.append((i, f"value is not a readable Arrow IPC stream: {exc}"))
                continue
            tables.append(table)
            index += [i] * table.num_rows
    tables = [t for t in tables if t.num_rows] or tables[:1]
    if not tables:
        return Decoded(_empty(schema), [], rejected)
    try:
        table = pa.concat_tables(tables, promote_options="permissive")
    except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
        return Decoded(
            pa.table({}),
            [],
            rejected + [(i, f"batch schemas disagree within the micro-batch: {exc}") for i in sorted(set(index))],
        )
    return Decoded(table, index, sorted(rejected))
