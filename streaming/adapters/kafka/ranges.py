"""Offset ranges of one channel read back in bulk, as Arrow tables of
``RECORD_SCHEMA`` (unaligned channel state, a dead letter's original
record), all within one bound."""

from __future__ import annotations

import logging
from typing import TypeVar

import pyarrow as pa
from kafka import TopicPartition
from kafka.errors import KafkaError

from barriers.messages import ChannelId
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.serde.records import RECORD_SCHEMA
from streaming.api.config import KafkaAccess
from streaming.errors import KafkaUnavailableError
from streaming.waits import Deadline

__all__ = ["read_range", "read_to_end", "retention_ms", "topic_config"]

log = logging.getLogger(__name__)


T = TypeVar("T")


def read_range(
    kafka: KafkaAccess, channel: ChannelId, start: int, end: int, *, timeout_s: float = 60.0, to_end: bool = False
) -> pa.Table:
    """The records at offsets ``[start, end)`` of ``channel``, read in bulk
    (offsets without a record, e.g. transaction markers, are simply absent),
    all within ``timeout_s``.  ``to_end``: ``end`` may lie past the
    partition's end, which then ends the range (else the read waits for
    records to come up to it)."""
    if end <= start:
        return RECORD_SCHEMA.empty_table()
    deadline = Deadline(timeout_s)
    consumer = kafka_clients.consumer(
        kafka,
        enable_auto_commit=False,
        max_poll_records=5000,
        client_id="spark-abs-range",
    )
    tp = TopicPartition(channel.topic, channel.partition)
    rows: list[dict] = []

    try:
        consumer.assign([tp])
        first = consumer.beginning_offsets([tp], timeout_ms=deadline.left_ms())[tp]
        if to_end:
            end = min(end, consumer.end_offsets([tp], timeout_ms=deadline.left_ms())[tp])
            if end <= start:
                return RECORD_SCHEMA.empty_table()
        if first > start:
            raise KafkaUnavailableError(
                f"{channel}: offsets [{start}, {end}) are no longer in Kafka "
                f"(the partition starts at {first}; retention removed them)"
            )
        consumer.seek(tp, start)
        at: int | None = start
        while at is not None and at < end:
            if deadline.passed():
                raise KafkaUnavailableError(
                    f"{channel}: reading offsets [{start}, {end}) took over {timeout_s:.0f} s (at {at})"
                )
            for record in consumer.poll(timeout_ms=500).get(tp, []):
                if record.offset >= end:
                    break
                rows.append(
                    {
                        "topic": channel.topic,
                        "partition": channel.partition,
                        "offset": record.offset,
                        "key": record.key,
                        "value": record.value,
                        "headers": [{"key": k, "value": v} for k, v in record.headers],
                        "timestamp": record.timestamp,
                    }
                )
            at = consumer.position(tp, timeout_ms=deadline.left_ms())
        if at is None:
            raise KafkaUnavailableError(
                f"{channel}: reading offsets [{start}, {end}): Kafka did not say where the read got within "
                f"{timeout_s:.0f} s"
            )
    except KafkaError as exc:
        raise kafka_clients.refusal(
            kafka, exc, f"to read topic {channel.topic}", f"{channel}: reading offsets [{start}, {end}) failed"
        ) from exc
    finally:
        consumer.close()
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


def topic_config(kafka: KafkaAccess, topic: str, name: str) -> str | None:
    """The value of the topic's setting ``name`` (None: unknown, said in the log)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    from streaming.adapters.kafka.admin import admin_client

    admin = admin_client(kafka)
    try:
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="All")
        return str(result["topic"][topic][name]["value"])
    except (KafkaError, KeyError, ValueError, TypeError) as exc:
        log.warning("%s of topic %s unknown: %s", name, topic, exc)
    finally:
        admin.close()
    return None


def retention_ms(kafka: KafkaAccess, topic: str) -> int | None:
    """The topic's ``retention.ms`` (None: unlimited or unknown)."""
    value = topic_config(kafka, topic, "retention.ms")
    try:
        return None if value is None or int(value) < 0 else int(value)
    except ValueError:
        log.warning("retention of topic %s unknown: retention.ms is %r", topic, value)
        return None


def read_to_end(kafka: KafkaAccess, topic: str, timeout_ms: int) -> list:
    """Every committed record of ``topic`` (read_committed), partition by
    partition in offset order, up to the end offsets when the read began;
    none when the topic does not exist."""
    consumer = kafka_clients.consumer(
        kafka,
        isolation_level="read_committed",
        enable_auto_commit=False,
    )
    try:
        partitions = [TopicPartition(topic, p) for p in sorted(consumer.partitions_for_topic(topic) or [])]
        if not partitions:
            return []
        consumer.assign(partitions)
        consumer.seek_to_beginning(*partitions)
        ends = consumer.end_offsets(partitions)
        records: dict[TopicPartition, list] = {tp: [] for tp in partitions}
        # an open transaction keeps a read_committed reader below the end: stop when nothing comes
        while any(consumer.position(tp) < ends[tp] for tp in partitions):
            batch = consumer.poll(timeout_ms=timeout_ms)
            if not batch:
                break
            for tp, got in batch.items():
                records[tp].extend(got)
        return [r for tp in partitions for r in records[tp]]
    finally:
        consumer.close()
