"""The Kafka sink on the real broker: its transactions written by Kafka's Java
client on the second transaction protocol (or by kafka-python), a commit
never written twice, a fenced instance refused, forged commit markers not
counted, a compacted commits topic refused, and recovery giving each epoch
exactly once."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from barriers.messages import UNSIGNED
from streaming import read_kafka_output  # what a user reads output with
from streaming.adapters.kafka.admin import create_topic, end_offsets, job_key
from streaming.adapters.kafka.ranges import topic_config
from streaming.adapters.kafka.transactions import JavaTransactions
from streaming.adapters.objects import open_store
from streaming.adapters.sinks.base import Recovery
from streaming.adapters.sinks.kafka import COMMITS_TOPIC_CONFIG, KafkaSink
from streaming.api.config import KafkaAccess
from streaming.errors import SinkError, SinkFencedError


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
def test_kafka_sink_two_phase_commit_and_recovery(connection, unique_name, client, epoch_rows):
    """With either client (``JobSettings.kafka_sink_client``)."""
    topic = f"{unique_name}-out"
    create_topic(connection.kafka, topic, 1)
    staging = open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)
    txid = f"{unique_name}-sink-0"
    key = job_key(connection, unique_name)
    # a compacted commits topic (an earlier release made them so) is refused, saying how to change it:
    # a record anyone wrote with a marker's key would erase the marker when compaction runs
    compacted = f"{unique_name}-compacted"
    create_topic(connection.kafka, f"{compacted}.commits", 1, config={"cleanup.policy": "compact"})
    with pytest.raises(
        SinkError, match=r"is compacted \(cleanup.policy=compact\).*--add-config 'cleanup.policy=delete"
    ):
        KafkaSink(
            staging,
            "task-0",
            kafka=connection.kafka,
            topic=compacted,
            transactional_id=txid,
            client=client,
            key=UNSIGNED,
        )
    # someone who can write to the commits topic forges markers: epoch 1 committed, epoch 1 superseded
    create_topic(connection.kafka, f"{topic}.commits", 1, config=COMMITS_TOPIC_CONFIG)
    forger = KafkaProducer(**connection.kafka.client_options())
    for forged in (b"task-0:1", b"task-0:1:superseded"):
        forger.send(f"{topic}.commits", key=forged, value=b"2", headers=[("abs.signature", b"0" * 64)])
    forger.flush(30)
    forger.close()
    forged_markers = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, client=client, key=UNSIGNED
    )
    assert forged_markers._committed(1)  # without the job's key a forged marker passes ...
    assert topic_config(connection.kafka, f"{topic}.commits", "cleanup.policy") == "delete"
    forged_markers.close()

    first = KafkaSink(
        staging, "task-0", kafka=connection.kafka, topic=topic, transactional_id=txid, key=key, client=client
    )
    assert not first._committed(1)  # ... with it, it does not
    for epoch in (1, 2, 3):
        first.stage(epoch, epoch_rows(epoch, 2))
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
    first.stage(4, epoch_rows(4, 1))  # the old instance runs on and tries to commit what it staged
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
    assert read_kafka_output(connection.kafka, topic, key=UNSIGNED).superseded == {"task-0:1": 2, "task-0:2": 2}
    third.stage(5, epoch_rows(5, 2))  # the restored job writes epoch 2's results again
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


def test_a_fenced_producer_is_known_however_kafka_python_says_it():
    """Raised as itself, or as the error state a failed background request
    left the transaction in: its message alone names the error (seen: the
    fenced first instance's commit of epoch 4 above, about once in ten runs),
    the transaction manager's ``last_error`` holds it; or it is the error's argument."""
    from kafka import errors

    from streaming.adapters.sinks.kafka import _fenced

    state = errors.KafkaError(
        "Cannot execute transactional method because we are in an error state: [Error 90] ProducerFencedError"
    )
    assert _fenced(errors.ProducerFencedError()) and _fenced(state, errors.ProducerFencedError())
    assert _fenced(errors.KafkaError("Cannot perform send", errors.ProducerFencedError()))
    assert not _fenced(state, errors.KafkaTimeoutError()) and not _fenced(state)
