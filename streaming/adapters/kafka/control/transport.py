"""The job's control topic on Kafka: how the coordinator and the tasks talk.

One partition, so every reader sees the events (``events``) in one order.
``send_event`` signs (``signing``) and publishes one, waiting for Kafka
within the delivery timeout; ``ControlTopic`` publishes and polls, skipping
the records that do not verify: logged with their offset and reason, and
counted (``ControlTopic.rejected``, and a metric by the engine)."""

from __future__ import annotations

import collections
import logging
from collections.abc import Callable

from kafka import KafkaProducer, TopicPartition
from kafka.errors import KafkaError

from barriers.headers import SIGNATURE_HEADER
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import admin_client, create_topic
from streaming.adapters.kafka.control.events import ControlEvent
from streaming.adapters.kafka.control.signing import RejectedEvent, verified_event
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S, close_producer, patiently, producer
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.topics import control_topic, control_topic_job
from streaming.errors import ConfigError, KafkaUnavailableError
from streaming.waits import Deadline

__all__ = ["ControlTopic", "control_jobs", "newest_generation", "send_event"]

log = logging.getLogger(__name__)


# the rejected records of a kind a reader logs one by one, before it logs every hundredth
LOGGED_REJECTIONS = 5


def control_jobs(kafka: KafkaAccess) -> list[str]:
    """The jobs with a control topic on ``kafka`` (each started once there), by name."""
    admin = admin_client(kafka)
    try:
        topics = admin.list_topics()
    except KafkaError as exc:
        raise KafkaUnavailableError(f"listing the topics failed: {exc}") from exc
    finally:
        admin.close()
    return sorted(job for job in map(control_topic_job, topics) if job is not None)


def send_event(
    producer: KafkaProducer,
    topic: str,
    event: ControlEvent,
    key: JobKey,
    timeout_s: float = DELIVERY_BOUND_S,
    what: str | None = None,
) -> int:
    """Send ``event``, signed with ``key``, to the control topic ``topic``
    on ``producer`` and wait until Kafka has it: while the broker is
    unreachable, up to ``timeout_s``, saying so (``producer.patiently``);
    then a ``KafkaUnavailableError`` naming ``what`` (by default the event's
    kind and checkpoint).  Returns its offset."""
    checkpoint_id = getattr(event, "checkpoint_id", None)
    what = what or (
        f"{event.kind.value} of checkpoint {checkpoint_id}" if checkpoint_id else f"a {event.kind.value} event"
    )
    value = event.encode()
    signature = key.sign(topic.encode(), value).encode()
    try:
        future = producer.send(topic, value=value, headers=[(SIGNATURE_HEADER, signature)], partition=0)
    except KafkaError as exc:
        raise KafkaUnavailableError(f"publishing {what} failed: {exc}") from exc
    return patiently(future.get, what, timeout_s).offset


class ControlTopic:
    """The job's control topic: one partition, so every reader sees events in
    one order.  ``publish`` is synchronous (returns the event's offset);
    ``poll`` returns the events after the last one read that verify with
    the job's key, skipping (and logging, and counting in ``rejected``, by
    reason, and through ``on_rejected``) the others."""

    def __init__(
        self,
        kafka: KafkaAccess,
        job: str,
        key: JobKey,
        *,
        start_at: int = 0,
        delivery_timeout_s: float = DELIVERY_BOUND_S,
        on_rejected: Callable[[str], None] | None = None,
    ):
        if key.job != job:
            raise ConfigError(f"the control topic of job {job} needs that job's key, not job {key.job}'s")
        self.topic = control_topic(job)
        self.key = key
        self.delivery_timeout_s = delivery_timeout_s
        self.rejected: collections.Counter[str] = collections.Counter()
        self._on_rejected = on_rejected
        create_topic(kafka, self.topic, 1)
        self._producer = producer(kafka, delivery_timeout_s=delivery_timeout_s)
        try:
            self._consumer = kafka_clients.consumer(
                kafka, enable_auto_commit=False, client_id=f"spark-abs-control-{job}"
            )
        except KafkaUnavailableError:  # kafka_clients said why
            close_producer(self._producer, f"control topic {self.topic}")
            raise
        self._tp = TopicPartition(self.topic, 0)
        self._consumer.assign([self._tp])
        self._consumer.seek(self._tp, start_at)

    def seek_to_end(self) -> int:
        """Skip everything published so far; returns the position."""
        try:
            end = self._consumer.end_offsets([self._tp])[self._tp]
        except KafkaError as exc:
            raise KafkaUnavailableError(f"cannot find the end of the control topic {self.topic}: {exc}") from exc
        self._consumer.seek(self._tp, end)
        return end

    def seek(self, offset: int) -> None:
        """Read from ``offset`` on."""
        self._consumer.seek(self._tp, offset)

    def position(self) -> int:
        """The offset of the next record ``poll`` reads."""
        try:
            return self._consumer.position(self._tp)
        except KafkaError as exc:
            raise KafkaUnavailableError(f"cannot find the position on the control topic {self.topic}: {exc}") from exc

    def publish(self, event: ControlEvent, timeout_s: float | None = None) -> int:
        """Send ``event`` and wait until Kafka has it (``send_event``), at most
        ``timeout_s`` (default: the delivery timeout)."""
        return send_event(
            self._producer, self.topic, event, self.key, self.delivery_timeout_s if timeout_s is None else timeout_s
        )

    def poll(self, timeout_s: float = 0.0) -> list[ControlEvent]:
        events = []
        for records in self._consumer.poll(timeout_ms=int(timeout_s * 1000)).values():
            for record in records:
                try:
                    events.append(verified_event(self.topic, self.key, record.value, record.headers, record.offset))
                except RejectedEvent as rejected:
                    self._reject(record.offset, rejected)
        return events

    def _reject(self, offset: int, rejected: RejectedEvent) -> None:
        self.rejected[rejected.kind] += 1
        if self._on_rejected is not None:
            self._on_rejected(rejected.kind)
        count = self.rejected[rejected.kind]
        # a flood of forged records is not a flood of log lines: the first few, then every hundredth
        if count <= LOGGED_REJECTIONS or count % 100 == 0:
            log.warning(
                "control topic %s offset %d: rejected: %s (%d %s so far%s)",
                self.topic,
                offset,
                rejected,
                count,
                rejected.kind,
                "; every hundredth is logged from here on" if count == LOGGED_REJECTIONS else "",
            )

    def wait_for(self, predicate: Callable[[ControlEvent], bool], timeout_s: float) -> list[ControlEvent]:
        """Poll until an event satisfies ``predicate``; return all events read."""
        seen: list[ControlEvent] = []
        deadline = Deadline(timeout_s)
        while not deadline.passed():
            batch = self.poll(0.2)
            seen.extend(batch)
            if any(predicate(e) for e in batch):
                return seen
        return seen

    def close(self) -> None:
        close_producer(self._producer, f"control topic {self.topic}")
        self._consumer.close()


# how many of the control topic's newest records ``newest_generation`` reads: every event names the
# generation it belongs to, and a runner publishes several a second, so the tail holds the newest
GENERATION_TAIL = 2000


def newest_generation(kafka: KafkaAccess, job: str, key: JobKey, timeout_s: float = 30.0) -> int | None:
    """The newest generation any event on job ``job``'s control topic that
    verifies with ``key`` names, among its last ``GENERATION_TAIL`` records
    (None when none names one).  Events are signed and the store's
    ``_JOB.json`` is not the only record of the generations: one rolled back
    to an older copy (signed too) names a generation older than this."""
    control = ControlTopic(kafka, job, key)
    try:
        end = control.seek_to_end()
        control.seek(max(0, end - GENERATION_TAIL))
        newest: int | None = None
        deadline = Deadline(timeout_s)
        while control.position() < end:
            if deadline.passed():
                raise KafkaUnavailableError(
                    f"reading the last {GENERATION_TAIL} events of {control.topic} took more than {timeout_s:g} s"
                )
            for event in control.poll(0.5):
                generation = getattr(event, "generation", None)
                if isinstance(generation, int) and (newest is None or generation > newest):
                    newest = generation
        return newest
    finally:
        control.close()
