"""A stage task's query on real Spark and Kafka: assigned channels read from
their offsets in order, batches handled one at a time."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from kafka import KafkaProducer

from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.serde.records import header_values
from streaming.adapters.spark.query import ChannelQuery, QuerySpec
from streaming.errors import ConfigError


@pytest.mark.integration
def test_query_reads_assigned_channels_from_their_offsets_in_order(spark, connection, unique_name):
    create_topic(connection.kafka, unique_name, 3)
    producer = KafkaProducer(**connection.kafka.client_options())
    for i in range(60):
        producer.send(
            unique_name, value=f"{i % 3}:{i // 3}".encode(), partition=i % 3, headers=[("n", str(i).encode())]
        )
    producer.flush()
    producer.close()

    batches: list[pa.Table] = []
    spec = QuerySpec(
        name=unique_name,
        channels=(ChannelId(unique_name, 0), ChannelId(unique_name, 1)),  # not partition 2
        starting={ChannelId(unique_name, 0): 15},
        max_records_per_batch=7,
    )
    query = ChannelQuery(spark, connection, spec, on_batch=lambda table, _id: batches.append(table))
    try:
        query.start(available_now=True).await_done(120)
        # Spark's logs of the query, in a temporary directory of its own, are written without checksums
        logs = [p.name for p in Path(query._checkpoint_dir or "").rglob("*") if p.is_file()]
    finally:
        query.stop()

    assert "0" in logs and not [name for name in logs if name.endswith(".crc")], logs
    assert len(batches) >= 3
    for table in batches:
        keys = list(zip(table["partition"].to_pylist(), table["offset"].to_pylist()))
        assert keys == sorted(keys)
    seen = pa.concat_tables(batches)
    got = list(zip(seen["partition"].to_pylist(), seen["offset"].to_pylist()))
    assert sorted(got) == [(0, o) for o in range(15, 20)] + [(1, o) for o in range(20)]
    assert [v.decode() for v in seen["value"].to_pylist()] == [f"{p}:{o}" for p, o in got]
    assert header_values(seen, "n").to_pylist() == [str(o * 3 + p).encode() for p, o in got]


def test_starting_offsets_for_unread_channels_are_refused(spark, connection):
    with pytest.raises(ConfigError, match="does not read: t:1"):
        ChannelQuery(
            spark,
            connection,
            QuerySpec(name="x", channels=(ChannelId("t", 0),), starting={ChannelId("t", 1): 0}),
            on_batch=lambda t, i: None,
        )


@pytest.mark.integration
def test_batches_are_handled_in_order_one_at_a_time_and_a_failing_one_fails_the_query(spark, connection, unique_name):
    create_topic(connection.kafka, unique_name, 1)
    producer = KafkaProducer(**connection.kafka.client_options())
    for i in range(40):
        producer.send(unique_name, value=str(i).encode(), partition=0)
    producer.flush()
    producer.close()
    channel = ChannelId(unique_name, 0)
    seen: list[int] = []
    running = threading.Semaphore(1)  # the handler never runs twice at once

    def slow(table: pa.Table, _id: int) -> None:
        assert running.acquire(blocking=False), "two batches handled at once"
        time.sleep(0.05)  # Spark reads the next micro-batch meanwhile
        seen.extend(table["offset"].to_pylist())
        running.release()

    query = ChannelQuery(
        spark, connection, QuerySpec(name=unique_name, channels=(channel,), max_records_per_batch=5), on_batch=slow
    )
    try:
        query.start(available_now=True).await_done(120)  # returns once the last batch is handled
    finally:
        query.stop()
    assert seen == list(range(40))

    def failing(table: pa.Table, _id: int) -> None:
        raise ValueError("operator bug")

    query = ChannelQuery(spark, connection, QuerySpec(name=f"{unique_name}-f", channels=(channel,)), on_batch=failing)
    try:
        query.start()
        deadline = time.monotonic() + 60
        while query.failure() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert "operator bug" in (query.failure() or ""), query.failure()
    finally:
        query.stop()
