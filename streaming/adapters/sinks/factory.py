"""The sink of a pipeline, opened for one task (``open_sink``), and where
its output is made visible, said for people (``sink_place``)."""

from __future__ import annotations

from collections.abc import Callable

from barriers.messages import UNSIGNED, Unsigned
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S
from streaming.adapters.objects import StoreLocation, open_store
from streaming.adapters.serde.schema_registry import subject_of
from streaming.adapters.sinks.delta import DeltaSink, delta_storage_options, delta_table_uri
from streaming.adapters.sinks.kafka import KafkaSink
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.api.config import Connection, KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.pipeline import Sink, SinkKind
from streaming.api.settings import JobSettings
from streaming.api.topics import transactional_id
from streaming.errors import ConfigError

__all__ = ["open_sink", "sink_key", "sink_location", "sink_place"]


def sink_key(sink: Sink, job: str, connection: Connection, kafka_key: Callable[[], JobKey]) -> JobKey | Unsigned:
    """What ``sink`` of job ``job`` signs with: a Kafka sink's commit markers,
    the job's Kafka key (``kafka_key()``: its readers check them with it); a
    Delta table's commits, a key from the store's (``JobKey.store_key``: the
    table is kept beside the store and checked without Kafka, and a move to
    another Kafka cluster leaves it valid); an object-store sink, nothing
    (its epochs are under the store, whose manifests name them)."""
    if sink.kind is SinkKind.KAFKA:
        return kafka_key()
    if sink.kind is SinkKind.DELTA:
        return JobKey(job, connection.store_key(job))
    return UNSIGNED


def sink_place(sink: Sink, settings: JobSettings, job: str, connection: Connection | None) -> str:
    """Where ``sink`` of job ``job`` makes its output visible, in words a user can follow."""
    if sink.kind is SinkKind.KAFKA:
        avro = " as Avro registered under " + subject_of(sink.topic or "") if sink.avro is not None else ""
        return f"Kafka topic {sink.topic}{avro} (read it with isolation.level=read_committed)"
    location = sink_location(settings, job, connection)
    if sink.kind is SinkKind.DELTA:
        return f"Delta table {delta_table_uri(sink, location)} (spark.read.format('delta'), or read_delta_output)"
    return f"Parquet under {location.uri}/output (read_committed_output)"


def sink_location(settings: JobSettings, job: str, connection: Connection | None) -> StoreLocation:
    """Where job ``job``'s sinks keep their epochs: ``<store>/<job>/sink``."""
    return open_store(f"{settings.store.rstrip('/')}/{job}/sink", connection)


def open_sink(
    sink: Sink,
    location: StoreLocation,
    task: str,
    *,
    job: str,
    kafka: KafkaAccess,
    connection: Connection | None = None,
    delivery_timeout_s: float = DELIVERY_BOUND_S,
    key: JobKey | Unsigned,
    generation: int,
    kafka_client: str = "java",
) -> ObjectStoreSink | KafkaSink | DeltaSink:
    """The sink of sink task ``task`` of job ``job`` in the job's
    ``generation`` (``connection``: the S3 server of a Delta sink's ``s3://``
    table; ``kafka_client``: which client writes a Kafka sink's
    transactions, ``JobSettings.kafka_sink_client``)."""
    if sink.kind is SinkKind.DELTA:
        uri = delta_table_uri(sink, location)
        return DeltaSink(
            location,
            task,
            table_uri=uri,
            app_id=f"spark-abs/{job}/{task}",
            storage_options=delta_storage_options(uri, connection),
            key=key,
            generation=generation,
            writer=f"{job}/{task}",
        )
    if sink.kind is SinkKind.KAFKA:
        if sink.topic is None:  # Sink refuses a Kafka sink without one
            raise ConfigError(f"sink task {task}: a Kafka sink names no topic")
        return KafkaSink(
            location,
            task,
            kafka=kafka,
            topic=sink.topic,
            transactional_id=transactional_id(job, task),
            delivery_timeout_s=delivery_timeout_s,
            key=key,
            client=kafka_client,
        )
    return ObjectStoreSink(location, task)
