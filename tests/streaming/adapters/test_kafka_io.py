"""Kafka transport of the protocol on a real broker: marker offsets, the
control topic, dead letters."""

from __future__ import annotations

import hashlib

import pytest
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaTimeoutError

from barriers.headers import SIGNATURE_HEADER
from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.kafka.control.events import Ack, Complete, ControlEvent, Lease, Progress, Trigger
from streaming.adapters.kafka.control.signing import RejectedEvent, verified_event
from streaming.adapters.kafka.control.transport import ControlTopic, send_event
from streaming.adapters.kafka.dead_letters import DeadLetterTopic, fit_dead_letter
from streaming.adapters.kafka.producer import append_markers
from streaming.adapters.snapshots import TaskCheckpointMetrics
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.errors import ConfigError, KafkaUnavailableError


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
        send_event(NoMetadata(), "spark-abs.j.control", lease, KEY, 1.0, "the lease of generation 3")
    with pytest.raises(KafkaUnavailableError, match="publishing a lease event failed"):  # no checkpoint to name
        send_event(NoMetadata(), "spark-abs.j.control", lease, KEY)


KEY = JobKey.derive("a secret of the job's operator, long enough", "j")


def test_only_events_signed_with_the_jobs_key_verify():
    topic = "spark-abs.j.control"
    event = Complete(checkpoint_id=4, generation=1)
    value = event.encode()
    signed = [(SIGNATURE_HEADER, KEY.sign(topic.encode(), value).encode())]
    assert verified_event(topic, KEY, value, signed, 12) == event
    other_job = JobKey.derive("a secret of the job's operator, long enough", "k")
    other_secret = JobKey.derive("another operator's secret, just as long", "j")
    forged = Complete(checkpoint_id=5, generation=1).encode()
    cases = [
        (value, [], "unsigned", "unsigned"),
        (forged, signed, "signature", "does not match"),  # a genuine signature on other bytes
        (value, [(SIGNATURE_HEADER, other_job.sign(topic.encode(), value).encode())], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, other_secret.sign(topic.encode(), value).encode())], "signature", "does not"),
        (value, signed + signed, "signature", "does not match"),
        # a made-up signature of any bytes is rejected, never an error of another kind
        (value, [(SIGNATURE_HEADER, b"\xff")], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, "é".encode())], "signature", "does not match"),
        (value, [(SIGNATURE_HEADER, None)], "signature", "does not match"),
        (b"{}", [(SIGNATURE_HEADER, KEY.sign(topic.encode(), b"{}").encode())], "malformed", "checkpoint_id"),
    ]
    for data, headers, kind, reason in cases:
        with pytest.raises(RejectedEvent, match=reason) as rejected:
            verified_event(topic, KEY, data, headers)
        assert rejected.value.kind == kind
    # the same event on another job's topic does not verify either
    with pytest.raises(RejectedEvent, match="does not match"):
        verified_event("spark-abs.k.control", KEY, value, signed)


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
def test_control_topic_delivers_signed_events_in_order_and_counts_the_rest(connection, unique_name):
    key = connection.job_key(unique_name)
    control = ControlTopic(connection.kafka, unique_name, key)
    heard: list[str] = []
    reader = ControlTopic(connection.kafka, unique_name, key, on_rejected=heard.append)
    first = control.publish(Trigger(checkpoint_id=1, generation=0))
    # anyone else who can write to the topic: garbage, and a well-formed event without the job's key
    forger = KafkaProducer(**connection.kafka.client_options())
    forger.send(control.topic, value=b"garbage", partition=0).get(10)
    forger.send(control.topic, value=Complete(checkpoint_id=1, generation=0).encode(), partition=0).get(10)
    stranger = JobKey.derive("not the secret of this job's operator", unique_name)
    forger.send(
        control.topic,
        value=(forged := Complete(checkpoint_id=2, generation=0).encode()),
        headers=[(SIGNATURE_HEADER, stranger.sign(control.topic.encode(), forged).encode())],
        partition=0,
    ).get(10)
    forger.close()
    control.publish(Progress(task="t0", generation=0, positions={"a:0": 4}))
    seen = reader.wait_for(lambda e: e.kind == "progress", timeout_s=20)
    assert [(e.kind, e.offset) for e in seen] == [("trigger", first), ("progress", first + 4)]
    assert seen[1].positions == {"a:0": 4}
    assert reader.rejected == {"unsigned": 2, "signature": 1}
    assert sorted(heard) == ["signature", "unsigned", "unsigned"]
    with pytest.raises(ConfigError, match="needs that job's key"):
        ControlTopic(connection.kafka, unique_name, stranger.derive("x" * 40, "another"))
    control.close()
    reader.close()


@pytest.mark.integration
def test_dead_letters_keep_the_record_and_its_reason(connection, unique_name):
    letters = DeadLetterTopic(connection.kafka, unique_name)
    letters.send(ChannelId("in", 1), 42, b"k", b"{broken", [("h", b"v")], "value is not JSON")
    # a record larger than the producer may send is kept truncated, with a note, not lost and
    # not failing the task (before: kafka-python refused it, MessageSizeTooLargeError)
    huge = bytes(range(256)) * 8192  # 2 MiB
    letters.send(ChannelId("in", 0), 7, b"k", huge, [("h", b"v")], "value is not JSON")
    letters.flush()
    assert letters.count == 2
    record, cut = _read(connection.kafka, letters.topic, 0)
    headers = dict(record.headers)
    assert (record.key, record.value) == (b"k", b"{broken")
    assert headers["spark-abs-reason"] == b"value is not JSON" and "spark-abs-truncated" not in headers
    assert (headers["spark-abs-source"], headers["spark-abs-source-offset"], headers["h"]) == (b"in:1", b"42", b"v")

    headers = dict(cut.headers)
    assert 900_000 < len(cut.value) < 1 << 20 and huge.startswith(cut.value)
    assert headers["spark-abs-truncated"] == b"value"
    assert headers["spark-abs-original-bytes"] == str(len(huge)).encode()
    assert headers["spark-abs-original-sha256"] == hashlib.sha256(huge).hexdigest().encode()
    assert headers["spark-abs-reason"] == b"value is not JSON" and headers["h"] == b"v"
    letters.close()


def test_a_dead_letter_too_large_to_send_is_cut_with_a_note_of_what_it_was():
    notes = [("spark-abs-reason", b"value is not JSON")]
    assert fit_dead_letter(b"k", b"v" * 100, [("h", b"x")], notes, 1000) == (b"k", b"v" * 100, [("h", b"x"), *notes])

    value = bytes(range(256)) * 40
    key, cut, headers = fit_dead_letter(b"k", value, [("h", b"x")], notes, 4000)
    said = dict(headers)
    assert key == b"k" and value.startswith(cut) and 3000 < len(cut) < 4000
    assert said["spark-abs-truncated"] == b"value" and said["h"] == b"x"
    assert said["spark-abs-original-bytes"] == b"10240"
    assert said["spark-abs-original-sha256"] == hashlib.sha256(value).hexdigest().encode()

    # headers alone over the size: they go too, and the key is cut
    key, cut, headers = fit_dead_letter(b"k" * 5000, value, [("h", b"x" * 5000)], notes, 4000)
    said = dict(headers)
    assert said["spark-abs-truncated"] == b"value,headers,key" and "h" not in said
    assert len(key) == 1000 and value.startswith(cut)
    assert sum(len(k) + len(v) for k, v in headers) + len(key) + len(cut) < 4000


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

    from streaming.adapters.kafka.producer import CheckedSends
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
    from streaming.adapters.kafka.producer import CheckedSends
    from streaming.errors import KafkaUnavailableError

    sends = CheckedSends(_Producer(flush_takes_s=1e9), "dead letters", bound_s=0.5)
    with pytest.raises(KafkaUnavailableError, match=r"did not take dead letters within 0.5 s \(the delivery timeout"):
        sends.flush()


def test_a_call_without_a_timeout_is_waited_for_within_a_bound():
    import threading

    from streaming.adapters.kafka.producer import within
    from streaming.errors import KafkaUnavailableError

    assert within(lambda: 7, 1.0, "a quick call") == 7
    never = threading.Event()
    with pytest.raises(KafkaUnavailableError, match="committing epoch 3 did not finish within 0.2 s"):
        within(never.wait, 0.2, "committing epoch 3")
    with pytest.raises(ZeroDivisionError):
        within(lambda: 1 / 0, 1.0, "a failing call")
