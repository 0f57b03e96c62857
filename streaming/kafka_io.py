"""Kafka transport of the protocol: markers appended to every channel of a
topic (the offsets Kafka gives back are the barrier positions), the job's
control topic (announcements, acknowledgements, declines, completions), and
the dead-letter topic where malformed input goes with its reason.

What a barrier's headers say is the business of ``barriers``; this module only
moves bytes and reports offsets."""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

import pyarrow as pa
from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from streaming.channels import Channel
from streaming.errors import ConfigError
from streaming.kafka_admin import KafkaUnavailableError, create_topic

__all__ = [
    "RECORD_SCHEMA",
    "read_range",
    "retention_ms",
    "Headers",
    "ControlEvent",
    "ControlTopic",
    "DeadLetters",
    "append_markers",
    "control_topic_name",
    "dead_letter_topic_name",
]

log = logging.getLogger(__name__)

Headers = Sequence[tuple[str, bytes]]

CONTROL_KINDS = ("ready", "announce", "ack", "decline", "complete", "committed", "abort", "trigger")


# Records read straight from Kafka, in the shape a stage query hands them over.
RECORD_SCHEMA = pa.schema([("topic", pa.string()), ("partition", pa.int32()), ("offset", pa.int64()),
                           ("key", pa.binary()), ("value", pa.binary()),
                           ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
                           ("timestamp", pa.timestamp("ms"))])


def read_range(bootstrap: str, channel: Channel, start: int, end: int, *, timeout_s: float = 60.0) -> pa.Table:
    """The records at offsets ``[start, end)`` of ``channel``, read in bulk
    (offsets without a record, e.g. transaction markers, are simply absent)."""
    if end <= start:
        return RECORD_SCHEMA.empty_table()
    consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False, max_poll_records=5000,
                             client_id="spark-abs-range")
    tp = TopicPartition(channel.topic, channel.partition)
    rows: list[dict] = []
    try:
        consumer.assign([tp])
        first = consumer.beginning_offsets([tp])[tp]
        if first > start:
            raise KafkaUnavailableError(f"{channel}: offsets [{start}, {end}) are no longer in Kafka "
                                        f"(the partition starts at {first}; retention removed them)")
        consumer.seek(tp, start)
        deadline = time.monotonic() + timeout_s
        while consumer.position(tp) < end:
            if time.monotonic() > deadline:
                raise KafkaUnavailableError(f"{channel}: reading offsets [{start}, {end}) took over {timeout_s:.0f} s "
                                            f"(at {consumer.position(tp)})")
            for record in consumer.poll(timeout_ms=500).get(tp, []):
                if record.offset >= end:
                    break
                rows.append({"topic": channel.topic, "partition": channel.partition, "offset": record.offset,
                             "key": record.key, "value": record.value,
                             "headers": [{"key": k, "value": v} for k, v in record.headers],
                             "timestamp": record.timestamp})
    except KafkaError as exc:
        raise KafkaUnavailableError(f"{channel}: reading offsets [{start}, {end}) failed: {exc}") from exc
    finally:
        consumer.close()
    return pa.Table.from_pylist(rows, schema=RECORD_SCHEMA)


def retention_ms(bootstrap: str, topic: str) -> int | None:
    """The topic's ``retention.ms`` (None: unlimited or unknown)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    from streaming.kafka_admin import admin_client

    admin = admin_client(bootstrap)
    try:
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="All")
        value = int(result["topic"][topic]["retention.ms"]["value"])
        return None if value < 0 else value
    except (KafkaError, KeyError, ValueError, TypeError) as exc:
        log.warning("retention of topic %s unknown: %s", topic, exc)
    finally:
        admin.close()
    return None


def control_topic_name(job: str) -> str:
    return f"spark-abs.{job}.control"


def dead_letter_topic_name(job: str) -> str:
    return f"spark-abs.{job}.dead-letters"


def _producer(bootstrap: str, **extra: Any) -> KafkaProducer:
    try:
        return KafkaProducer(bootstrap_servers=bootstrap, acks="all", linger_ms=0, **extra)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"cannot open a Kafka producer on {bootstrap}: {exc}") from exc


def append_markers(producer: KafkaProducer, channels: Iterable[Channel], headers: Headers,
                   timeout_s: float = 30.0) -> dict[Channel, int]:
    """Append one empty record carrying ``headers`` to each channel and return
    the offset each got.  Everything sent to a channel before this call comes
    before the marker (the producer is flushed first)."""
    producer.flush(timeout=timeout_s)
    futures = {c: producer.send(c.topic, value=b"", headers=list(headers), partition=c.partition)
               for c in channels}
    offsets = {}
    for channel, future in futures.items():
        try:
            offsets[channel] = future.get(timeout=timeout_s).offset
        except KafkaError as exc:
            raise KafkaUnavailableError(f"appending a marker to {channel} failed: {exc}") from exc
    return offsets


@dataclass(frozen=True, slots=True)
class ControlEvent:
    """One message on the job's control topic."""

    kind: str
    checkpoint_id: int
    task: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    offset: int = -1  # position on the control topic, set when read

    def __post_init__(self) -> None:
        if self.kind not in CONTROL_KINDS:
            raise ConfigError(f"control event kind {self.kind!r} is not one of {', '.join(CONTROL_KINDS)}")

    def encode(self) -> bytes:
        return json.dumps({"kind": self.kind, "checkpoint_id": self.checkpoint_id, "task": self.task,
                           "payload": dict(self.payload)}, sort_keys=True).encode()

    @classmethod
    def decode(cls, data: bytes, offset: int = -1) -> "ControlEvent":
        """Raises ValueError with the reason for anything that is not a control event."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"control message is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("checkpoint_id"), int):
            raise ValueError("control message lacks an integer checkpoint_id")
        try:
            return cls(kind=str(raw.get("kind")), checkpoint_id=raw["checkpoint_id"],
                       task=str(raw.get("task", "")), payload=dict(raw.get("payload") or {}), offset=offset)
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc


class ControlTopic:
    """The job's control topic: one partition, so every reader sees events in
    one order.  ``publish`` is synchronous (returns the event's offset);
    ``poll`` returns the events after the last one read, skipping (and
    logging, and counting) messages that are not control events."""

    def __init__(self, bootstrap: str, job: str, *, start_at: int = 0):
        self.topic = control_topic_name(job)
        create_topic(bootstrap, self.topic, 1)
        self._producer = _producer(bootstrap)
        self._consumer = KafkaConsumer(bootstrap_servers=bootstrap, enable_auto_commit=False,
                                       client_id=f"spark-abs-control-{job}")
        self._tp = TopicPartition(self.topic, 0)
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, start_at)
        self.malformed = 0

    def seek_to_end(self) -> int:
        """Skip everything published so far; returns the position."""
        end = self._consumer.end_offsets([self._tp])[self._tp]
        self._consumer.seek(self._tp, end)
        return end

    def publish(self, event: ControlEvent, timeout_s: float = 30.0) -> int:
        try:
            return self._producer.send(self.topic, value=event.encode(), partition=0).get(timeout=timeout_s).offset
        except KafkaError as exc:
            raise KafkaUnavailableError(f"publishing {event.kind} of checkpoint {event.checkpoint_id} "
                                        f"failed: {exc}") from exc

    def poll(self, timeout_s: float = 0.0) -> list[ControlEvent]:
        events = []
        for records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for record in records:
                try:
                    events.append(ControlEvent.decode(record.value, record.offset))
                except ValueError as reason:
                    self.malformed += 1
                    log.warning("control topic %s offset %d: ignored: %s", self.topic, record.offset, reason)
        return events

    def wait_for(self, predicate, timeout_s: float) -> list[ControlEvent]:
        """Poll until an event satisfies ``predicate``; return all events read."""
        seen: list[ControlEvent] = []
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            batch = self.poll(0.2)
            seen.extend(batch)
            if any(predicate(e) for e in batch):
                return seen
        return seen

    def close(self) -> None:
        self._producer.close()
        self._consumer.close()


class DeadLetters:
    """Malformed input, kept with its reason: the original key, value and
    headers, plus ``spark-abs-reason``, ``spark-abs-source`` (channel) and
    ``spark-abs-source-offset`` headers.  ``count`` says how many were sent."""

    def __init__(self, bootstrap: str, job: str):
        self.topic = dead_letter_topic_name(job)
        create_topic(bootstrap, self.topic, 1)
        self._producer = _producer(bootstrap)
        self.count = 0

    def send(self, channel: Channel, offset: int, key: bytes | None, value: bytes | None,
             headers: Headers, reason: str) -> None:
        extra = [("spark-abs-reason", reason.encode()), ("spark-abs-source", str(channel).encode()),
                 ("spark-abs-source-offset", str(offset).encode())]
        self._producer.send(self.topic, key=key, value=value, headers=list(headers) + extra, partition=0)
        self.count += 1
        log.warning("dead letter from %s offset %d: %s", channel, offset, reason)

    def flush(self, timeout_s: float = 30.0) -> None:
        self._producer.flush(timeout=timeout_s)

    def close(self) -> None:
        self._producer.close()
