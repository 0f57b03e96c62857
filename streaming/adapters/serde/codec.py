"""Record values on the wire.

Ingress topics (what users produce) and the Kafka sink carry one JSON object
per Kafka record, or for an ingress given an Avro schema one Avro record
(``streaming.adapters.serde.avro``).  ``decode`` turns a batch of values into an Arrow table in
bulk (pyarrow's JSON reader) and, only when the bulk read fails, finds the
records that cannot be rows, so each malformed record is reported with its
reason and none is dropped silently.  ``encode`` is the way back.

Internal topics (stage to stage) carry columns: each Kafka record is one
compressed Arrow IPC stream of many rows (``encode_batches``, split below
the broker's message size and below ``DECODED_BATCH_BYTES`` once read),
marked by the header ``abs.fmt: arrow``.  ``decode_records`` reads a run of
records of either kind, in order, as the channel's ``ChannelReading`` says:
an ingress channel takes no Arrow batch (producers of ingress topics write
JSON or Avro; a record that says it is Arrow is rejected, not read), an
internal one reads each batch within a cap on its decompressed bytes
(``streaming.adapters.serde.arrow_ipc``).

Whatever goes wrong decoding one record (an exception of any kind, a batch
whose columns do not fit the others') rejects that record alone, with the
reason: when the records of a run cannot be one table, each record's rows
are checked against the schema most of them share (``_combine``), so one
bad record never takes its segment's good ones with it."""

from __future__ import annotations

import collections
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeAlias, cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pajson

from barriers.headers import FORMAT_HEADER
from streaming.adapters.serde import arrow_ipc, avro
from streaming.adapters.serde.records import header_values
from streaming.api.settings import DECODED_BATCH_BYTES, JobSettings

__all__ = [
    "ChannelReading",
    "Decoded",
    "decode",
    "required_fields",
    "encode",
    "encode_batches",
    "decode_records",
    "read_batch",
    "ARROW_FORMAT",
    "MAX_BATCH_BYTES",
    "DECODED_BATCH_BYTES",
    "ARROW_ON_INGRESS",
]

ARROW_FORMAT = b"arrow"
# below the broker's and the producer's default message size (1 MiB), headers included
MAX_BATCH_BYTES = 900_000
_IPC_OPTIONS = pa.ipc.IpcWriteOptions(compression="zstd")
# why an ingress record marked as an Arrow batch is rejected
ARROW_ON_INGRESS = (
    "an Arrow batch (header abs.fmt: arrow) on an ingress topic: only the job's stages write Arrow batches, "
    "to its internal topics; an ingress topic's records are read as its schema says"
)


@dataclass(frozen=True, slots=True)
class Decoded:
    """The rows that decoded (``table``, in input order), the input index of
    each (``index``: the record it came from, so several rows of one Arrow
    record share it), and ``(input index, reason)`` for every record that did not."""

    table: pa.Table
    index: list[int]
    rejected: list[tuple[int, str]]


# how an ingress's values are read: JSON (its rows' schema, or None: inferred), or Avro
ValueSchema: TypeAlias = pa.Schema | avro.AvroSchema | None


@dataclass(frozen=True, slots=True)
class ChannelReading:
    """How the records of one channel are read: an ingress topic's as its
    ``schema`` says (JSON or Avro, never an Arrow batch), an internal
    topic's as Arrow batches, each at most ``max_decoded_bytes`` once
    decompressed (``JobSettings.max_decoded_bytes``).  Made by ``ingress``
    or ``internal``."""

    schema: ValueSchema = None
    # Arrow batches are read (an internal topic), each within this many decompressed bytes;
    # None: they are rejected (an ingress topic)
    max_decoded_bytes: int | None = None

    @classmethod
    def ingress(cls, schema: ValueSchema) -> ChannelReading:
        return cls(schema, None)

    @classmethod
    def internal(cls, max_decoded_bytes: int = JobSettings.default("max_decoded_bytes")) -> ChannelReading:
        return cls(None, max_decoded_bytes)


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
    """Whether every value can be one line of NDJSON: present, one object
    (``{`` first and ``}`` last: pyarrow 26's reader crashes the process on
    a lone ``null`` document, and reads one among objects as a row of
    nulls), no newline.  Any other goes the slow way, record by record."""
    if values.null_count:
        return False
    if not (pc.all(pc.starts_with(values, "{")).as_py() and pc.all(pc.ends_with(values, "}")).as_py()):
        return False
    return not pc.any(pc.greater(pc.count_substring(values, "\n"), 0)).as_py()


def decode(values: Sequence[bytes | None] | pa.Array, schema: ValueSchema = None) -> Decoded:
    """Decode JSON object values; with ``schema`` the columns and types are
    fixed (missing fields are null, extra fields are ignored; a record
    without a field the schema declares not null is rejected).  With an
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
            # without a schema, pyarrow 26 infers a list with leading nulls ([null, 1]) as offsets past
            # its values (apache/arrow#51305): a table that does not validate is read record by record
            if table.num_rows == len(array) and (schema is not None or _valid(table)):
                return _without_missing(table, schema)
        except Exception:  # any failure of the bulk read: each record is read on its own
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
        return Decoded(pa.Table.from_pylist(rows, schema=schema), index, rejected)
    # every field of every row (pyarrow names the columns after the first row's alone: a first
    # record of no fields would lose every other's)
    names = list(dict.fromkeys(name for row in rows for name in row))
    rows = [{name: row.get(name) for name in names} for row in rows]
    try:
        return Decoded(pa.Table.from_pylist(rows), index, rejected)
    except Exception:  # without a schema, types that disagree: each row on its own
        pass
    parts: list[tuple[pa.Table, list[int]]] = []
    for i, row in zip(index, rows):
        try:
            parts.append((pa.Table.from_pylist([row]), [i]))
        except Exception as exc:  # a row no Arrow type holds
            rejected.append((i, f"value has no Arrow type: {type(exc).__name__}: {exc}"))
    if not parts:
        return Decoded(pa.table({}), [], rejected)
    table, index, disagree = _combine(parts, "value types disagree with the other records'")
    return Decoded(table, index, sorted(rejected + disagree))


def _check(value: bytes | None, schema: pa.Schema | None, rows: list[dict]) -> str | None:
    if value is None:
        return "record has no value"
    try:
        # as UTF-8 (a byte-order mark allowed, as json.loads allows it), as JSON on Kafka is:
        # json.loads would guess UTF-16 or -32 from zero bytes
        text = value.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        return _binary(value, exc.start)
    try:
        row = json.loads(text)
    except json.JSONDecodeError as exc:
        zero = value.find(b"\x00")  # no text holds one: binary (Avro, Confluent's wire format, ...)
        return f"value is not JSON: {exc}" if zero < 0 else _binary(value, zero)
    except RecursionError:
        return "value is not JSON this reader takes: nested deeper than Python's recursion limit"
    except Exception as exc:  # whatever else reading it raised (an integer of over 4300 digits, ...): this record alone
        return f"value is not JSON this reader takes: {type(exc).__name__}: {exc}"
    if not isinstance(row, dict):
        return f"value is JSON {type(row).__name__}, not an object"
    if schema is not None:
        row = {name: row.get(name) for name in schema.names}
        missing = [name for name in required_fields(schema) if row[name] is None]
        if missing:
            return _lacks(missing)
        try:
            pa.Table.from_pylist([row], schema=schema)
        except Exception as exc:  # whatever Arrow makes of it, the record does not fit
            return f"value does not fit the schema ({schema.to_string(show_schema_metadata=False)!r}): {exc}"
    rows.append(row)
    return None


def required_fields(schema: pa.Schema) -> list[str]:
    """The fields a JSON value must give: those the schema declares not
    null (``pa.field(name, type, nullable=False)``)."""
    return [field.name for field in schema if not field.nullable]


def _lacks(names: Sequence[str]) -> str:
    listed = ", ".join(repr(n) for n in names)
    return f"value lacks required field(s) {listed}: missing or null, and the schema declares them not null"


def _without_missing(table: pa.Table, schema: pa.Schema | None) -> Decoded:
    """The bulk read's rows, less those that lack a required field (rejected, each with its reason)."""
    required = required_fields(schema) if schema is not None else []
    nulls = {name: table.column(name).is_null().to_numpy(zero_copy_only=False) for name in required}
    if not any(flags.any() for flags in nulls.values()):
        return Decoded(table, list(range(table.num_rows)), [])
    lacking = np.logical_or.reduce(list(nulls.values()))
    rejected = [(int(i), _lacks([n for n in required if nulls[n][i]])) for i in np.flatnonzero(lacking)]
    kept = np.flatnonzero(~lacking)
    return Decoded(table.take(pa.array(kept)), kept.tolist(), rejected)


def _binary(value: bytes, at: int) -> str:
    """Why a value that is not text (not UTF-8, or a zero byte at ``at``)
    is no JSON record: what it starts with, where it stops being text, and
    what reads binary values."""
    start = value[:16].hex(" ")
    return (
        f"value is binary, not JSON text: {len(value)} bytes starting {start}{' ...' if len(value) > 16 else ''}, "
        f"not text at byte {at} ({value[at]:#04x}); an ingress of Avro values takes avro=SCHEMA"
    )


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


def encode_batches(
    table: pa.Table, max_bytes: int = MAX_BATCH_BYTES, max_decoded_bytes: int = DECODED_BATCH_BYTES
) -> list[bytes]:
    """``table`` as compressed Arrow IPC streams, in row order, each at most
    ``max_bytes``, and at most ``max_decoded_bytes`` once read (below any
    reader's cap, ``JobSettings.max_decoded_bytes``; a single row larger
    than either is one value of its own)."""
    out: list[bytes] = []

    def write(part: pa.Table) -> None:
        if part.nbytes > max_decoded_bytes and part.num_rows > 1:
            half = part.num_rows // 2
            write(part.slice(0, half))
            write(part.slice(half))
            return
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


def decode_records(records: pa.Table, reading: ChannelReading) -> Decoded:
    """Decode the values of ``records`` (Kafka records with ``value`` and
    ``headers`` columns) as ``reading`` says: JSON objects (or Avro), and
    Arrow IPC streams where the ``abs.fmt`` header says so (on an internal
    channel; on an ingress one such a record is rejected), each run in its
    own way, rows in record order."""
    arrow = pc.fill_null(pc.equal(header_values(records, FORMAT_HEADER), ARROW_FORMAT), False)
    values = records["value"].combine_chunks()
    if not pc.any(arrow).as_py():
        return decode(values, reading.schema)
    flags = arrow.to_numpy(zero_copy_only=False)
    bounds = [0, *np.flatnonzero(flags[1:] != flags[:-1]) + 1, len(flags)]
    parts: list[tuple[pa.Table, list[int]]] = []
    rejected: list[tuple[int, str]] = []
    for begin, end in zip(bounds[:-1], bounds[1:]):
        if not flags[begin]:
            run = decode(values.slice(begin, end - begin), reading.schema)
            parts.append((run.table, [begin + i for i in run.index]))
            rejected += [(begin + i, reason) for i, reason in run.rejected]
        elif reading.max_decoded_bytes is None:
            rejected += [(i, ARROW_ON_INGRESS) for i in range(begin, end)]
        else:
            for i in range(begin, end):
                batch = read_batch(values[i].as_py(), reading.max_decoded_bytes)
                if isinstance(batch, str):
                    rejected.append((i, batch))
                else:
                    parts.append((batch, [i] * batch.num_rows))
    if not parts:
        return Decoded(_empty(reading.schema), [], sorted(rejected))
    table, index, disagree = _combine(parts, "its rows do not fit the other records' columns")
    return Decoded(table, index, sorted(rejected + disagree))


def read_batch(value: bytes | None, max_decoded_bytes: int) -> pa.Table | str:
    """The table of one Arrow record, or why there is none."""
    try:
        return arrow_ipc.read(value, max_decoded_bytes)
    except arrow_ipc.OverCap as exc:
        return f"Arrow batch over the cap on decompressed bytes (max_decoded_bytes): {exc}"
    except Exception as exc:  # whatever reading it raised, this record alone is rejected
        return f"value is not a readable Arrow IPC stream: {type(exc).__name__}: {exc}"


def _combine(parts: list[tuple[pa.Table, list[int]]], why: str) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
    """``parts`` (each a table and the input index of each of its rows) as
    one table, the index of its rows, and the records rejected: none when
    the tables concatenate (types promoted as Arrow permits).  When they do
    not, the schema most records share is the one the others must fit;
    the records of a table that does not fit it are rejected with ``why``
    and the reason, the rest kept in order."""
    tables = [t for t, _ in parts if t.num_rows] or [parts[0][0]]
    index = [i for _, rows in parts for i in rows]
    try:
        together = pa.concat_tables(tables, promote_options="permissive")
    except Exception:  # tables that cannot be one: found one by one below
        pass
    else:
        if _valid(together):
            return together, index, []
        return _one_by_one(parts, why)
    shared: collections.Counter[pa.Schema] = collections.Counter()
    for table, rows in parts:
        shared[table.schema] += len(set(rows))
    schema = shared.most_common(1)[0][0]  # ties: the first seen
    for table, _ in parts:
        try:
            schema = pa.unify_schemas([schema, table.schema], promote_options="permissive")
        except Exception:  # rejected below
            pass
    kept: list[pa.Table] = []
    index = []
    rejected: list[tuple[int, str]] = []
    for table, rows in parts:
        try:
            kept.append(pa.concat_tables([schema.empty_table(), table], promote_options="permissive"))
        except Exception as exc:  # these records' rows cannot join the others'
            rejected += [(i, f"{why} ({_columns(schema)}): {type(exc).__name__}: {exc}") for i in sorted(set(rows))]
        else:
            index += rows
    combined = pa.concat_tables([schema.empty_table(), *kept], promote_options="permissive")
    if not _valid(combined):
        return _one_by_one(parts, why)
    return combined, index, rejected


def _valid(table: pa.Table) -> bool:
    """Whether ``table``'s arrays are whole: pyarrow 26 can promote nested lists of nulls
    (``[null, null]`` beside ``[1]``) to offsets past their values."""
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        return False
    return True


def _one_by_one(parts: list[tuple[pa.Table, list[int]]], why: str) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
    """``parts`` joined one at a time, each kept only when the table stays
    whole (``_valid``): the records of one that breaks it are rejected."""
    table: pa.Table | None = None
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for part, rows in parts:
        try:
            joined = part if table is None else pa.concat_tables([table, part], promote_options="permissive")
            ok = _valid(joined)
        except Exception:  # noqa: BLE001 - whatever Arrow makes of it, these records do not join the others
            ok = False
        if ok:
            table, index = joined, index + rows
        else:
            rejected += [(i, f"{why}: no Arrow type holds it beside the others whole") for i in sorted(set(rows))]
    return (table if table is not None else pa.table({})), index, rejected


def _columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)
