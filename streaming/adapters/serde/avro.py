"""Avro record values on ingress topics.

An ingress given an Avro schema (``Ingress(..., avro=...)``) carries one Avro
record per Kafka record: the binary encoding of that schema, nothing before
it (what Spark's ``to_avro`` writes), or with ``confluent_wire=True`` after
the five bytes Confluent's serializers put first (a zero, then the schema
id).  The schema fixes the columns: ``AvroSchema.arrow`` is the Arrow schema
the rows have in Python, and Spark decodes the same records with ``from_avro``
and the same schema (``streaming.adapters.spark.stage``).

With ``registry`` (``Ingress(..., registry=True)``) the schema id names the
schema the value was written with, a version of the topic's subject
(``<topic>-value``): it is fetched from the schema registry
this process uses (``streaming.adapters.serde.schema_registry``) and the value read with
it as the writer's schema and the ingress schema as the reader's, by Avro's
resolution rules (fields added with defaults, fields dropped, types widened).

``decode`` reads values one by one with fastavro; a value that is not a
record of the schema is rejected with its reason, never dropped.  As with
Spark's ``from_avro``, bytes after a record are not read (a writer's schema
with fields added at the end reads as the ingress schema).  ``encode``
is the way in, for producers and tests."""

from __future__ import annotations

import io
from collections.abc import Iterable, Mapping
from typing import Any, cast

import fastavro
import pyarrow as pa

from streaming.adapters.serde import schema_registry
from streaming.api.avro_schema import MAGIC, WIRE_HEADER_BYTES, AvroSchema, avro_schema
from streaming.errors import ConfigError

__all__ = ["AvroSchema", "avro_schema", "decode", "encode", "WIRE_HEADER_BYTES"]


def decode(values: pa.Array, schema: AvroSchema) -> tuple[pa.Table, list[int], list[tuple[int, str]]]:
    """The rows of ``values`` (binary), the index of the value each came
    from, and ``(index, reason)`` for every value that is not a record of
    ``schema``."""
    rows: list[dict[str, Any]] = []
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for i, value in enumerate(values.to_pylist()):
        row = _read(value, schema)
        if isinstance(row, str):
            rejected.append((i, row))
        else:
            rows.append(row)
            index.append(i)
    try:
        return pa.Table.from_pylist(rows, schema=schema.arrow), index, rejected
    except Exception:  # fastavro checked the types; a row Arrow cannot hold is found below
        pass
    kept: list[dict[str, Any]] = []
    kept_index: list[int] = []
    for i, row in zip(index, rows):
        try:
            pa.Table.from_pylist([row], schema=schema.arrow)
        except Exception as exc:  # this record alone is rejected
            rejected.append((i, f"value read as Avro does not fit the columns {schema.arrow}: {exc}"))
        else:
            kept.append(row)
            kept_index.append(i)
    return pa.Table.from_pylist(kept, schema=schema.arrow), kept_index, sorted(rejected)


def _read(value: bytes | None, schema: AvroSchema) -> dict[str, Any] | str:
    """The record in ``value``, or why there is none."""
    if not value:
        return "record has no value"
    start = 0
    if schema.confluent_wire:
        if len(value) <= WIRE_HEADER_BYTES or value[0] != MAGIC:
            return "value does not start with Confluent's wire header (a zero byte, then a 4-byte schema id)"
        start = WIRE_HEADER_BYTES
    stream = io.BytesIO(value)
    stream.seek(start)
    writer, written_as = schema.parsed, "the ingress schema"
    if schema.registry:
        schema_id = int.from_bytes(value[1:WIRE_HEADER_BYTES], "big")
        registry = schema_registry.current_registry("an ingress with registry=True")
        try:
            writer = registry.writer(schema_id, schema.subject)
        except schema_registry.UnknownSchemaError as exc:
            return f"value names schema id {schema_id}: {exc}"
        except (ValueError, ConfigError) as exc:  # not Avro, or the registry refused to say (an outage is raised)
            return f"value names schema id {schema_id}, which cannot be read with: {exc}"
        written_as = f"writer schema id {schema_id}"
    try:
        row = fastavro.schemaless_reader(stream, writer, schema.parsed if schema.registry else None)
    except Exception as exc:  # whatever fastavro raised, the value is not a record of it
        if schema.registry:
            return (
                f"value is not an Avro record of {written_as}, or that schema does not resolve to the "
                f"ingress schema: {type(exc).__name__}: {exc}"
            )
        return f"value is not an Avro record of the ingress schema: {type(exc).__name__}: {exc}"
    # a record schema reads a dict (avro_schema takes no other); as Spark's from_avro,
    # bytes after the record are not read
    return cast(dict[str, Any], row)


def encode(rows: Iterable[Mapping[str, Any]], schema: AvroSchema, *, schema_id: int = 1) -> list[bytes]:
    """One Avro value per row (with Confluent's header and ``schema_id`` when
    the schema says its values carry one)."""
    out = []
    for row in rows:
        stream = io.BytesIO()
        if schema.confluent_wire:
            stream.write(bytes([MAGIC]) + schema_id.to_bytes(4, "big"))
        fastavro.schemaless_writer(stream, schema.parsed, dict(row))
        out.append(stream.getvalue())
    return out
