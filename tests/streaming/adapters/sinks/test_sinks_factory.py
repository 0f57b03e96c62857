"""The sinks' factory without services: where a job's sinks keep their
epochs (``sink_location``, on a local store and on S3), where each sink
family makes its output visible (``sink_place``), which sink ``open_sink``
opens for each family and with what (a Kafka sink's construction, which
reaches the broker, is replaced by a recorder), and the errors of a sink
kind, a store or a table that names no family there is."""

from __future__ import annotations

import pyarrow.fs as pafs
import pytest

from barriers.messages import UNSIGNED
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S
from streaming.adapters.objects import open_store
from streaming.adapters.sinks import factory
from streaming.adapters.sinks.delta import DeltaSink
from streaming.adapters.sinks.factory import open_sink, sink_location, sink_place
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.api.config import Connection, KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink
from streaming.api.settings import JobSettings
from streaming.errors import ConfigError

CONNECTION = Connection(KafkaAccess("127.0.0.1:9"), "http://127.0.0.1:9", "key", "secret", "bucket")
KAFKA = KafkaAccess("127.0.0.1:9")
AVRO = {"type": "record", "name": "Out", "fields": [{"name": "k", "type": "string"}]}


def _local(tmp_path) -> JobSettings:
    return JobSettings(store=str(tmp_path / "store"))


def _on_s3() -> JobSettings:
    return JobSettings(store="s3://bucket/jobs")


class _KafkaSinkRecorder:
    """Stands for ``KafkaSink``, whose construction reaches the broker: keeps what it was given."""

    def __init__(self, location, task, **kwargs):
        self.location = location
        self.task = task
        self.kwargs = kwargs


@pytest.fixture
def kafka_sinks(monkeypatch) -> type[_KafkaSinkRecorder]:
    monkeypatch.setattr(factory, "KafkaSink", _KafkaSinkRecorder)
    return _KafkaSinkRecorder


# -- sink_location ----------------------------------------------------------------


def test_a_local_store_keeps_a_job_s_sink_under_store_job_sink(tmp_path):
    location = sink_location(_local(tmp_path), "orders", None)
    root = (tmp_path / "store" / "orders" / "sink").resolve()
    assert location.uri == f"file://{root}"
    assert location.root == str(root)
    assert isinstance(location.filesystem, pafs.LocalFileSystem)
    assert root.is_dir()  # made on first use


def test_a_store_s_trailing_slash_makes_no_empty_segment(tmp_path):
    location = sink_location(JobSettings(store=f"file://{tmp_path}/store/"), "orders", None)
    assert location.uri == f"file://{(tmp_path / 'store' / 'orders' / 'sink').resolve()}"


def test_an_s3_store_keeps_a_job_s_sink_on_the_connection_s_server():
    location = sink_location(_on_s3(), "orders", CONNECTION)
    assert location.uri == "s3://bucket/jobs/orders/sink"
    assert location.root == "bucket/jobs/orders/sink"
    assert isinstance(location.filesystem, pafs.S3FileSystem)


def test_an_s3_store_without_a_connection_is_a_clear_error():
    with pytest.raises(ConfigError, match="is on S3 but no S3 connection is configured"):
        sink_location(_on_s3(), "orders", None)


def test_a_store_of_an_unknown_scheme_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"unsupported scheme 'gs' \(use file:// or s3://\)"):
        sink_location(JobSettings(store="gs://bucket/jobs"), "orders", None)


# -- sink_place -------------------------------------------------------------------


def test_a_kafka_sink_s_place_is_its_topic_read_committed(tmp_path):
    assert sink_place(Sink("kafka", "orders.out"), _local(tmp_path), "orders", None) == (
        "Kafka topic orders.out (read it with isolation.level=read_committed)"
    )


def test_an_avro_kafka_sink_s_place_names_its_subject(tmp_path):
    assert sink_place(Sink("kafka", "orders.out", avro=AVRO), _local(tmp_path), "orders", None) == (
        "Kafka topic orders.out as Avro registered under orders.out-value (read it with isolation.level=read_committed)"
    )


def test_a_kafka_sink_s_place_needs_no_store_connection():
    # the store is on S3 and there is no connection: a Kafka sink's place does not look at the store
    assert sink_place(Sink("kafka", "t"), _on_s3(), "orders", None).startswith("Kafka topic t ")


def test_a_delta_sink_s_place_is_its_table_under_the_job_s_sink(tmp_path):
    table = (tmp_path / "store" / "orders" / "sink" / "table").resolve()
    assert sink_place(Sink("delta"), _local(tmp_path), "orders", None) == (
        f"Delta table {table} (spark.read.format('delta'), or read_delta_output)"
    )


def test_a_delta_sink_s_place_on_s3_is_its_s3_table():
    assert sink_place(Sink("delta"), _on_s3(), "orders", CONNECTION) == (
        "Delta table s3://bucket/jobs/orders/sink/table (spark.read.format('delta'), or read_delta_output)"
    )
    assert sink_place(Sink("delta", table="s3://lake/orders"), _on_s3(), "orders", CONNECTION).startswith(
        "Delta table s3://lake/orders ("
    )


def test_a_delta_sink_s_own_local_table_is_said_as_an_absolute_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    place = sink_place(Sink("delta", table="lake/orders"), _local(tmp_path), "orders", None)
    assert place.startswith(f"Delta table {(tmp_path / 'lake' / 'orders').resolve()} (")


def test_an_object_store_sink_s_place_is_parquet_under_output(tmp_path):
    output = f"file://{(tmp_path / 'store' / 'orders' / 'sink').resolve()}/output"
    assert sink_place(Sink(), _local(tmp_path), "orders", None) == f"Parquet under {output} (read_committed_output)"
    assert sink_place(Sink("object-store"), _on_s3(), "orders", CONNECTION) == (
        "Parquet under s3://bucket/jobs/orders/sink/output (read_committed_output)"
    )


def test_a_delta_table_neither_on_s3_nor_a_path_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigError, match=r"delta sink table 'gs://b/t': give s3://bucket/path or a local path"):
        sink_place(Sink("delta", table="gs://b/t"), _local(tmp_path), "orders", None)


def test_a_sink_kind_that_is_no_family_is_a_clear_error():
    with pytest.raises(ConfigError, match=r"sink kind 'parquet': use one of 'object-store', 'kafka', 'delta'"):
        Sink("parquet")


# -- open_sink --------------------------------------------------------------------


def test_an_object_store_sink_writes_under_its_location(tmp_path):
    location = open_store(str(tmp_path / "sink"))
    sink = open_sink(Sink(), location, "w-1", job="orders", kafka=KAFKA, key=UNSIGNED, generation=1)
    assert type(sink) is ObjectStoreSink
    assert sink.task_id == "w-1"
    assert sink.output_path(7) == location.path("output", "epoch-000000000007", "w-1.parquet")


def test_a_delta_sink_commits_to_the_table_under_its_location_as_the_job_s_task(tmp_path):
    location = open_store(str(tmp_path / "sink"))
    sink = open_sink(
        Sink("delta"), location, "w-1", job="orders", kafka=KAFKA, connection=CONNECTION, key=UNSIGNED, generation=1
    )
    assert type(sink) is DeltaSink
    assert sink.task_id == "w-1"
    assert sink.table_uri == str((tmp_path / "sink" / "table").resolve())
    assert sink.app_id == "spark-abs/orders/w-1"
    assert sink.writer == "orders/w-1"
    assert sink._options == {}  # a local table needs no S3 options, even with a connection


def test_a_delta_sink_on_s3_reaches_the_table_through_the_connection(tmp_path):
    location = open_store(str(tmp_path / "sink"))
    sink = open_sink(
        Sink("delta", table="s3://lake/orders"),
        location,
        "w-0",
        job="orders",
        kafka=KAFKA,
        connection=CONNECTION,
        key=UNSIGNED,
        generation=1,
    )
    assert sink.table_uri == "s3://lake/orders"
    assert sink._options == {
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "AWS_ACCESS_KEY_ID": "key",
        "AWS_SECRET_ACCESS_KEY": "secret",
        "AWS_REGION": "us-east-1",
        "AWS_ALLOW_HTTP": "true",
    }


def test_a_kafka_sink_writes_its_topic_in_transactions_of_the_job_s_task(tmp_path, kafka_sinks):
    location = open_store(str(tmp_path / "sink"))
    sink = open_sink(
        Sink("kafka", "orders.out"), location, "w-2", job="orders", kafka=KAFKA, key=UNSIGNED, generation=1
    )
    assert isinstance(sink, kafka_sinks)
    assert sink.location is location and sink.task == "w-2"
    assert sink.kwargs == {
        "kafka": KAFKA,
        "topic": "orders.out",
        "transactional_id": "spark-abs.orders.w-2",
        "delivery_timeout_s": DELIVERY_BOUND_S,
        "key": UNSIGNED,
        "client": "java",
    }


def test_a_kafka_sink_is_given_the_delivery_bound_key_and_client_asked_for(tmp_path, kafka_sinks):
    key = JobKey.derive("s" * 32, "orders", cluster="test-cluster")
    sink = open_sink(
        Sink("kafka", "orders.out"),
        open_store(str(tmp_path / "sink")),
        "w-0",
        job="orders",
        kafka=KAFKA,
        delivery_timeout_s=7.5,
        key=key,
        generation=1,
        kafka_client="python",
    )
    assert (sink.kwargs["delivery_timeout_s"], sink.kwargs["key"], sink.kwargs["client"]) == (7.5, key, "python")


def test_a_kafka_sink_without_a_topic_is_refused_before_reaching_kafka(tmp_path, kafka_sinks):
    sink = Sink("kafka", "orders.out")
    object.__setattr__(sink, "topic", None)  # what Sink itself refuses: the factory's own guard
    with pytest.raises(ConfigError, match="sink task w-0: a Kafka sink names no topic"):
        open_sink(
            sink, open_store(str(tmp_path / "sink")), "w-0", job="orders", kafka=KAFKA, key=UNSIGNED, generation=1
        )


def test_a_delta_table_is_signed_with_a_key_of_the_stores_and_never_asks_kafka():
    """A Delta table is kept beside the store and checked without Kafka: its key comes from
    the store's (a move to another Kafka cluster leaves its signed versions valid); a Kafka
    sink's markers are signed with the job's Kafka key; an object-store sink signs nothing."""
    import dataclasses

    from streaming.adapters.sinks.factory import sink_key

    secret = "a-job-secret-of-more-than-32-characters"
    connection = dataclasses.replace(CONNECTION, job_secret=secret)
    kafka_key = JobKey.derive(secret, "orders", cluster="prod")

    def asks_kafka() -> JobKey:
        raise AssertionError("a Delta or object-store sink's key asked Kafka")

    delta = sink_key(Sink("delta"), "orders", connection, asks_kafka)
    assert isinstance(delta, JobKey) and delta == JobKey("orders", JobKey.store_key(secret, "orders"))
    assert delta.sign(b"delta-txn") != kafka_key.sign(b"delta-txn")
    assert sink_key(Sink("kafka", "orders.out"), "orders", connection, lambda: kafka_key) is kafka_key
    assert sink_key(Sink(), "orders", connection, asks_kafka) is UNSIGNED
