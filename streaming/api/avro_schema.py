"""Avro record schemas of ingress topics (``Ingress(..., avro=...)``):
checked when the pipeline is built and mapped to the Arrow columns of their
rows.  Reading and writing the values is ``streaming.adapters.serde.avro``'s."""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import fastavro
import pyarrow as pa
from fastavro.schema import SchemaParseException

from streaming.errors import ConfigError

__all__ = ["AvroSchema", "avro_schema", "subject_of", "WIRE_HEADER_BYTES", "MAGIC"]

# Confluent's wire format: magic byte 0, then the schema id (4 bytes, big-endian)
WIRE_HEADER_BYTES = 5
MAGIC = 0

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
    ``confluent_wire`` its values start with Confluent's five bytes, and
    with ``registry`` the schema id in them names the schema each value was
    written with, looked up in the schema registry and resolved to this one
    (the reader's schema) by Avro's rules."""

    json: str
    arrow: pa.Schema
    confluent_wire: bool = False
    parsed: Any = field(default=None, compare=False, hash=False, repr=False)
    # the fields that are never null (not a union with null): Spark reads a value it cannot
    # decode as a row of nulls, so a null there says the value was not a record of the schema
    required: tuple[str, ...] = ()
    registry: bool = False
    # with registry: the subject whose versions the values' ids must be (``<topic>-value``)
    subject: str = ""


def subject_of(topic: str) -> str:
    """The subject of ``topic``'s values in a schema registry (Confluent's ``TopicNameStrategy``)."""
    return f"{topic}-value"


def avro_schema(
    schema: str | Mapping[str, Any],
    *,
    confluent_wire: bool = False,
    registry: bool = False,
    subject: str = "",
    what: str,
) -> AvroSchema:
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
    typed = {f["name"]: _arrow_type(f["type"], f"{what}: field {f['name']!r}") for f in loaded["fields"]}
    # columns may all be null, as those of JSON values are: the rest of a pipeline sees no difference
    arrow = pa.schema([pa.field(name, kind) for name, (kind, _) in typed.items()])
    required = tuple(name for name, (_, nullable) in typed.items() if not nullable)
    if registry and not confluent_wire:
        raise ConfigError(
            f"{what}: registry=True reads the schema id of Confluent's wire format: set confluent_wire too"
        )
    if registry and not subject:
        raise ConfigError(f"{what}: registry=True reads ids of one subject's versions: name the subject")
    return AvroSchema(
        json.dumps(loaded, sort_keys=True), arrow, bool(confluent_wire), parsed, required, bool(registry), subject
    )


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
