"""Kafka transport of the protocol on a real broker: marker offsets, the
control topic, dead letters."""

from __future__ import annotations

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from barriers.messages import ChannelId
from streaming.adapters.control import Ack, ControlEvent, ControlTopic, Lease, Progress, Trigger, send_event
from streaming.adapters.kafka_admin import create_topic
from streaming.adapters.kafka_io import DeadLetters, append_markers
from streaming.adapters.snapshots import TaskCheckpointMetrics
from streaming.api.config import KafkaAccess
from streaming.errors import KafkaUnavailableError


def test_control_events_round_trip_and_reject_garbage():
    event = Ack(checkpoint_id=7, task="stage-a/0", generation=1, metrics=TaskCheckpointMetrics(state_bytes=12))
    assert ControlEvent.decode(event.encode()) == event
    for bad, reason in [
        (b"\xff", "not JSON"),
        (b"[]", "checkpoint_id"),
        (b'{"kind": "ack"}', "checkpoint_id"),
        (b'{"kind": "hello", "checkpoint_id": 1}', "hello"),
    ]:
        with pytest.raises(ValueError, match=reason):
            ControlEvent.decode(bad)


def test_a_send_refused_at_once_is_a_clear_kafka_error_naming_what():
    class NoMetadata:  # kafka-python raises from send() itself when no broker gives the topic's metadata
        def send(self, *args, **kwargs):
            raise KafkaTimeoutError("Failed to update metadata after 60.0 secs.")

    lease = Lease("runner", 3, None, "p:pipeline", "j", "{}", None, {}, {}, 10.0)
    with pytest.raises(KafkaUnavailableError, match="publishing the lease of generation 3 failed: .*metadata"):
        send_event(NoMetadata(), "spark-abs.j.control", lease, 1.0, "the lease of generation 3")
    with pytest.raises(KafkaUnavailableError, match="publishing a lease event failed"):  # no checkpoint to name
        send_event(NoMetadata(), "spark-abs.j.control", lease)


def _read(kafka: KafkaAccess, topic: str, partition: int):
    consumer = KafkaConsumer(**kafka.client_options(), enable_auto_commit=False, consumer_timeout_ms=3000)
    tp = TopicPartition(topic, partition)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    records = list(consumer)
    consumer.close()
    return records


@pytest.mark.integration
def test_markers_land_after_everything_sent_before_them(connection, unique_name):
    create_topic(connection.kafka, unique_name, 2)
    producer = KafkaProducer(**connection.kafka.client_options())
    for i in range(5):
        producer.send(unique_name, value=b"x", partition=i % 2)
    offsets = append_markers(producer, [ChannelId(unique_name, 0), ChannelId(unique_name, 1)], [("m", b"1")])
    producer.close()
    assert offsets == {ChannelId(unique_name, 0): 3, ChannelId(unique_name, 1): 2}
    last = _read(connection.kafka, unique_name, 0)[-1]
    assert (last.offset, last.headers) == (3, [("m", b"1")])


@pytest.mark.integration
def test_control_topic_delivers_events_in_order_and_counts_garbage(connection, unique_name):
    control = ControlTopic(connection.kafka, unique_name)
    reader = ControlTopic(connection.kafka, unique_name)
    first = control.publish(Trigger(checkpoint_id=1, generation=0))
    KafkaProducer(**connection.kafka.client_options()).send(control.topic, value=b"garbage", partition=0).get(10)
    control.publish(Progress(task="t0", generation=0, positions={"a:0": 4}))
    seen = reader.wait_for(lambda e: e.kind == "progress", timeout_s=20)
    assert [(e.kind, e.offset) for e in seen] == [("trigger", first), ("progress", first + 2)]
    assert seen[1].positions == {"a:0": 4}
    assert reader.malformed == 1
    control.close()
    reader.close()


@pytest.mark.integration
def test_dead_letters_keep_the_record_and_its_reason(connection, unique_name):
    letters = DeadLetters(connection.kafka, unique_name)
    letters.send(ChannelId("in", 1), 42, b"k", b"{broken", [("h", b"v")], "value is not JSON")
    letters.flush()
    assert letters.count == 1
    (record,) = _read(connection.kafka, letters.topic, 0)
    headers = dict(record.headers)
    assert (record.key, record.value) == (b"k", b"{broken")
    assert headers["spark-abs-reason"] == b"value is not JSON"
    assert (headers["spark-abs-source"], headers["spark-abs-source-offset"], headers["h"]) == (b"in:1", b"42", b"v")
    letters.close()


class _Future:
    def __init__(self):
        self.errbacks = []

    def add_errback(self, f, *args):
        self.errbacks.append(lambda exc: f(*args, exc))
        return self

    def fail(self, exc):
        for errback in self.errbacks:
            errback(exc)


class _Producer:
    """kafka-python's producer as CheckedSends sees it: sends give futures;
    ``flush`` returns once each is done, failed ones too."""

    def __init__(self, flush_takes_s: float = 0.0):
        self.futures: list[_Future] = []
        self.flush_takes_s = flush_takes_s

    def send(self, topic, **record):
        self.futures.append(_Future())
        return self.futures[-1]

    def flush(self, timeout=None):
        from kafka.errors import KafkaTimeoutError

        if timeout is not None and self.flush_takes_s > timeout:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")


def test_a_send_that_failed_fails_the_next_flush_and_every_send_after_it():
    from kafka.errors import KafkaTimeoutError

    from streaming.adapters.kafka_io import CheckedSends
    from streaming.errors import KafkaUnavailableError

    producer = _Producer()
    sends = CheckedSends(producer, "the tasks' records", bound_s=5.0)
    sends.send("orders", value=b"1", partition=0)
    sends.send("orders", value=b"2", partition=1)
    sends.flush()  # both still in flight or delivered: nothing failed
    producer.futures[1].fail(KafkaTimeoutError("Expiring 1 record(s) for orders-1: 120000 ms has passed"))
    with pytest.raises(KafkaUnavailableError, match="a send of the tasks' records to orders failed.*Expiring 1"):
        sends.flush()
    with pytest.raises(KafkaUnavailableError, match="restores from its latest checkpoint"):
        sends.send("orders", value=b"3", partition=0)


def test_a_flush_kafka_does_not_finish_within_the_bound_names_the_bound():
    from streaming.adapters.kafka_io import CheckedSends
    from streaming.errors import KafkaUnavailableError

    sends = CheckedSends(_Producer(flush_takes_s=1e9), "dead letters", bound_s=0.5)
    with pytest.raises(KafkaUnavailableError, match=r"did not take dead letters within 0.5 s \(the delivery timeout"):
        sends.flush()


def test_a_call_without_a_timeout_is_waited_for_within_a_bound():
    import threading

    from streaming.adapters.kafka_io import within
    from streaming.errors import KafkaUnavailableError

    assert within(lambda: 7, 1.0, "a quick call") == 7
    never = threading.Event()
    with pytest.raises(KafkaUnavailableError, match="committing epoch 3 did not finish within 0.2 s"):
        within(never.wait, 0.2, "committing epoch 3")
    with pytest.raises(ZeroDivisionError):
        within(lambda: 1 / 0, 1.0, "a failing call")
