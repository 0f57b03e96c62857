"""What a job needs before its first generation starts: its topics created
(idempotent: ingress, internal, a Kafka sink's, control, dead letters),
a fresh start refused where Kafka holds an earlier run of the same job
name that the store knows nothing of, and the fresh start recorded in the
store (generation 0)."""

from __future__ import annotations

from streaming.adapters.kafka.admin import create_topic, end_offsets
from streaming.adapters.objects import store_patiently
from streaming.adapters.serde.schema_registry import check_registry
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection
from streaming.api.pipeline import Pipeline, SinkKind
from streaming.api.topics import control_topic, dead_letter_topic
from streaming.errors import ConfigError

__all__ = ["create_topics", "known_to", "refuse_an_unknown_earlier_run", "start_fresh"]


def create_topics(pipeline: Pipeline, connection: Connection) -> None:
    """Create ``pipeline``'s topics on ``connection``'s Kafka (idempotent),
    once its schema registry is known to be there when the pipeline needs one."""
    kafka = connection.kafka
    check_registry(pipeline, connection.schema_registry)
    for ingress in pipeline.ingress:
        create_topic(kafka, ingress.topic, ingress.partitions)
    for topic, partitions in pipeline.internal_topics().items():
        create_topic(kafka, topic, partitions)
    for stage in pipeline.stages:
        if stage.sink is not None and stage.sink.kind is SinkKind.KAFKA and stage.sink.topic:  # Sink checks it has one
            create_topic(kafka, stage.sink.topic, 1)
    create_topic(kafka, control_topic(pipeline.job), 1)
    create_topic(kafka, dead_letter_topic(pipeline.job), 1)


def refuse_an_unknown_earlier_run(connection: Connection, job: str, store: str) -> None:
    """A fresh start of ``job`` where an earlier run of this job name left its
    control events, but the store ``store`` has no record of it (another
    store, or one emptied since): its barriers in the ingress topics and its
    records in the internal ones would be taken for this run's."""
    kafka, topic = connection.kafka, control_topic(job)
    create_topic(kafka, topic, 1)
    events = sum(end_offsets(kafka, topic, 1).values())
    if events:
        raise ConfigError(
            f"job {job}: Kafka holds an earlier run of this job ({events} events on {topic}, "
            f"barriers in its ingress topics, records in its internal topics), but the store "
            f"{store} has no record of it; starting afresh would take that run's barriers "
            f"and records for this one's.  Run with the earlier run's --store to go on from its "
            f"checkpoints, or under another --job name (topics are named after the job)"
        )


def known_to(store: SnapshotStore) -> bool:
    """Whether ``store`` knows the job: ``_JOB.json`` records its fresh start
    (generation 0), so a job whose runner stopped or died goes on from its
    checkpoints, or from the beginning as a new generation (what the one
    before wrote is stale), never as a second generation 0."""
    return store_patiently(lambda: store.read_job() is not None or bool(store.checkpoints()), "reading the job")


def start_fresh(pipeline: Pipeline, connection: Connection, store: SnapshotStore, store_uri: str) -> None:
    """A job the store does not know (``known_to``), started afresh: refused
    over an earlier run Kafka holds, its topics created, generation 0 recorded."""
    refuse_an_unknown_earlier_run(connection, pipeline.job, store_uri)
    create_topics(pipeline, connection)
    scale = pipeline.scale.to_json()
    store_patiently(lambda: store.first_generation(scale=scale), "recording the fresh start")
