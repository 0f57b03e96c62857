"""The job's control topic: how the coordinator and the tasks talk.

One partition, so every reader sees the events in one order.  Events are
JSON (``ControlEvent``); their kinds (``ControlKind``):

- ``trigger``: the coordinator injected barrier n; the ingress offsets it got
  and the barrier's headers (an unaligned task may snapshot on it);
- ``announce``: a task forwarded barrier n; the offsets on its outputs;
- ``ready``: a task's query runs (the coordinator triggers once all are);
  ``replaying``: records of restored channel state it has still to read;
- ``replayed``: a restored task has processed its channel state again;
- ``progress``: a task's position on each input channel, twice a second (lag);
- ``ack`` / ``decline``: a task's snapshot is uploaded, or it cannot take one;
- ``complete`` / ``abort``: the coordinator's verdict on checkpoint n;
- ``committed``: a sink task made epoch n visible;
- ``lease``: the runner is alive, and which worker runs each remote group in
  which generation (``streaming.engine.membership``);
- ``heartbeat``: a remote worker (``spark-abs worker``) is alive.

Every event carries the generation it belongs to in its payload; readers
ignore other generations."""

from __future__ import annotations

import enum
import json
import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from kafka import KafkaConsumer, KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from streaming.adapters.kafka_admin import create_topic
from streaming.adapters.kafka_io import DELIVERY_BOUND_S, patiently, producer
from streaming.adapters.records import Headers
from streaming.errors import ConfigError, KafkaUnavailableError, parse_choice

__all__ = [
    "ControlKind",
    "ControlEvent",
    "ControlTopic",
    "control_topic_name",
    "send_event",
    "announced_barrier",
    "announced_headers",
]

log = logging.getLogger(__name__)


def control_topic_name(job: str) -> str:
    return f"spark-abs.{job}.control"


class ControlKind(enum.StrEnum):
    """What a control event says (see the module docstring)."""

    READY = "ready"
    REPLAYED = "replayed"
    PROGRESS = "progress"
    TRIGGER = "trigger"
    ANNOUNCE = "announce"
    ACK = "ack"
    DECLINE = "decline"
    COMPLETE = "complete"
    ABORT = "abort"
    COMMITTED = "committed"
    LEASE = "lease"
    HEARTBEAT = "heartbeat"

    @classmethod
    def parse(cls, value: object) -> ControlKind:
        """The kind named ``value``; a ``ConfigError`` naming the known ones otherwise."""
        return parse_choice(cls, value, "control event kind")


@dataclass(frozen=True, slots=True)
class ControlEvent:
    """One message on the job's control topic."""

    kind: ControlKind
    checkpoint_id: int
    task: str = ""
    payload: Mapping[str, Any] = field(default_factory=dict)
    offset: int = -1  # position on the control topic, set when read

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", ControlKind.parse(self.kind))

    def encode(self) -> bytes:
        return json.dumps(
            {
                "kind": self.kind.value,
                "checkpoint_id": self.checkpoint_id,
                "task": self.task,
                "payload": dict(self.payload),
            },
            sort_keys=True,
        ).encode()

    @classmethod
    def decode(cls, data: bytes, offset: int = -1) -> ControlEvent:
        """Raises ValueError with the reason for anything that is not a control event."""
        try:
            raw = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"control message is not JSON: {exc}") from exc
        if not isinstance(raw, dict) or not isinstance(raw.get("checkpoint_id"), int):
            raise ValueError("control message lacks an integer checkpoint_id")
        try:
            return cls(
                kind=str(raw.get("kind")),
                checkpoint_id=raw["checkpoint_id"],
                task=str(raw.get("task", "")),
                payload=dict(raw.get("payload") or {}),
                offset=offset,
            )
        except ConfigError as exc:
            raise ValueError(str(exc)) from exc


def send_event(
    producer: KafkaProducer,
    topic: str,
    event: ControlEvent,
    timeout_s: float = DELIVERY_BOUND_S,
    what: str | None = None,
) -> int:
    """Send ``event`` to the control topic ``topic`` on ``producer`` and wait
    until Kafka has it: while the broker is unreachable, up to ``timeout_s``,
    saying so (``kafka_io.patiently``); then a ``KafkaUnavailableError``
    naming ``what`` (by default the event's kind and checkpoint).  Returns
    its offset."""
    what = what or f"{event.kind.value} of checkpoint {event.checkpoint_id}"
    try:
        future = producer.send(topic, value=event.encode(), partition=0)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"publishing {what} failed: {exc}") from exc
    return patiently(future.get, what, timeout_s).offset


class ControlTopic:
    """The job's control topic: one partition, so every reader sees events in
    one order.  ``publish`` is synchronous (returns the event's offset);
    ``poll`` returns the events after the last one read, skipping (and
    logging, and counting) messages that are not control events."""

    def __init__(self, bootstrap: str, job: str, *, start_at: int = 0):
        self.topic = control_topic_name(job)
        create_topic(bootstrap, self.topic, 1)
        self._producer = producer(bootstrap)
        self._consumer = KafkaConsumer(
            bootstrap_servers=bootstrap, enable_auto_commit=False, client_id=f"spark-abs-control-{job}"
        )
        self._tp = TopicPartition(self.topic, 0)
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, start_at)
        self.malformed = 0

    def seek_to_end(self) -> int:
        """Skip everything published so far; returns the position."""
        end = self._consumer.end_offsets([self._tp])[self._tp]
        self._consumer.seek(self._tp, end)
        return end

    def publish(self, event: ControlEvent, timeout_s: float = DELIVERY_BOUND_S) -> int:
        """Send ``event`` and wait until Kafka has it (``send_event``)."""
        return send_event(self._producer, self.topic, event, timeout_s)

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

    def wait_for(self, predicate: Callable[[ControlEvent], bool], timeout_s: float) -> list[ControlEvent]:
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


def announced_barrier(headers: Headers) -> dict[str, str]:
    """A barrier's headers as JSON-friendly text, for the ``trigger`` and
    ``announce`` events; ``announced_headers`` is the way back."""
    return {name: value.decode() for name, value in headers}


def announced_headers(payload: Mapping[str, Any]) -> list[tuple[str, bytes]]:
    """The barrier headers an announcement carries (see ``announced_barrier``)."""
    return [(name, str(value).encode()) for name, value in payload.items()]
