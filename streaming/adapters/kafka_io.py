"""Kafka transport of the protocol: markers appended to every channel of a
topic (the offsets Kafka gives back are the barrier positions), offset
ranges read back in bulk (unaligned channel state), and the dead-letter
topic where malformed input goes with its reason.  The job's control topic
is ``streaming.adapters.control``.

What a barrier's headers say is the business of ``barriers``; this module only
moves bytes and reports offsets."""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, TypeVar

import pyarrow as pa
import tenacity
from kafka import KafkaProducer, TopicPartition
from kafka.errors import AuthorizationError, KafkaError, KafkaTimeoutError

from barriers.messages import ChannelId
from streaming.adapters import kafka_clients
from streaming.adapters.kafka_admin import create_topic
from streaming.adapters.records import RECORD_SCHEMA, Headers
from streaming.api.config import KafkaAccess
from streaming.errors import KafkaAccessError, KafkaUnavailableError

__all__ = [
    "CLOSE_BOUND_S",
    "DELIVERY_BOUND",
    "DELIVERY_BOUND_S",
    "CheckedSends",
    "patiently",
    "read_range",
    "within",
    "close_producer",
    "retention_ms",
    "DeadLetters",
    "fit_dead_letter",
    "append_markers",
    "write_records",
    "dead_letter_topic_name",
    "producer",
]

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
    deadline = time.monotonic() + timeout_s
    consumer = kafka_clients.consumer(
        kafka,
        enable_auto_commit=False,
        max_poll_records=5000,
        client_id="spark-abs-range",
    )
    tp = TopicPartition(channel.topic, channel.partition)
    rows: list[dict] = []

    def left_ms() -> int:
        return max(1, int((deadline - time.monotonic()) * 1000))

    try:
        consumer.assign([tp])
        first = consumer.beginning_offsets([tp], timeout_ms=left_ms())[tp]
        if to_end:
            end = min(end, consumer.end_offsets([tp], timeout_ms=left_ms())[tp])
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
            if time.monotonic() > deadline:
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
            at = consumer.position(tp, timeout_ms=left_ms())
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


def retention_ms(kafka: KafkaAccess, topic: str) -> int | None:
    """The topic's ``retention.ms`` (None: unlimited or unknown)."""
    from kafka.admin import ConfigResource, ConfigResourceType

    from streaming.adapters.kafka_admin import admin_client

    admin = admin_client(kafka)
    try:
        result = admin.describe_configs([ConfigResource(ConfigResourceType.TOPIC, topic)], config_filter="All")
        value = int(result["topic"][topic]["retention.ms"]["value"])
        return None if value < 0 else value
    except (KafkaError, KeyError, ValueError, TypeError) as exc:
        log.warning("retention of topic %s unknown: %s", topic, exc)
    finally:
        admin.close()
    return None


def dead_letter_topic_name(job: str) -> str:
    return f"spark-abs.{job}.dead-letters"


# how long a send may wait for the broker: the producer's own delivery timeout (it retries until then);
# a job's ``JobSettings.delivery_timeout_s``
DELIVERY_BOUND_S = 120.0
# how long closing a producer may wait for what it still holds (its owner flushed what it needs before)
CLOSE_BOUND_S = 5.0


def producer(kafka: KafkaAccess, *, delivery_timeout_s: float = DELIVERY_BOUND_S, **options: Any) -> KafkaProducer:
    """A producer on ``kafka``: every replica acknowledges, no lingering,
    unless ``options`` (KafkaProducer's) say otherwise; a send it has not
    delivered within ``delivery_timeout_s`` (retries included) fails; a
    clear error when Kafka cannot be reached."""
    delivery_ms = int(delivery_timeout_s * 1000)
    linger_ms = int(options.get("linger_ms", 0))
    # Kafka's rule: a request times out before the delivery does
    request_ms = max(1_000, min(30_000, delivery_ms - linger_ms - 500))
    defaults = {
        "acks": "all",
        "linger_ms": 0,
        "delivery_timeout_ms": max(delivery_ms, request_ms + linger_ms),
        "request_timeout_ms": request_ms,
    }
    return kafka_clients.raw_producer(kafka, **{**defaults, **options})


# what a bound is called in the errors that name it, by default: the producers' own
DELIVERY_BOUND = "the delivery timeout, delivery_timeout_s"


def patiently(
    step: Callable[[float], T], what: str, bound_s: float = DELIVERY_BOUND_S, bound: str = DELIVERY_BOUND
) -> T:
    """``step(timeout_s)`` (a send's ``get``, a ``flush``) again while it times
    out, for at most ``bound_s``: while the broker is unreachable the producer
    retries the send itself (idempotently, so nothing is written twice) and
    this waits, saying so with growing pauses.  A ``KafkaUnavailableError``
    naming ``what`` and the bound (``bound`` says which it is) when the bound
    passes or the send fails."""

    def say(state: tenacity.RetryCallState) -> None:
        log.warning(
            "Kafka has not taken %s after %.0f s (broker unreachable?); waiting up to %.0f s",
            what,
            state.seconds_since_start or 0.0,
            bound_s,
        )

    waiting = tenacity.Retrying(
        retry=tenacity.retry_if_exception_type(KafkaTimeoutError),
        stop=tenacity.stop_after_delay(bound_s),
        wait=tenacity.wait_exponential(multiplier=0.5, max=8.0),
        before_sleep=say,
        reraise=True,
    )
    try:
        return waiting(step, min(2.0, bound_s))
    except KafkaTimeoutError as exc:
        raise KafkaUnavailableError(
            f"Kafka did not take {what} within {bound_s:g} s ({bound}): is the broker reachable?"
        ) from exc
    except AuthorizationError as exc:
        raise _unauthorized(what, exc) from exc
    except KafkaError as exc:
        raise KafkaUnavailableError(f"{what} failed: {exc}") from exc


def _unauthorized(what: str, exc: BaseException, topic: str | None = None) -> KafkaAccessError:
    where = f" to {topic}" if topic else ""
    return KafkaAccessError(
        f"Kafka did not authorize {what}{where} ({type(exc).__name__}): grant the job's user the ACLs a job "
        f"needs (see {kafka_clients.GRANT_DOC})"
    )


def close_producer(producer: KafkaProducer, what: str, timeout_s: float = CLOSE_BOUND_S) -> None:
    """Close ``producer`` waiting at most ``timeout_s`` for what it still
    holds; what Kafka did not take by then is dropped, with a warning (its
    owner flushed what it needed before: this is the way out)."""
    try:
        producer.close(timeout=timeout_s)
    except KafkaError as exc:
        # kafka-python's close raises from its flush before it stops its sender thread: stop it here
        sender = getattr(producer, "_sender", None)
        if sender is not None:
            sender.force_close()
        log.warning(
            "closing the producer of %s: records not taken by Kafka within %g s dropped (%s)", what, timeout_s, exc
        )


def within(call: Callable[[], T], bound_s: float, what: str, bound: str = DELIVERY_BOUND) -> T:
    """``call()`` waited for at most ``bound_s``, for the calls of
    kafka-python that take no timeout (a transaction's commit or abort waits
    for the broker for good).  It runs on a thread of its own; when the bound
    passes, a ``KafkaUnavailableError`` naming ``what`` and the bound
    (``bound`` says which; the call is left to end on its own: whoever
    called fails, and the job restores)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"spark-abs {what}", daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        raise KafkaUnavailableError(f"{what} did not finish within {bound_s:g} s ({bound}): is the broker reachable?")
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


class CheckedSends:
    """The sends of one ``producer``, each known to succeed or fail: a send
    whose future failed (the broker refused it, or it outlasted the delivery
    timeout while Kafka was away) is remembered, and ``flush`` raises it, so
    whoever forwards a barrier or acknowledges a snapshot after the flush
    never counts a record Kafka does not hold.  kafka-python's own ``flush``
    returns without a word for batches that expired.

    ``bound_s`` bounds ``wait`` and ``flush()`` (``patiently``); ``what``
    names the sends in its errors.  Shared by the threads of a worker: one
    failed send fails them all (the worker exits and the job restores) until
    ``abandon`` gives the sends so far up with their generation."""

    def __init__(self, producer: KafkaProducer, what: str, bound_s: float = DELIVERY_BOUND_S):
        self.producer = producer
        self.what = what
        self.bound_s = bound_s
        self._failure: tuple[str, BaseException] | None = None
        # the sends of one generation: a failure of an abandoned one's is not the next one's
        self._epoch = 0

    def send(self, topic: str, **record: Any) -> Any:
        """``producer.send(topic, **record)``, its outcome watched; its future."""
        self.check()
        try:
            future = self.producer.send(topic, **record)
        except KafkaError as exc:
            raise KafkaUnavailableError(f"sending {self.what} to {topic} failed: {exc}") from exc
        future.add_errback(self._failed, topic, self._epoch)
        return future

    def _failed(self, topic: str, epoch: int, exc: BaseException) -> None:
        if self._failure is None and epoch == self._epoch:
            self._failure = (topic, exc)
            log.error("a send of %s to %s failed: %s", self.what, topic, exc)

    def check(self) -> None:
        """A ``KafkaUnavailableError`` if a send failed."""
        if self._failure is not None:
            topic, exc = self._failure
            if isinstance(exc, AuthorizationError):
                raise _unauthorized(f"a send of {self.what}", exc, topic)
            raise KafkaUnavailableError(
                f"a send of {self.what} to {topic} failed ({type(exc).__name__}: {exc}); the task fails rather "
                f"than go on without the record, and the job restores from its latest checkpoint"
            )

    def flush(self, timeout: float | None = None) -> None:
        """As kafka-python's ``flush``, checked: with ``timeout``, a
        ``KafkaTimeoutError`` when the sends are not done by then (for
        ``patiently`` to wait again); without, ``wait`` for ``bound_s``.  A
        ``KafkaUnavailableError`` if a send failed."""
        if timeout is None:
            self.wait(self.bound_s)
            return
        self.producer.flush(timeout=timeout)
        self.check()

    def wait(self, bound_s: float, bound: str = DELIVERY_BOUND) -> None:
        """Every send so far has succeeded or failed, waited for at most
        ``bound_s`` (``bound`` names it); a ``KafkaUnavailableError`` when the
        bound passes or a send failed."""
        patiently(lambda t: self.producer.flush(timeout=t), self.what, bound_s, bound)
        self.check()

    def abandon(self, timeout_s: float) -> str | None:
        """The sends so far belong to a generation the job gave up (it
        restores): wait for them at most ``timeout_s``, then forget them and
        what failed (one of them failing later is not the next generation's
        concern), so the next generation's sends start clean.  What failed,
        said, or None."""
        try:
            self.wait(timeout_s, "the stop of a generation")
        except KafkaUnavailableError as exc:
            return str(exc)
        finally:
            self._epoch += 1
            self._failure = None
        return None

    def close(self, timeout_s: float = CLOSE_BOUND_S) -> None:
        close_producer(self.producer, self.what, timeout_s)


def append_markers(
    producer: KafkaProducer, channels: Iterable[ChannelId], headers: Headers, timeout_s: float = DELIVERY_BOUND_S
) -> dict[ChannelId, int]:
    """Append one empty record carrying ``headers`` to each channel and return
    the offset each got.  Everything sent to a channel before this call comes
    before the marker (the producer is flushed first).  While the broker is
    unreachable this waits, up to ``timeout_s`` (``patiently``)."""
    patiently(lambda t: producer.flush(timeout=t), "the records before a marker", timeout_s)
    futures = {c: producer.send(c.topic, value=b"", headers=list(headers), partition=c.partition) for c in channels}
    return {
        channel: patiently(future.get, f"a marker for {channel}", timeout_s).offset
        for channel, future in futures.items()
    }


def write_records(
    producer: KafkaProducer,
    records: Mapping[ChannelId, Sequence[bytes]],
    headers: Headers,
    timeout_s: float = DELIVERY_BOUND_S,
) -> dict[ChannelId, tuple[int, int]]:
    """Write ``records`` (values, in order) to each channel with ``headers``
    and return the offset range ``[first, last + 1)`` each channel's got."""
    futures = {
        channel: [
            producer.send(channel.topic, value=v, headers=list(headers), partition=channel.partition) for v in values
        ]
        for channel, values in records.items()
        if values
    }
    patiently(lambda t: producer.flush(timeout=t), "re-routed channel state", timeout_s)
    written = {}
    for channel, sent in futures.items():
        first = patiently(sent[0].get, f"re-routed records for {channel}", timeout_s).offset
        last = patiently(sent[-1].get, f"re-routed records for {channel}", timeout_s).offset
        written[channel] = (first, last + 1)
    return written


# what a record takes in a request besides its key, value and headers' bytes (kafka-python's
# DefaultRecordBatchBuilder: a batch header of 61 bytes, a record's varints), with room to spare
_RECORD_OVERHEAD = 256
# the longest reason a dead letter carries, in characters (a reason may quote a schema of many columns)
_REASON_CHARS = 2000


def _record_bytes(key: bytes | None, value: bytes | None, headers: Headers) -> int:
    named = sum(len(name.encode()) + len(data or b"") + 10 for name, data in headers)
    return _RECORD_OVERHEAD + len(key or b"") + len(value or b"") + named


def fit_dead_letter(
    key: bytes | None, value: bytes | None, headers: Headers, notes: Headers, max_bytes: int
) -> tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]:
    """A dead letter (the record's ``key``, ``value`` and ``headers``, then
    the dead letter's own ``notes``) as it can be sent in ``max_bytes``: as
    it is when it fits; otherwise its value cut to what fits (and, when its
    key and headers alone are over, its headers left out and its key cut
    too), saying so in ``spark-abs-truncated`` (what was cut),
    ``spark-abs-original-bytes`` and ``spark-abs-original-sha256`` (of the
    whole value), so the record is never lost, only shortened."""
    headers, notes = list(headers), list(notes)
    if _record_bytes(key, value, headers + notes) <= max_bytes:
        return key, value, headers + notes
    value = value or b""
    cut = ["value"]
    original = [
        ("spark-abs-original-bytes", str(len(value)).encode()),
        ("spark-abs-original-sha256", hashlib.sha256(value).hexdigest().encode()),
    ]
    room = max_bytes - _record_bytes(key, b"", headers + notes + original) - 64
    if room < 0:  # the key and the record's headers alone are over
        cut += ["headers", "key"] if headers else ["key"]
        headers, key = [], (key or b"")[: max_bytes // 4]
        room = max(0, max_bytes - _record_bytes(key, b"", notes + original) - 64)
    truncated = [("spark-abs-truncated", ",".join(cut).encode())]
    return key, value[:room], headers + notes + original + truncated


class DeadLetters:
    """Malformed input, kept with its reason: the original key, value and
    headers, plus ``spark-abs-reason``, ``spark-abs-source`` (channel) and
    ``spark-abs-source-offset`` headers; one larger than the producer may
    send is truncated with a note (``fit_dead_letter``).  ``count`` says how
    many were sent."""

    def __init__(self, kafka: KafkaAccess, job: str, *, delivery_timeout_s: float = DELIVERY_BOUND_S):
        self.topic = dead_letter_topic_name(job)
        create_topic(kafka, self.topic, 1)
        sender = producer(kafka, delivery_timeout_s=delivery_timeout_s)
        # the most a record may take (the topic, created with the broker's default
        # max.message.bytes, 1048588, takes what the producer may send)
        self.max_bytes = int(sender.config["max_request_size"])
        self._sends = CheckedSends(sender, "dead letters", delivery_timeout_s + 5)
        self.count = 0

    def send(
        self, channel: ChannelId, offset: int, key: bytes | None, value: bytes | None, headers: Headers, reason: str
    ) -> None:
        notes = [
            ("spark-abs-reason", reason[:_REASON_CHARS].encode()),
            ("spark-abs-source", str(channel).encode()),
            ("spark-abs-source-offset", str(offset).encode()),
        ]
        key, value, sent = fit_dead_letter(key, value, headers, notes, self.max_bytes)
        self._sends.send(self.topic, key=key, value=value, headers=sent, partition=0)
        self.count += 1
        log.warning("dead letter from %s offset %d: %s", channel, offset, reason)

    def flush(self) -> None:
        """Every dead letter sent so far is in Kafka (``CheckedSends.wait``, the delivery timeout)."""
        self._sends.flush()

    def abandon(self, timeout_s: float) -> str | None:
        """The dead letters so far belong to a generation the job gave up (``CheckedSends.abandon``)."""
        return self._sends.abandon(timeout_s)

    def close(self) -> None:
        self._sends.close()
