"""The schema registry of the local runtime (Apicurio, Confluent's API) and
what reads and writes through it: schemas registered and fetched by id; an
Avro ingress with ``registry=True`` read with each value's writer schema
resolved to the ingress schema, in Python and by Spark alike, values of an
unknown id or of a schema that does not resolve rejected with their reason;
a Kafka sink's Avro values registered under ``<topic>-value``; an
unreachable registry an error naming it and its bound."""

from __future__ import annotations

import json
import time

import pyarrow as pa
import pytest

from streaming.adapters.serde import avro, codec
from streaming.adapters.serde.records import REASON, RECORD_SCHEMA, ROW, Part, part_of
from streaming.adapters.serde.schema_registry import (
    RegistryUnavailableError,
    SchemaRegistry,
    UnknownSchemaError,
    current_registry,
    subject_of,
)
from streaming.adapters.sinks.kafka import KafkaSink, kafka_records, read_kafka_output, registered_avro
from streaming.adapters.spark.stage import SparkStage
from streaming.api.avro_schema import avro_schema
from streaming.api.pipeline import Ingress, Sink, Stage
from streaming.errors import ConfigError

pytestmark = pytest.mark.integration

READER = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "long"},
        {"name": "unit", "type": "string", "default": "C"},
    ],
}
# the first producer: value an int, no unit
V1 = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "sensor", "type": "string"}, {"name": "value", "type": "int"}],
}
# the next: a unit, and a field the reader does not know
V2 = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "sensor", "type": "string"},
        {"name": "value", "type": "long"},
        {"name": "unit", "type": "string"},
        {"name": "site", "type": ["null", "string"], "default": None},
    ],
}
# does not resolve: value a string
BAD = {
    "type": "record",
    "name": "Reading",
    "fields": [{"name": "sensor", "type": "string"}, {"name": "value", "type": "string"}],
}


def _written(topic: str, registry: SchemaRegistry, rows: list[tuple[dict, dict]]) -> list[bytes]:
    """Each row as its producer wrote it: Confluent's header with its schema's id, then the record."""
    out = []
    for schema, row in rows:
        parsed = avro_schema(schema, confluent_wire=True, what=topic)
        out += avro.encode([row], parsed, schema_id=registry.register(subject_of(topic), parsed.json))
    return out


def test_schemas_are_registered_once_and_fetched_by_id(registry_connection, unique_name):
    registry = SchemaRegistry(registry_connection.schema_registry)
    subject = subject_of(f"{unique_name}.readings")
    first = registry.register(subject, json.dumps(V1))
    assert registry.register(subject, json.dumps(V1)) == first
    second = registry.register(subject, json.dumps(V2))
    assert second != first
    fresh = SchemaRegistry(registry_connection.schema_registry)  # nothing cached: from the registry
    assert json.loads(fresh.schema(second))["fields"][3]["name"] == "site"
    assert fresh.ids(subject) == [first, second]
    assert fresh.ids(subject_of(f"{unique_name}.none")) == []
    with pytest.raises(UnknownSchemaError, match="schema id 987654 is not in the schema registry"):
        fresh.schema(987654)


def test_an_unreachable_registry_is_an_error_naming_it_and_its_bound():
    from streaming.local.processes import free_port

    url = f"http://127.0.0.1:{free_port()}/apis/ccompat/v7"
    started = time.monotonic()
    with pytest.raises(RegistryUnavailableError, match=rf"{url}.*within 2 s"):
        SchemaRegistry(url, bound_s=2).schema(1)
    assert time.monotonic() - started < 15


def _records(values: list[bytes]) -> pa.Table:
    return pa.Table.from_pylist(
        [
            {"topic": "r", "partition": 0, "offset": i, "key": None, "value": v, "headers": [], "timestamp": None}
            for i, v in enumerate(values)
        ],
        schema=RECORD_SCHEMA,
    )


def test_an_evolving_producer_is_read_with_the_ingress_schema_in_python_and_by_spark_alike(
    registry_connection, spark, unique_name
):
    registry = current_registry("the test")  # the session's: the local runtime's registry
    topic = f"{unique_name}.readings"
    values = _written(
        topic,
        registry,
        [
            (V1, {"sensor": "a", "value": 1}),
            (V2, {"sensor": "b", "value": 2, "unit": "F", "site": "x"}),
            (BAD, {"sensor": "c", "value": "three"}),
        ],
    )
    values.append(b"\x00\x00\x0f\x12\x06" + values[0][5:])  # an id the registry does not have
    # a version of the subject that is not Avro (a registry keeps JSON Schema too)
    json_schema = registry._request(
        "POST",
        f"/subjects/{subject_of(topic)}/versions",
        body={
            "schema": json.dumps(
                {
                    "$schema": "http://json-schema.org/draft-07/schema#",
                    "type": "object",
                    "properties": {"sensor": {"type": "string"}},
                }
            ),
            "schemaType": "JSON",
        },
    )["id"]
    values.append(b"\x00" + int(json_schema).to_bytes(4, "big") + values[0][5:])
    # an Avro schema of another subject
    other = {**V1, "doc": "the same fields, registered under another subject only"}
    elsewhere = _written(f"{topic}-other", registry, [(other, {"sensor": "e", "value": 5})])[0]
    values.append(elsewhere)
    ingress = Ingress(topic, 1, avro=READER, confluent_wire=True, registry=True)
    rows = [{"sensor": "a", "value": 1, "unit": "C"}, {"sensor": "b", "value": 2, "unit": "F"}]
    python = codec.decode(values, ingress.avro)
    assert python.table.to_pylist() == rows and python.index == [0, 1]
    reasons = dict(python.rejected)
    assert "does not resolve to the ingress schema" in reasons[2]
    assert reasons[3] == (
        f"value names schema id 987654: schema id 987654 is not a version of subject {topic}-value "
        f"in the schema registry at {registry.url}"
    )
    assert reasons[4].startswith(f"value names schema id {json_schema}, which cannot be read with:")
    assert "is not a version of subject" in reasons[5]
    # Spark reads the same values with each writer's schema and from_avro's resolution
    stage = SparkStage(
        spark, Stage("clean", (topic,), spark="SELECT _position, sensor, value, unit FROM {input}"), ingress
    )
    prepared = stage.records(_records(values))
    spark_rows = part_of(prepared, Part.ROW)
    assert sorted(spark_rows[ROW].to_pylist(), key=lambda r: r["sensor"]) == rows
    rejected = part_of(prepared, Part.REJECTED)
    assert dict(zip(rejected["offset"].to_pylist(), rejected[REASON].to_pylist())) == reasons


def test_an_ingress_that_reads_by_id_needs_the_wire_format_and_a_registry():
    from streaming.adapters.serde.schema_registry import check_registry
    from streaming.api.pipeline import Pipeline

    reads = Pipeline(
        "j",
        (Ingress("j.r", 1, avro=READER, confluent_wire=True, registry=True),),
        (Stage("s", ("j.r",), spark="SELECT * FROM {input}", sink=Sink()),),
    )
    with pytest.raises(ConfigError, match="ingress j.r of job j use a schema registry.*SPARK_ABS_SCHEMA_REGISTRY"):
        check_registry(reads, "")
    check_registry(reads, "http://127.0.0.1:1/apis/ccompat/v7")
    with pytest.raises(ConfigError, match="set confluent_wire too"):
        Ingress("t", 1, avro=READER, registry=True)
    with pytest.raises(ConfigError, match="give the Avro schema too"):
        Ingress("t", 1, registry=True)
    with pytest.raises(ConfigError, match="only a kafka sink writes Avro"):
        Sink("delta", avro=READER)


def test_a_kafka_sink_writes_avro_registered_under_its_topic(registry_connection, unique_name, tmp_path):
    from streaming.adapters.kafka.admin import create_topic
    from streaming.adapters.objects import open_store

    topic = f"{unique_name}.out"
    create_topic(registry_connection.kafka, topic, 1)
    sink_spec = Sink("kafka", topic, avro=READER)
    registry = SchemaRegistry(registry_connection.schema_registry)
    sink = KafkaSink(
        open_store(str(tmp_path)),
        "out-0",
        kafka=registry_connection.kafka,
        topic=topic,
        transactional_id=f"t-{unique_name}",
    )
    try:
        rows = pa.table({"sensor": ["a", "b"], "value": [1, 2], "unit": ["C", "F"]})
        sink.stage(1, kafka_records(rows, "sensor", registered_avro(sink_spec, registry)))
        assert sink.commit(1)
    finally:
        sink.close()
    values = read_kafka_output(registry_connection.kafka, topic).values
    ids = registry.ids(subject_of(topic))
    assert len(ids) == 1 and all(v[0] == 0 and int.from_bytes(v[1:5], "big") == ids[0] for v in values)
    read_as = avro_schema(READER, confluent_wire=True, registry=True, subject=subject_of(topic), what=topic)
    decoded = codec.decode(values, read_as)
    assert decoded.table.to_pylist() == rows.to_pylist() and decoded.rejected == []
    with pytest.raises(Exception, match="not a record of the sink's Avro schema"):
        registered_avro(sink_spec, registry)(pa.table({"sensor": ["a"], "value": ["x"], "unit": ["C"]}))
