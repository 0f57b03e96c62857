"""Writing to Kafka: markers land after everything sent before them (on a
real broker), a failed send fails every flush after it, and every wait on
the broker is bounded."""

from __future__ import annotations

import pytest
from kafka import KafkaProducer
from kafka.errors import KafkaTimeoutError

from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.kafka.producer import append_markers
from streaming.errors import KafkaUnavailableError


@pytest.mark.integration
def test_markers_land_after_everything_sent_before_them(connection, unique_name, read_partition):
    create_topic(connection.kafka, unique_name, 2)
    producer = KafkaProducer(**connection.kafka.client_options())
    for i in range(5):
        producer.send(unique_name, value=b"x", partition=i % 2)
    markers = {ChannelId(unique_name, 0): [("m", b"0")], ChannelId(unique_name, 1): [("m", b"1")]}
    offsets = append_markers(producer, markers)
    producer.close()
    assert offsets == {ChannelId(unique_name, 0): 3, ChannelId(unique_name, 1): 2}
    for partition, offset in ((0, 3), (1, 2)):  # each channel's marker carries its own headers
        last = read_partition(connection.kafka, unique_name, partition)[-1]
        assert (last.offset, last.headers) == (offset, [("m", str(partition).encode())])


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

        if timeout is not None and self.flush_takes_s > timeout:
            raise KafkaTimeoutError(f"Timeout after waiting for {timeout} secs.")


def test_a_send_that_failed_fails_the_next_flush_and_every_send_after_it():

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

    sends = CheckedSends(_Producer(flush_takes_s=1e9), "dead letters", bound_s=0.5)
    with pytest.raises(KafkaUnavailableError, match=r"did not take dead letters within 0.5 s \(the delivery timeout"):
        sends.flush()


def test_a_call_without_a_timeout_is_waited_for_within_a_bound():
    import threading

    from streaming.adapters.kafka.producer import within

    assert within(lambda: 7, 1.0, "a quick call") == 7
    never = threading.Event()
    with pytest.raises(KafkaUnavailableError, match="committing epoch 3 did not finish within 0.2 s"):
        within(never.wait, 0.2, "committing epoch 3")
    with pytest.raises(ZeroDivisionError):
        within(lambda: 1 / 0, 1.0, "a failing call")
