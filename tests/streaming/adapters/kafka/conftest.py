"""Fixtures of the Kafka adapter's tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from kafka import KafkaConsumer, TopicPartition

from streaming.api.config import KafkaAccess


@pytest.fixture
def read_partition() -> Callable[[KafkaAccess, str, int], list]:
    """Every record of a topic's partition, read from its beginning (3 s without a record ends the read)."""

    def read(kafka: KafkaAccess, topic: str, partition: int) -> list:
        consumer = KafkaConsumer(**kafka.client_options(), enable_auto_commit=False, consumer_timeout_ms=3000)
        tp = TopicPartition(topic, partition)
        consumer.assign([tp])
        consumer.seek_to_beginning(tp)
        records = list(consumer)
        consumer.close()
        return records

    return read
