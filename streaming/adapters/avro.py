"""Avro record values on ingress topics.

An ingress given an Avro schema (``Ingress(..., avro=...)``) carries one Avro
record per Kafka record: the binary encoding of that schema, nothing before
it (what Spark's ``to_avro`` writes), or with ``confluent_wire=True`` after
the five bytes Confluent's serializers put first (a zero, then the schema
id).  The schema fixes the columns: ``AvroSchema.arrow`` is the Arrow schema
the rows have in Python, and Spark decodes the same records with ``from_avro``
and the same schema (``streaming.adapters.spark_stage``).

``decode`` reads values one by one with fastavro; a value that is not a
record of the schema is rejected with its reason, never dropped.  As with
Spark's ``from_avro``, bytes after a record are not read (a writer's schema
with fields added at the end reads as the ingress schema).  ``encode``
is the way in, for producers and tests."""

from __future__ import annotations

import io
import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.schema import SchemaParseException

from streaming.errors import ConfigError

__all__ = ["AvroSchema", "avro_schema", "decode", "encode", "WIRE_HEADER_BYTES"]

# Confluent's wire format: magic byte 0, then the schema id (4 bytes, big-endian)
WIRE_HEADER_BYTES = 5
_MAGIC = 0

_PRIMITIVES = {
    "string": pa.string(),
    "bytes": pa.binary(),
    "int": pa.int32(),
    "long": pa.int64(),
    "float": pa.float32(),
    "double": pa.float64(),
    "boolean": pa.bool_(),
}
_LOGICAL = {
    ("long", "timestamp-millis"): pa.timestamp("ms", tz="UTC"),
    ("long", "timestamp-micros"): pa.timestamp("us", tz="UTC"),
    ("int", "date"): pa.date32(),
}


@dataclass(frozen=True, slots=True)
class AvroSchema:
    """An ingress's Avro record schema: as JSON (what Spark's ``from_avro``
    takes), parsed by fastavro, and the Arrow schema of its rows; with
    ``confluent_wire`` its values start with Confluent's five bytes."""

    json: str
    arrow: pa.Schema
    confluent_wire: bool = False
    parsed: Any = field(default=None, compare=False, hash=False, repr=False)
    # the fields that are never null (not a union with null): Spark reads a value it cannot
    # decode as a row of nulls, so a null there says the value was not a record of the schema
    required: tuple[str, ...] = ()


def avro_schema(schema: str | Mapping[str, Any], *, confluent_wire: bool = False, what: str) -> AvroSchema:
    """``schema`` (an Avro record schema, as JSON text or a mapping) checked
    and mapped to Arrow; a ``ConfigError`` naming ``what`` otherwise."""
    try:
        loaded = json.loads(schema) if isinstance(schema, str) else json.loads(json.dumps(schema))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"{what}: the Avro schema is not JSON: {exc}") from exc
    if not isinstance(loaded, dict) or loaded.get("type") != "record":
        raise ConfigError(f'{what}: the Avro schema must be a record (a dict with "type": "record"), got {loaded!r}')
    try:
        parsed = fastavro.parse_schema(loaded)
    except (SchemaParseException, ValueError, TypeError, KeyError) as exc:
        raise ConfigError(f"{what}: the Avro schema does not parse: {exc}") from exc
    # columns may all be null, as those of JSON values are: the rest of a pipeline sees no difference
    fields = [pa.field(f["name"], _arrow_type(f["type"], f"{what}: field {f['name']!r}")[0]) for f in loaded["fields"]]
    required = tuple(f["name"] for f in loaded["fields"] if not _arrow_type(f["type"], what)[1])
    return AvroSchema(json.dumps(loaded, sort_keys=True), pa.schema(fields), bool(confluent_wire), parsed, required)


def _arrow_type(avro: Any, what: str) -> tuple[pa.DataType, bool]:
    """The Arrow type of an Avro type, and whether it may be null."""
    if isinstance(avro, list):  # a union: null and one other type
        others = [t for t in avro if t != "null"]
        if len(others) != 1:
            raise ConfigError(f'{what}: of unions only ["null", T] have a column type, got {avro!r}')
        return _arrow_type(others[0], what)[0], True
    if isinstance(avro, str):
        if avro not in _PRIMITIVES:
            raise ConfigError(f"{what}: Avro type {avro!r} has no column type (named types must be defined inline)")
        return _PRIMITIVES[avro], False
    kind, logical = avro.get("type"), avro.get("logicalType")
    if (kind, logical) in _LOGICAL:
        return _LOGICAL[(kind, logical)], False
    if logical == "decimal" and kind in ("bytes", "fixed"):
        return pa.decimal128(int(avro["precision"]), int(avro.get("scale", 0))), False
    if kind == "enum":
        return pa.string(), False
    if kind == "fixed":
        return pa.binary(), False
    if kind == "array":
        item, nullable = _arrow_type(avro["items"], what)
        return pa.list_(pa.field("element", item, nullable)), False
    if kind == "map":
        value, nullable = _arrow_type(avro["values"], what)
        return pa.map_(pa.string(), pa.field("value", value, nullable)), False
    if kind == "record":
        return pa.struct([pa.field(f["name"], *_arrow_type(f["type"], what)) for f in avro["fields"]]), False
    if isinstance(kind, str) and kind in _PRIMITIVES:
        return _PRIMITIVES[kind], False
    raise ConfigError(f"{what}: Avro type {avro!r} has no column type")


def decode(values: pa.Array, schema: AvroSchema) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
    """The rows of ``values`` (binary), the index of the value each came
    from, and ``(index, reason)`` for every value that is not a record of
    ``schema``."""
    rows: list[dict] = []
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for i, value in enumerate(values.to_pylist()):
        row, reason = _read(value, schema)
        if reason is None:
            rows.append(row)
            index.append(i)
        else:
            rejected.append((i, reason))
    try:
        table = pa.Table.from_pylist(rows, schema=schema.arrow)
    except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:  # fastavro checked the types
        raise ValueError(f"Avro rows that fastavro read do not fit {schema.arrow}: {exc}") from exc
    return table, index, rejected


def _read(value: bytes | None, schema: AvroSchema) -> tuple[dict | None, str | None]:
    if not value:
        return None, "record has no value"
    start = 0
    if schema.confluent_wire:
        if len(value) <= WIRE_HEADER_BYTES or value[0] != _MAGIC:
            return None, "value does not start with Confluent's wire header (a zero byte, then a 4-byte schema id)"
        start = WIRE_HEADER_BYTES
    stream = io.BytesIO(value)
    stream.seek(start)
    try:
        row = fastavro.schemaless_reader(stream, schema.parsed, None)
    except (EOFError, ValueError, IndexError, UnicodeDecodeError, OverflowError, TypeError) as exc:
        return None, f"value is not an Avro record of the ingress schema: {type(exc).__name__}: {exc}"
    return row, None  # as Spark's from_avro, bytes after the record are not read


def encode(rows: Iterable[Mapping[str, Any]], schema: AvroSchema, *, schema_id: int = 1) -> list[bytes]:
    """One Avro value per row (with Confluent's header and ``schema_id`` when
    the schema says its values carry one)."""
    out = []
    for row in rows:
        stream = io.BytesIO()
        if schema.confluent_wire:
            stream.write(bytes([_MAGIC]) + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(stream, schema.parsed, dict(row))
        out.append(stream.getvalue())
    return out
