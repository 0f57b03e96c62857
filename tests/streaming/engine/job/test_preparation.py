"""What a job needs before its first generation, without Kafka: whether a
snapshot store (a local directory) knows the job, which topics a pipeline
creates, a fresh start refused where the job's control topic holds an
earlier run, and the fresh start recorded in the store as generation 0.
Kafka's admin calls are replaced by a recorder holding the control topic's
end offsets."""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pytest

from operators import filter_rows
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.adapters.snapshots.writing import TaskParts
from streaming.api.config import Connection, KafkaAccess
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.job import preparation
from streaming.engine.job.preparation import create_topics, known_to, refuse_an_unknown_earlier_run, start_fresh
from streaming.errors import ConfigError

KAFKA = KafkaAccess("127.0.0.1:9")
CONNECTION = Connection(KAFKA, "http://127.0.0.1:9", "key", "secret", "bucket")
CONTROL = "spark-abs.money.control"
AVRO = {"type": "record", "name": "Out", "fields": [{"name": "k", "type": "string"}]}


def _op():
    return filter_rows(lambda t: pa.array([True] * t.num_rows))


def _pipeline(sink: Sink | None = None) -> Pipeline:
    return Pipeline(
        "money",
        (Ingress("transfers", 4),),
        (
            Stage("a", ("transfers",), _op, parallelism=2, key="account"),
            Stage("c", ("a",), _op, sink=sink or Sink("kafka", "money.out")),
        ),
    )


class _Kafka:
    """Stands for the admin calls: the topics created, in order, with their
    partitions; ``events``: the end offsets of each partition of the control topic."""

    def __init__(self, events: dict[int, int] | None = None) -> None:
        self.created: list[tuple[str, int]] = []
        self.events = events or {0: 0}

    def create_topic(self, kafka, name, partitions, **_):
        assert kafka is KAFKA
        self.created.append((name, partitions))

    def end_offsets(self, kafka, topic, partitions):
        assert (kafka, topic, partitions) == (KAFKA, CONTROL, 1)
        return dict(self.events)


@pytest.fixture
def kafka(monkeypatch) -> _Kafka:
    fake = _Kafka()
    monkeypatch.setattr(preparation, "create_topic", fake.create_topic)
    monkeypatch.setattr(preparation, "end_offsets", fake.end_offsets)
    return fake


@pytest.fixture
def store(tmp_path) -> Iterator[SnapshotStore]:
    with SnapshotStore(open_store(f"file://{tmp_path}/store"), "money", key=UNSIGNED) as snapshots:
        yield snapshots


# -- known_to ---------------------------------------------------------------------


def test_an_empty_store_does_not_know_the_job(store):
    assert known_to(store) is False


def test_a_store_that_recorded_the_fresh_start_knows_the_job(store):
    store.first_generation()
    assert known_to(store) is True


def test_a_store_holding_a_checkpoint_knows_the_job_without_its_job_file(store):
    store.write_task(1, 0, "a-0", TaskParts(positions={"transfers:0": 3}))
    assert store.read_job() is None
    assert known_to(store) is True


# -- create_topics ----------------------------------------------------------------


def test_a_pipeline_creates_its_ingress_internal_sink_control_and_dead_letter_topics(kafka):
    create_topics(_pipeline(), CONNECTION)
    assert kafka.created == [
        ("transfers", 4),
        ("spark-abs.money.a", 2),
        ("money.out", 1),
        (CONTROL, 1),
        ("spark-abs.money.dead-letters", 1),
    ]


def test_a_pipeline_without_a_kafka_sink_creates_no_sink_topic(kafka):
    create_topics(_pipeline(Sink()), CONNECTION)
    assert [name for name, _ in kafka.created] == [
        "transfers",
        "spark-abs.money.a",
        CONTROL,
        "spark-abs.money.dead-letters",
    ]


def test_a_pipeline_writing_avro_creates_nothing_without_a_schema_registry(kafka):
    with pytest.raises(ConfigError, match="sink money.out of job money use a schema registry"):
        create_topics(_pipeline(Sink("kafka", "money.out", avro=AVRO)), CONNECTION)
    assert kafka.created == []


# -- refuse_an_unknown_earlier_run ------------------------------------------------


def test_a_fresh_start_over_an_empty_control_topic_is_allowed(kafka):
    assert refuse_an_unknown_earlier_run(CONNECTION, "money", "file:///elsewhere") is None
    assert kafka.created == [(CONTROL, 1)]


def test_a_fresh_start_over_an_earlier_run_in_kafka_is_refused_naming_it(kafka):
    kafka.events = {0: 5}
    with pytest.raises(ConfigError) as refused:
        refuse_an_unknown_earlier_run(CONNECTION, "money", "file:///elsewhere")
    message = str(refused.value)
    assert message.startswith(f"job money: Kafka holds an earlier run of this job (5 events on {CONTROL}, ")
    assert "the store file:///elsewhere has no record of it" in message
    assert "--store" in message and "--job" in message


# -- start_fresh ------------------------------------------------------------------


def test_a_fresh_start_creates_the_topics_and_records_generation_zero_at_the_pipeline_s_scale(kafka, store):
    pipeline = _pipeline()
    start_fresh(pipeline, CONNECTION, store, "file:///store")
    assert [name for name, _ in kafka.created] == [
        CONTROL,  # looked at for an earlier run first
        "transfers",
        "spark-abs.money.a",
        "money.out",
        CONTROL,
        "spark-abs.money.dead-letters",
    ]
    meta = store.read_job()
    assert (meta.job, meta.generation) == ("money", 0)
    [start] = meta.restores
    assert (start.generation, start.from_checkpoint) == (0, None)
    assert start.scale == {"parallelism": {"a": 2, "c": 1}, "topics": {"a": "spark-abs.money.a"}}
    assert known_to(store) is True


def test_a_fresh_start_refused_over_an_earlier_run_creates_and_records_nothing(kafka, store):
    kafka.events = {0: 2}
    with pytest.raises(ConfigError, match="Kafka holds an earlier run of this job"):
        start_fresh(_pipeline(), CONNECTION, store, "file:///store")
    assert kafka.created == [(CONTROL, 1)]
    assert store.read_job() is None
    assert known_to(store) is False


def test_a_fresh_start_recorded_already_is_recorded_once(kafka, store):
    start_fresh(_pipeline(), CONNECTION, store, "file:///store")
    first = store.read_job()
    start_fresh(_pipeline(), CONNECTION, store, "file:///store")
    assert store.read_job() == first


def test_a_store_in_a_later_generation_refuses_a_fresh_start(kafka, store):
    store.first_generation()
    assert store.next_generation(None) == 1
    with pytest.raises(ValueError, match="job money is in generation 1: it cannot start afresh"):
        start_fresh(_pipeline(), CONNECTION, store, "file:///store")
    assert store.read_job().generation == 1
