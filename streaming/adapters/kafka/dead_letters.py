"""The job's dead-letter topic, where input that cannot be read or processed
goes with its reason: the original key, value and headers and the notes
that say why and where from, cut to what Kafka takes when it must be."""

from __future__ import annotations

import hashlib
import logging
from typing import TypeVar

from barriers.headers import (
    DEAD_LETTER_ORIGINAL_BYTES,
    DEAD_LETTER_ORIGINAL_SHA256,
    DEAD_LETTER_REASON,
    DEAD_LETTER_SOURCE,
    DEAD_LETTER_SOURCE_OFFSET,
    DEAD_LETTER_TRUNCATED,
)
from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S, CheckedSends, producer
from streaming.adapters.serde.records import Headers
from streaming.api.config import KafkaAccess
from streaming.api.topics import dead_letter_topic

__all__ = ["DeadLetterTopic", "fit_dead_letter"]

log = logging.getLogger(__name__)


T = TypeVar("T")


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
        (DEAD_LETTER_ORIGINAL_BYTES, str(len(value)).encode()),
        (DEAD_LETTER_ORIGINAL_SHA256, hashlib.sha256(value).hexdigest().encode()),
    ]
    room = max_bytes - _record_bytes(key, b"", headers + notes + original) - 64
    if room < 0:  # the key and the record's headers alone are over
        cut += ["headers", "key"] if headers else ["key"]
        headers, key = [], (key or b"")[: max_bytes // 4]
        room = max(0, max_bytes - _record_bytes(key, b"", notes + original) - 64)
    truncated = [(DEAD_LETTER_TRUNCATED, ",".join(cut).encode())]
    return key, value[:room], headers + notes + original + truncated


class DeadLetterTopic:
    """Malformed input, kept with its reason: the original key, value and
    headers, plus ``spark-abs-reason``, ``spark-abs-source`` (channel) and
    ``spark-abs-source-offset`` headers; one larger than the producer may
    send is truncated with a note (``fit_dead_letter``).  ``count`` says how
    many were sent."""

    def __init__(self, kafka: KafkaAccess, job: str, *, delivery_timeout_s: float = DELIVERY_BOUND_S):
        self.topic = dead_letter_topic(job)
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
            (DEAD_LETTER_REASON, reason[:_REASON_CHARS].encode()),
            (DEAD_LETTER_SOURCE, str(channel).encode()),
            (DEAD_LETTER_SOURCE_OFFSET, str(offset).encode()),
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
