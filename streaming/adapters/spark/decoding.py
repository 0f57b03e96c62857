"""How a stage of Spark code reads its input records in Spark, before its
code: an ingress topic's values decoded with its schema (``from_json``, or
``from_avro`` for an Avro ingress, by each value's registered writer schema
with ``registry=True``) and its event time computed; and why a record
Spark could not decode is no row, said as Python's decoder says it (the
reason its dead letter carries).  Other stages' Arrow batches are read by
``spark_abs.Runs`` (``streaming.adapters.spark.stage``)."""

from __future__ import annotations

import dataclasses
import functools
import logging
from collections.abc import Callable, Collection, Mapping
from operator import and_, or_
from typing import cast

import pyarrow as pa
from pyspark.errors import PySparkException
from pyspark.sql import Column
from pyspark.sql import functions as F
from pyspark.sql.avro.functions import from_avro
from pyspark.sql.pandas.types import from_arrow_schema
from pyspark.sql.types import IntegerType, LongType, StringType, StructField, StructType, TimestampType

from streaming.adapters.serde import codec
from streaming.adapters.serde.avro import WIRE_HEADER_BYTES, AvroSchema
from streaming.adapters.serde.schema_registry import (
    MalformedAnswer,
    RegistryUnavailableError,
    current_registry,
    subject_of,
)
from streaming.api.pipeline import Ingress
from streaming.errors import ConfigError

__all__ = ["CORRUPT", "DECODED", "SparkDecoding", "StageRows", "arrow_reasons", "ingress_reasons", "resolved_avro"]

log = logging.getLogger(__name__)

# the column of a record's value decoded, and the field of a JSON value Spark could not read
DECODED = "_abs_decoded"
CORRUPT = "_abs_corrupt"


@dataclasses.dataclass(frozen=True)
class StageRows:
    """What Spark code after other stages reads: the Arrow batches of their
    output topics, rows of ``schema``, each value read within
    ``max_decoded_bytes`` of Arrow memory."""

    names: tuple[str, ...]
    schema: pa.Schema
    max_decoded_bytes: int


class SparkDecoding:
    """How stage ``stage`` reads ``source`` (an ingress topic, or other
    stages' rows) in Spark: its ``fields``, the value ``decode``-d and
    whether it did not (``undecoded``), its ``event_time`` (None: none, or
    not computed in Spark), the Arrow cap of other stages' batches
    (``arrow_cap``, None for an ingress), and ``reasons``: why each of the
    values Spark could not read is no row."""

    def __init__(self, stage: str, source: Ingress | StageRows, reserved: Collection[str]):
        self.stage = stage
        what = (
            f"the schema of {source.topic}" if isinstance(source, Ingress) else f"the rows of {', '.join(source.names)}"
        )
        try:
            self.fields = from_arrow_schema(source.schema)
        except (TypeError, PySparkException) as exc:
            raise ConfigError(f"stage {stage}: {what} has no Spark equivalent: {exc}") from exc
        clash = sorted({*reserved, CORRUPT} & set(self.fields.names))
        if clash:
            raise ConfigError(f"stage {stage}: {what} uses names Spark stages keep for themselves: {clash}")
        self._json = StructType([*self.fields.fields, StructField(CORRUPT, StringType())])
        self._required = codec.required_fields(source.schema)  # JSON: a record without one is no row
        self.reasons: Callable[[pa.ChunkedArray], list[str]]
        # registry=True: the writer schema ids of the topic's subject the plan decodes
        self.writer_ids: list[int] = []
        if isinstance(source, StageRows):
            # Arrow batches of other stages, read by spark_abs.Runs within this many bytes
            self.arrow_cap: int | None = source.max_decoded_bytes
            self.avro: AvroSchema | None = None
            self.subject = ""
            self.reasons = functools.partial(
                arrow_reasons, schema=source.schema, max_decoded_bytes=source.max_decoded_bytes
            )
            self.event_time: Column | None = None
        else:
            self.arrow_cap = None
            # Ingress parsed avro= into an AvroSchema when it was made
            self.avro = cast(AvroSchema | None, source.avro)
            self.subject = subject_of(source.topic)
            # how the Python decoder reads the values, for the reason a record did not decode
            self.reasons = functools.partial(ingress_reasons, schema=source.value_schema)
            self.event_time = self._event_time(source)

    @property
    def registered(self) -> bool:
        """Whether values name their writer schema in the registry (``registry=True``)."""
        return self.avro is not None and self.avro.registry

    def _event_time(self, ingress: Ingress) -> Column | None:
        """The records' event time in milliseconds, as Spark computes it."""
        if ingress.event_time is None:
            return None
        field = next((f for f in self.fields.fields if f.name == ingress.event_time), None)
        if field is None:
            raise ConfigError(f"ingress {ingress.topic}: event_time {ingress.event_time!r} is not in its schema")
        column = F.col(f"{DECODED}.{ingress.event_time}")
        if isinstance(field.dataType, TimestampType):
            return F.unix_millis(column)
        if isinstance(field.dataType, (IntegerType, LongType)):
            return column.cast(LongType())
        raise ConfigError(
            f"ingress {ingress.topic}: event_time {ingress.event_time!r} is {field.dataType.simpleString()}; "
            "Spark stages read event time from a timestamp or whole milliseconds"
        )

    def decode(self) -> Column:
        """A record's value decoded with the ingress schema: a struct, null
        where the value is not a record of it (JSON with ``CORRUPT`` set).
        With ``registry=True``, each value with the writer schema its id
        names (one of the subject's), resolved to the ingress schema by
        Spark's ``from_avro`` (its ``avroSchema`` option)."""
        value = F.col("value")
        if self.avro is None:
            return F.from_json(
                value.cast("string"), self._json, {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}
            )
        if not self.avro.confluent_wire:
            return from_avro(value, self.avro.json, {"mode": "PERMISSIVE"})
        framed = (F.length(value) > WIRE_HEADER_BYTES) & (F.substring(value, 1, 1) == F.lit(b"\x00"))
        body = F.expr(f"substring(value, {WIRE_HEADER_BYTES + 1})")
        if not self.avro.registry:
            return F.when(framed, from_avro(body, self.avro.json, {"mode": "PERMISSIVE"}))
        return F.when(framed, resolved_avro(body, F.expr("substring(value, 2, 4)"), self.writers(), self.avro.json))

    def writers(self) -> dict[int, str]:
        if not self.writer_ids:
            return {}
        registry = current_registry(f"stage {self.stage}")
        return {schema_id: registry.schema(schema_id) for schema_id in self.writer_ids}

    def undecoded(self) -> Column:
        """Whether a record's value did not decode: JSON that Spark's reader
        marks corrupt or that lacks a field the schema declares not null;
        Avro that Spark read as a row of nulls (what ``from_avro`` gives for
        a value it cannot read) where a field is never null, or with every
        field null when the schema has no such field."""
        decoded = F.col(DECODED)
        if self.avro is None:
            # a field the schema declares not null, missing or null: Python's decoder says so (codec._lacks)
            lacking = [F.col(f"{DECODED}.{name}").isNull() for name in self._required]
            return functools.reduce(or_, lacking, decoded.isNull() | F.col(f"{DECODED}.{CORRUPT}").isNotNull())
        names, combine = (self.avro.required, or_) if self.avro.required else (self.fields.names, and_)
        return decoded.isNull() | functools.reduce(combine, [F.col(f"{DECODED}.{name}").isNull() for name in names])

    def new_writers(self) -> list[int] | None:
        """With ``registry=True``: the writer schema ids of the topic's
        subject (those that are not Avro left out) when they are not the
        ones ``writer_ids`` decodes, else None.  A registry that does not
        answer within 5 s gives None: values of the writers decoded go on,
        any other is read in Python, which waits for it."""
        registry = current_registry(f"stage {self.stage}")
        try:
            ids = registry.ids(self.subject, bound_s=5.0)
        except (RegistryUnavailableError, MalformedAnswer) as exc:
            log.warning("stage %s: writer schemas of %s not refreshed: %s", self.stage, self.subject, exc)
            return None
        readable = []
        for schema_id in ids:
            try:
                registry.parsed(schema_id)
            except ValueError as exc:
                log.warning("stage %s: %s: left out of the plan: %s", self.stage, self.subject, exc)
                continue
            readable.append(schema_id)
        return None if readable == self.writer_ids else readable


def resolved_avro(body: Column, schema_id: Column, writers: Mapping[int, str], reader: str) -> Column:
    """Avro values ``body`` decoded with the writer schema their ``schema_id``
    (4 bytes, big-endian) names among ``writers`` and resolved to ``reader``
    (``from_avro``'s ``avroSchema``); null for an id not among them."""
    as_number = F.conv(F.hex(schema_id), 16, 10).cast("long")
    options = {"mode": "PERMISSIVE", "avroSchema": reader}
    # no writer yet: the reader's shape, for no value
    decoded = F.when(F.lit(False), from_avro(body, reader, {"mode": "PERMISSIVE"}))
    for number, writer in sorted(writers.items()):
        decoded = decoded.when(as_number == number, from_avro(body, writer, options))
    return decoded


def ingress_reasons(values: pa.ChunkedArray, schema: codec.ValueSchema) -> list[str]:
    """Why each of ``values`` could not be a row: the Python decoder's
    reason, or Spark's refusal where that decoder would have taken it."""
    if len(values) == 0:
        return []
    said = dict(codec.decode(values, schema).rejected)
    reader, columns = ("Avro", schema.arrow) if isinstance(schema, AvroSchema) else ("JSON", schema)
    spark = f"Spark's {reader} reader could not read the value with the ingress schema ({_arrow_columns(columns)})"
    return [said.get(i, spark) for i in range(len(values))]


def arrow_reasons(values: pa.ChunkedArray, schema: pa.Schema, max_decoded_bytes: int) -> list[str]:
    """Why each of ``values`` (Arrow batches Spark could not read) is no
    rows: Python's reader's reason, or what its columns lack."""
    said = []
    for value in values.to_pylist():
        read = codec.read_batch(value, max_decoded_bytes)
        if isinstance(read, str):
            said.append(read)
            continue
        missing = [f"{f.name} {f.type}" for f in schema if f.name not in read.column_names]
        other = [
            f"{f.name} is {read.schema.field(f.name).type}, not {f.type}"
            for f in schema
            if f.name in read.column_names and not _same_in_spark(read.schema.field(f.name).type, f.type)
        ]
        said.append(
            "Spark could not read the Arrow batch as the rows of the stage's input ("
            + "; ".join([*(["no column " + ", ".join(missing)] if missing else []), *other] or ["its columns"])
            + ")"
        )
    return said


def _same_in_spark(found: pa.DataType, wanted: pa.DataType) -> bool:
    if pa.types.is_timestamp(found) and pa.types.is_timestamp(wanted):
        return True  # read in any unit
    return found == wanted


def _arrow_columns(schema: pa.Schema) -> str:
    return ", ".join(f"{f.name} {f.type}" for f in schema)
