"""Exactly-once sinks on the real S3 server and Kafka broker: output appears
only on commit, a commit is never written twice, and recovery after a crash
between the manifest and the sink's commit gives each epoch exactly once."""

from __future__ import annotations

import time

import pyarrow as pa
import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from streaming import read_committed_output, read_kafka_output  # what a user reads output with
from streaming.adapters.kafka.admin import create_topic, end_offsets
from streaming.adapters.kafka.transactions import JavaTransactions
from streaming.adapters.objects import open_store
from streaming.adapters.sinks.base import Recovery
from streaming.adapters.sinks.kafka import KafkaSink
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.api.config import KafkaAccess
from streaming.errors import SinkError, SinkFencedError


def _rows(epoch: int, n: int = 3) -> pa.Table:
    return pa.table({"key": [f"e{epoch}-k{i}" for i in range(n)], "value": [f"{epoch}:{i}" for i in range(n)]})


@pytest.fixture(params=["file", "s3"])
def location(request, tmp_path, unique_name):
    if request.param == "file":
        return open_store(str(tmp_path / "sink"))
    connection = request.getfixturevalue("connection")
    return open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)


def _values(location) -> list[str]:
    table = read_committed_output(location)
    return [] if table is None else table["value"].to_pylist()


def test_object_store_sink_shows_an_epoch_only_after_commit(location):
    sink = ObjectStoreSink(location, "task-0")
    sink.stage(1, _rows(1))
    sink.stage(2, _rows(2))
    assert _values(location) == []
    assert sink.staged_epochs() == [1, 2]
    assert sink.commit(1) is True
    assert _values(location) == ["1:0", "1:1", "1:2"]
    assert sink.staged_epochs() == [2]  # moved, not copied: a commit leaves nothing staged
    assert sink.commit(1) is False  # idempotent
    assert _values(location) == ["1:0", "1:1", "1:2"]


def test_a_commit_cut_short_after_the_copy_is_finished_by_the_next_one(location):
    sink = ObjectStoreSink(location, "task-0")
    sink.stage(1, _rows(1))
    # S3's move is a copy then a delete: the output exists and the staged file still does
    location.filesystem.create_dir(location.path("output", "epoch-000000000001"))
    location.filesystem.copy_file(location.path("staging", "epoch-000000000001", "task-0.parquet"), sink.output_path(1))
    assert sink.commit_through(1) == []
    assert sink.staged_epochs() == []
    assert _values(location) == ["1:0", "1:1", "1:2"]


def test_object_store_sink_recovery_commits_up_to_the_checkpoint_and_discards_the_rest(location):
    crashed = ObjectStoreSink(location, "task-0")
    for epoch in (1, 2, 3):
        crashed.stage(epoch, _rows(epoch, 2))
    crashed.commit(1)
    # Checkpoint 2 completed (manifest written) but the crash came before the
    # sink's commit; epoch 3 was staged by the run that failed.
    restarted = ObjectStoreSink(location, "task-0")
    assert restarted.recover(completed_checkpoint=2) == Recovery(committed=[2], discarded=[3])
    assert _values(location) == ["1:0", "1:1", "2:0", "2:1"]
    assert not restarted.recover(completed_checkpoint=2)
    restarted.stage(3, _rows(3, 1))
    restarted.commit(3)
    assert _values(location) == ["1:0", "1:1", "2:0", "2:1", "3:0"]


def test_a_restore_to_an_older_checkpoint_takes_back_the_output_committed_after_it(location):
    first = ObjectStoreSink(location, "task-0")
    other = ObjectStoreSink(location, "task-1")
    for epoch in (1, 2, 3):
        first.stage(epoch, _rows(epoch, 1))
        first.commit(epoch)
    other.stage(3, _rows(30, 1))
    other.commit(3)
    # restored from checkpoint 1: epochs 2 and 3 of task-0 go, task-1's epoch 3 is its own to take back
    restored = ObjectStoreSink(location, "task-0")
    before = time.time() - 1
    assert restored.recover(completed_checkpoint=1) == Recovery(retracted=[2, 3])  # committed: nothing staged
    retracted = location.filesystem.get_file_info(location.path("retracted", "epoch-000000000002", "task-0.parquet"))
    assert retracted.mtime.timestamp() >= before  # gc's grace period counts from the retraction
    assert _values(location) == ["1:0", "30:0"]
    assert ObjectStoreSink(location, "task-1").recover(completed_checkpoint=1).retracted == [3]
    assert _values(location) == ["1:0"]
    # the replay writes them again under the new generation's epochs
    restored.stage(4, _rows(2, 1))
    restored.commit(4)
    assert _values(location) == ["1:0", "2:0"]


def test_committing_an_epoch_never_staged_is_a_clear_error(location):
    with pytest.raises(SinkError, match="epoch 7.*missing or unreadable"):
        ObjectStoreSink(location, "task-0").commit(7)


def _read_committed(kafka: KafkaAccess, topic: str) -> list[str]:
    consumer = KafkaConsumer(
        **kafka.client_options(),
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
        auto_offset_reset="earliest",
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [r.value.decode() for r in consumer]
    consumer.close()
    return values


@pytest.mark.integration
def test_the_java_client_writes_on_the_second_transaction_protocol(connection, unique_name):
    """Kafka 4's brokers run the second transaction protocol (KIP-890), and
    the Kafka sink's Java client speaks it: the producer's epoch goes up with
    every transaction, and a transaction the fenced instance still tries is
    refused by the broker itself."""
    topic = f"{unique_name}-tv2"
    create_topic(connection.kafka, topic, 1)
    sender = JavaTransactions(connection.kafka, f"{unique_name}-tx", delivery_timeout_s=30)
    try:
        assert sender.transaction_version() == 2
        epochs = []
        for n in range(3):
            sender.commit([(topic, 0, b"k", f"v{n}".encode(), [("h", b"1")])], f"transaction {n}")
            [(producer_id, epoch)] = sender.producers(topic, 0)
            epochs.append(epoch)
        assert epochs == [epochs[0], epochs[0] + 1, epochs[0] + 2]
        newer = JavaTransactions(connection.kafka, f"{unique_name}-tx", delivery_timeout_s=30)
        with pytest.raises(SinkFencedError, match="old epoch"):
            sender.commit([(topic, 0, None, b"late", [])], "a late transaction")
        newer.commit([(topic, 0, None, b"newer", [])], "the newer instance's")
        newer.close()
    finally:
        sender.close()
    assert _read_committed(connection.kafka, topic) == ["v0", "v1", "v2", "newer"]


@pytest.mark.integration
def test_a_transaction_larger_than_the_java_clients_heap_is_streamed_through_it(connection, unique_name):
    topic = f"{unique_name}-big"
    create_topic(connection.kafka, topic, 1)
    sender = JavaTransactions(connection.kafka, f"{unique_name}-tx", delivery_timeout_s=60, heap="64m")
    try:
        value = bytes(range(256)) * 3500  # 896,000 bytes, under the broker's largest record
        sender.commit([(topic, 0, None, value, [])] * 100, "90 MB in one transaction")
        assert len(sender.producers(topic, 0)) == 1
    finally:
        sender.close()
    assert (
        sum(end_offsets(connection.kafka, topic, 1).values()) == 101
    )  # the records and the transaction's commit marker


@pytest.mark.integration
def test_the_java_client_says_why_it_cannot_start(connection, unique_name):
    unreachable = KafkaAccess("127.0.0.1:1")
    with pytest.raises(SinkError, match=r"cannot start a transactional producer on 127.0.0.1:1: .*Timeout expired"):
        JavaTransactions(unreachable, f"{unique_name}-tx", delivery_timeout_s=2)


@pytest.mark.integration
@pytest.mark.parametrize("client", ["java", "python"])
def test_kafka_sink_two_phase_commit_and_recovery(connection, unique_name, client):
    """With either client (``JobSettings.kafka_sink_client``)."""
    topic = f"{unique_name}-out"
    create_topic(connection.kafka, topic, 1)
    staging = open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)
    txid = f"{unique_name}-sink-0"
    key = connection.job_key(unique_name)
    # someone who can write to the commits topic forges markers: epoch 1 committed, epoch 1 superseded
    create_topic(connection.kafka, f"{topic}.commits", 1, config={"cleanup.policy": "compact"})
    forger = KafkaProducer(**connection.kafka.client_options())
    for forged in (b"task-0:1", b"task-0:1:superseded"):
        forger.send(f"{topic}.commits", key=forged, value=b"2", headers=[("abs.signature", b"0" * 64)])
    forger.flush(30)
    forger.close()
    forged_markers = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, client=client
    )
    assert forged_markers._committed(1)  # without the job's key a forged marker passes ...
    forged_markers.close()

    first = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, key=key, client=client
    )
    assert not first._committed(1)  # ... with it, it does not
    for epoch in (1, 2, 3):
        first.stage(epoch, _rows(epoch, 2))
    assert first.commit(1) is True
    assert _read_committed(connection.kafka, topic) == ["1:0", "1:1"]

    # A new instance (the restored generation) fences the old one, finds
    # epoch 1 committed, commits epoch 2 (checkpoint 2 completed before the
    # crash) and discards epoch 3.
    second = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, key=key, client=client
    )
    assert second.recover(completed_checkpoint=2) == Recovery(committed=[2], discarded=[3])
    assert not second.recover(completed_checkpoint=2)
    assert first.commit(2) is False  # the old instance finds epoch 2 committed by the new one: nothing twice
    first.stage(4, _rows(4, 1))  # the old instance runs on and tries to commit what it staged
    with pytest.raises(SinkFencedError):
        first.commit(4)
    assert _read_committed(connection.kafka, topic) == ["1:0", "1:1", "2:0", "2:1"]
    first.close()
    second.close()
    # a restore to checkpoint 1 cannot take epoch 2 back from Kafka: it says so
    third = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, key=key, client=client
    )
    # (committed epochs leave nothing staged; the old instance's epoch 4 is discarded)
    assert third.recover(completed_checkpoint=1) == Recovery(discarded=[4], irrevocable=[2])
    # ... but marks it superseded: a reader that skips superseded epochs reads each result once
    output = read_kafka_output(connection.kafka, topic, key=key)
    assert [v.decode() for v in output.values] == ["1:0", "1:1"] and output.superseded == {"task-0:2": 2}
    # without the key, the forged mark hides epoch 1 from the reader
    assert read_kafka_output(connection.kafka, topic).superseded == {"task-0:1": 2, "task-0:2": 2}
    third.stage(5, _rows(5, 2))  # the restored job writes epoch 2's results again
    assert third.commit(5) is True
    output = read_kafka_output(connection.kafka, topic, key=key)
    assert [v.decode() for v in output.values] == ["1:0", "1:1", "5:0", "5:1"]
    assert _read_committed(connection.kafka, topic) == ["1:0", "1:1", "2:0", "2:1", "5:0", "5:1"]
    third.close()
    # a later restore, to checkpoint 5 of the new history: epoch 2, numbered below it, is not of that
    # history (the generation after the fallback went on with higher numbers): it stays superseded
    fourth = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, key=key, client=client
    )
    assert fourth.recover(completed_checkpoint=5) == Recovery()
    output = read_kafka_output(connection.kafka, topic, key=key)
    assert [v.decode() for v in output.values] == ["1:0", "1:1", "5:0", "5:1"] and output.superseded == {"task-0:2": 2}
    fourth.close()
