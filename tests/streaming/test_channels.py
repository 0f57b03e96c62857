"""Stage input channels on real Kafka and Spark: explicit partitions, explicit
starting offsets, batches ordered by channel and offset."""

from __future__ import annotations

import pyarrow as pa
import pytest
from kafka import KafkaProducer

from streaming.channels import Channel, ChannelQuery, header_values
from streaming.errors import ConfigError
from streaming.kafka_admin import create_topic


def test_channel_names_round_trip():
    assert Channel.parse("money.transfers:3") == Channel("money.transfers", 3)
    assert str(Channel("orders", 0)) == "orders:0"
    with pytest.raises(ValueError, match="topic:partition"):
        Channel.parse("no-partition")
    with pytest.raises(ValueError, match="contain no ':'"):
        Channel.parse("a:b:0")  # Kafka topic names have no ':'



def test_header_values_takes_the_named_header_of_each_row():
    headers = pa.array([
        [{"key": "a", "value": b"1"}, {"key": "g", "value": b"7"}],
        [],
        [{"key": "g", "value": b"8"}, {"key": "g", "value": b"9"}],
        [{"key": "b", "value": b"2"}],
    ], pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])))
    table = pa.table({"headers": headers})
    assert header_values(table, "g").to_pylist() == [b"7", None, b"8", None]
    assert header_values(table, "zzz").to_pylist() == [None] * 4


@pytest.mark.integration
def test_query_reads_assigned_channels_from_their_offsets_in_order(spark, connection, unique_name):
    create_topic(connection.kafka_bootstrap, unique_name, 3)
    producer = KafkaProducer(bootstrap_servers=connection.kafka_bootstrap)
    for i in range(60):
        producer.send(unique_name, value=f"{i % 3}:{i // 3}".encode(), partition=i % 3,
                      headers=[("n", str(i).encode())])
    producer.flush()
    producer.close()

    batches: list[pa.Table] = []
    query = ChannelQuery(spark, connection, name=unique_name,
                         channels=[Channel(unique_name, 0), Channel(unique_name, 1)],  # not partition 2
                         starting={Channel(unique_name, 0): 15}, max_records_per_batch=7,
                         on_batch=lambda table, _id: batches.append(table))
    try:
        query.start(available_now=True).await_done(120)
    finally:
        query.stop()

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
        ChannelQuery(spark, connection, name="x", channels=[Channel("t", 0)],
                     starting={Channel("t", 1): 0}, on_batch=lambda t, i: None)
