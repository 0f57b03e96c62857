"""The smoke pipeline through the real parts, checked against an independent
read of the topic with kafka-python."""

from __future__ import annotations

import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kafka import KafkaConsumer, TopicPartition

from streaming.adapters.objects import open_store
from streaming.api.config import KafkaAccess
from streaming.errors import SmokeFailure
from streaming.tools.smoke.run import SEQ_HEADER, SmokeRun, check_round_trip, run_smoke

pytestmark = pytest.mark.integration


def _consume_all(kafka: KafkaAccess, topic: str, partitions: int) -> dict[tuple[int, int], tuple]:
    consumer = KafkaConsumer(
        **kafka.client_options(), enable_auto_commit=False, consumer_timeout_ms=5000, auto_offset_reset="earliest"
    )
    tps = [TopicPartition(topic, p) for p in range(partitions)]
    consumer.assign(tps)
    consumer.seek_to_beginning(*tps)
    ends = consumer.end_offsets(tps)
    seen = {}
    for record in consumer:
        headers = dict(record.headers)
        seen[(record.partition, record.offset)] = (
            record.key.decode(),
            record.value.decode(),
            headers[SEQ_HEADER].decode(),
        )
        if all(consumer.position(tp) >= ends[tp] for tp in tps):
            break
    consumer.close()
    return seen


def test_smoke_pipeline_round_trips_every_record(spark, connection, unique_name):
    run = SmokeRun(topic=unique_name, prefix=f"tests/{unique_name}", records=700, partitions=3, batch_limit=200)
    report = run_smoke(spark, connection, run)

    assert report.produced == report.rows_read_back == 700
    assert report.batches >= 4  # 700 records in batches of at most 200
    assert report.parquet_files == report.batches

    store = open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)
    table = pq.read_table(store.root, filesystem=store.filesystem)
    from_parquet = {(r["partition"], r["offset"]): (r["key"], r["value"], r["seq_header"]) for r in table.to_pylist()}
    from_kafka = _consume_all(connection.kafka, unique_name, 3)
    assert len(from_kafka) == 700
    assert from_parquet == from_kafka


def _good_table(n: int = 6, partitions: int = 2) -> pa.Table:
    rows = sorted(range(n), key=lambda i: (i % partitions, i))
    return pa.table(
        {
            "partition": pa.array([i % partitions for i in rows], pa.int32()),
            "offset": pa.array([i // partitions for i in rows], pa.int64()),
            "key": [f"k{i}" for i in rows],
            "value": [json.dumps({"seq": i}) for i in rows],
            "seq_header": [str(i) for i in rows],
        }
    )


def test_check_accepts_an_exact_copy():
    check_round_trip(_good_table(), 6, 2)


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda t: t.slice(1), "read back 5 rows"),
        (lambda t: pa.concat_tables([t.slice(1, 1), t.slice(1)]), "exactly 0..N-1"),
        (lambda t: t.set_column(3, "value", pa.array([json.dumps({"seq": 0})] * 6)), "value does not match"),
        (lambda t: t.set_column(2, "key", pa.array(["k0"] * 6)), "key does not match"),
        (lambda t: t.set_column(1, "offset", pa.array([0, 1, 2, 0, 1, 7], pa.int64())), "offsets are not"),
    ],
)
def test_check_rejects_damaged_output(damage, message):
    with pytest.raises(SmokeFailure, match=message):
        check_round_trip(damage(_good_table()), 6, 2)
