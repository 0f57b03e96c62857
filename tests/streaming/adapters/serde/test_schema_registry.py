"""The schema registry of the local runtime (Apicurio, Confluent's API) and
what reads and writes through it: schemas registered and fetched by id; an
Avro ingress with ``registry=True`` read with each value's writer schema
resolved to the ingress schema, in Python and by Spark alike, values of an
unknown id or of a schema that does not resolve rejected with their reason;
a Kafka sink's Avro values registered under ``<topic>-value``; an
unreachable registry an error naming it and its bound.  And, without the
runtime, a registry that answers what no registry does (a small HTTP server
of the test's): each answer checked and bounded, and a writer schema that
lets a few bytes declare billions of items refused, the values naming
those a dead letter, never a task that fails or reads for ever."""

from __future__ import annotations

import base64
import http.client
import http.server
import json
import threading
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pyarrow as pa
import pytest

from barriers.messages import UNSIGNED
from streaming.adapters.serde import avro, codec, schema_registry
from streaming.adapters.serde.records import REASON, RECORD_SCHEMA, ROW, Part, part_of
from streaming.adapters.serde.schema_registry import (
    MAX_ANSWER_BYTES,
    MalformedAnswer,
    RegistryUnavailableError,
    SchemaRegistry,
    UnknownSchemaError,
    current_registry,
    registry_of,
    subject_of,
    use_registry,
)
from streaming.adapters.sinks.kafka import KafkaSink, kafka_records, read_kafka_output, registered_avro
from streaming.adapters.spark.stage import SparkStage
from streaming.api.avro_schema import avro_schema
from streaming.api.pipeline import Ingress, Sink, Stage
from streaming.errors import ConfigError

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


@pytest.mark.integration
def test_schemas_are_registered_once_and_fetched_by_id(registry_connection, unique_name):
    registry = registry_of(registry_connection)
    subject = subject_of(f"{unique_name}.readings")
    first = registry.register(subject, json.dumps(V1))
    assert registry.register(subject, json.dumps(V1)) == first
    second = registry.register(subject, json.dumps(V2))
    assert second != first
    fresh = registry_of(registry_connection)  # nothing cached: from the registry
    assert json.loads(fresh.schema(second))["fields"][3]["name"] == "site"
    assert fresh.ids(subject) == [first, second]
    assert fresh.ids(subject_of(f"{unique_name}.none")) == []
    with pytest.raises(UnknownSchemaError, match="schema id 987654 is not in the schema registry"):
        fresh.schema(987654)
    # the local registry answers only its user (another user of the machine: a 401), and only on a
    # loopback name (a page rebinding its name to 127.0.0.1: a 400); its health check stays open
    url = urllib.parse.urlparse(registry_connection.schema_registry)
    anyone = SchemaRegistry(registry_connection.schema_registry, bound_s=1)
    with pytest.raises(ConfigError, match="401"):
        anyone.ids(subject)
    password = Path(registry_connection.schema_registry_password_file).read_text().strip()
    for host, status in ((f"evil.example:{url.port}", 400), (f"localhost:{url.port}", 200)):
        connection = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
        token = base64.b64encode(f"{registry_connection.schema_registry_user}:{password}".encode()).decode()
        connection.request("GET", f"{url.path}/subjects", headers={"Host": host, "Authorization": f"Basic {token}"})
        assert connection.getresponse().status == status, host
        connection.close()
    with urllib.request.urlopen(f"http://{url.netloc}/health/ready", timeout=10) as health:
        assert health.status == 200


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
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


@pytest.mark.integration
def test_a_kafka_sink_writes_avro_registered_under_its_topic(registry_connection, unique_name, tmp_path):
    from streaming.adapters.kafka.admin import create_topic
    from streaming.adapters.objects import open_store

    topic = f"{unique_name}.out"
    create_topic(registry_connection.kafka, topic, 1)
    sink_spec = Sink("kafka", topic, avro=READER)
    registry = registry_of(registry_connection)
    sink = KafkaSink(
        open_store(str(tmp_path)),
        "out-0",
        kafka=registry_connection.kafka,
        topic=topic,
        transactional_id=f"t-{unique_name}",
        key=UNSIGNED,
    )
    try:
        rows = pa.table({"sensor": ["a", "b"], "value": [1, 2], "unit": ["C", "F"]})
        sink.stage(1, kafka_records(rows, "sensor", registered_avro(sink_spec, registry)))
        assert sink.commit(1)
    finally:
        sink.close()
    values = read_kafka_output(registry_connection.kafka, topic, key=UNSIGNED).values
    ids = registry.ids(subject_of(topic))
    assert len(ids) == 1 and all(v[0] == 0 and int.from_bytes(v[1:5], "big") == ids[0] for v in values)
    read_as = avro_schema(READER, confluent_wire=True, registry=True, subject=subject_of(topic), what=topic)
    decoded = codec.decode(values, read_as)
    assert decoded.table.to_pylist() == rows.to_pylist() and decoded.rejected == []
    with pytest.raises(Exception, match="not a record of the sink's Avro schema"):
        registered_avro(sink_spec, registry)(pa.table({"sensor": ["a"], "value": ["x"], "unit": ["C"]}))


# ---- a registry that answers what no registry does


class _Hostile(http.server.BaseHTTPRequestHandler):
    answers: dict[str, bytes] = {}
    redirects: dict[str, str] = {}
    authorizations: list[str | None] = []

    def do_GET(self):  # noqa: N802 - http.server's name
        self.authorizations.append(self.headers.get("Authorization"))
        if self.path in self.redirects:
            self.send_response(302)
            self.send_header("Location", self.redirects[self.path])
            self.end_headers()
            return
        body = self.answers.get(self.path)
        self.send_response(200 if body is not None else 404)
        self.end_headers()
        self.wfile.write(body or b"{}")

    def log_message(self, *args):
        pass


@pytest.fixture
def hostile():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hostile)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server, SchemaRegistry(f"http://127.0.0.1:{server.server_port}", bound_s=2.0)
    server.shutdown()


NULLS = {"type": "record", "name": "Many", "fields": [{"name": "xs", "type": {"type": "array", "items": "null"}}]}


@pytest.mark.parametrize(
    ("answer", "says"),
    [
        (b'{"id": 3}', r"has no schema \(str\)"),
        (b"[" * 100_000, "the answer is no JSON this client reads"),
        (b'{"schema": "' + b"x" * (MAX_ANSWER_BYTES + 1) + b'"}', "an answer over"),
        (json.dumps({"schema": json.dumps(NULLS)}).encode(), "has array<null> at xs"),
    ],
)
def test_a_schema_the_registry_answers_malformed_is_refused_with_the_reason(hostile, answer, says):
    server, registry = hostile
    _Hostile.answers = {"/schemas/ids/7": answer}
    with pytest.raises(MalformedAnswer, match=says):
        registry.parsed(7)


def test_a_redirect_to_another_host_is_refused_and_one_on_the_registry_followed(hostile):
    server, registry = hostile
    schema = json.dumps({"schema": json.dumps(V1)}).encode()
    port = server.server_port
    _Hostile.answers = {"/schemas/ids/8": schema}
    _Hostile.redirects = {
        "/schemas/ids/7": f"http://127.0.0.2:{port}/schemas/ids/8",  # another host, the same server behind it
        "/schemas/ids/9": "/schemas/ids/8",
    }
    try:
        with pytest.raises(ConfigError, match=r"redirected \(HTTP 302\) to http://127.0.0.2:\d+/schemas/ids/8"):
            registry.parsed(7)
        assert registry.parsed(9)["name"] == "Reading"
    finally:
        _Hostile.redirects = {}


def test_credentials_go_with_every_request_and_never_in_clear_off_loopback(hostile, tmp_path):
    server, _ = hostile
    password = tmp_path / "registry.password"
    password.write_text("s3cret\n")
    password.chmod(0o600)
    environ = {
        "SPARK_ABS_SCHEMA_REGISTRY_USER": "reader",
        "SPARK_ABS_SCHEMA_REGISTRY_PASSWORD_FILE": str(password),
    }
    registry = use_registry(f"http://127.0.0.1:{server.server_port}", environ)
    _Hostile.answers = {"/schemas/ids/8": json.dumps({"schema": json.dumps(V1)}).encode()}
    _Hostile.authorizations = []
    try:
        registry.parsed(8)
        assert _Hostile.authorizations == ["Basic cmVhZGVyOnMzY3JldA=="]  # reader:s3cret
        assert "s3cret" not in repr(registry)
        with pytest.raises(ConfigError, match="in clear over http://; give its https:// URL"):
            SchemaRegistry("http://registry.example:8080", username="reader", password="s3cret")
        with pytest.raises(ConfigError, match="set SPARK_ABS_SCHEMA_REGISTRY_PASSWORD_FILE too"):
            use_registry("http://127.0.0.1:1", {"SPARK_ABS_SCHEMA_REGISTRY_USER": "reader"})
    finally:
        use_registry(None)


def test_versions_that_are_not_numbers_and_versions_without_an_id_are_refused(hostile):
    server, registry = hostile
    _Hostile.answers = {"/subjects/s-value/versions": b'["1"]'}
    with pytest.raises(MalformedAnswer, match="not a list of numbers"):
        registry.ids("s-value")
    _Hostile.answers = {"/subjects/s-value/versions": b"[1]", "/subjects/s-value/versions/1": b'{"schema": "{}"}'}
    with pytest.raises(MalformedAnswer, match="has no id"):
        registry.ids("s-value")


def test_a_value_of_a_writer_schema_of_items_of_no_bytes_is_a_dead_letter_not_a_read_for_ever(hostile, monkeypatch):
    server, registry = hostile
    nulls = json.dumps({"schema": json.dumps(NULLS)}).encode()
    _Hostile.answers = {
        "/subjects/t-value/versions": b"[1]",
        "/subjects/t-value/versions/1": json.dumps({"id": 9, "schema": json.dumps(NULLS)}).encode(),
        "/schemas/ids/9": nulls,
    }
    shape = {"type": "record", "name": "Many", "fields": [{"name": "n", "type": "long", "default": 0}]}
    reader = avro_schema(shape, confluent_wire=True, registry=True, subject="t-value", what="t")
    # 2^62 items declared in ten bytes (a zigzag long), then nothing
    value = b"\x00" + (9).to_bytes(4, "big") + b"\x80\x80\x80\x80\x80\x80\x80\x80\x80\x01"
    # the process's registry for the decoder, until the test ends (then the session's, credentials and all)
    monkeypatch.setattr(schema_registry, "_current", registry)
    table, index, rejected = avro.decode(pa.array([value], pa.binary()), reader)
    assert table.num_rows == 0 and index == []
    [(at, reason)] = rejected
    assert at == 0
    assert "array<null> at xs" in reason
