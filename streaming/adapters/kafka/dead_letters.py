"""The job's dead-letter topic, where input that cannot be read or processed
goes with its reason: the original key, value and headers and the notes
that say why and where from, cut to what Kafka takes when it must be.

Each letters once, across restores: a task's letter names its generation
and the newest checkpoint its task had snapshotted when it was sent
(``spark-abs-generation``, ``spark-abs-after-checkpoint``), and a restore
appends a mark signed with the job's key (key ``spark-abs-restored``:
generation g starts from checkpoint c).  The restored job reads again every
record after c, so a letter of an older generation sent after c is
superseded by the one the replay sends; ``read_dead_letters`` leaves such
letters out, as a consumer of the topic should (docs/operations/record-errors.md)."""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from barriers.headers import (
    DEAD_LETTER_AFTER_CHECKPOINT,
    DEAD_LETTER_GENERATION,
    DEAD_LETTER_ORIGINAL_BYTES,
    DEAD_LETTER_ORIGINAL_SHA256,
    DEAD_LETTER_REASON,
    DEAD_LETTER_RESTORED,
    DEAD_LETTER_SIGNATURE,
    DEAD_LETTER_SOURCE,
    DEAD_LETTER_SOURCE_OFFSET,
    DEAD_LETTER_TRUNCATED,
)
from barriers.messages import ChannelId
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.kafka.producer import DELIVERY_BOUND_S, CheckedSends, producer
from streaming.adapters.kafka.ranges import read_to_end
from streaming.adapters.serde.records import Headers
from streaming.api.config import KafkaAccess
from streaming.api.job_key import JobKey
from streaming.api.topics import dead_letter_topic

__all__ = [
    "DeadLetterLog",
    "DeadLetterTopic",
    "Restored",
    "fit_dead_letter",
    "read_dead_letters",
    "restore_mark",
    "sort_dead_letters",
]

log = logging.getLogger(__name__)


T = TypeVar("T")


# what a record takes in a request besides its key, value and headers' bytes (kafka-python's
# DefaultRecordBatchBuilder: a batch header of 61 bytes, a record's varints), with room to spare
_RECORD_OVERHEAD = 256


# the longest reason a dead letter carries, in characters (a reason may quote a schema of many columns)
_REASON_CHARS = 2000

# a restore mark's signature: the job key's over this, the job, and the mark's value
_RESTORED_SIGNED = b"dead-letters-restored"


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
        self,
        channel: ChannelId,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: Headers,
        reason: str,
        notes: Headers = (),
    ) -> None:
        """One dead letter: the record (``key``, ``value``, ``headers``) read
        from ``channel`` at ``offset``, with ``reason`` and the sender's
        ``notes`` (its generation and checkpoint: never cut)."""
        notes = [
            (DEAD_LETTER_REASON, reason[:_REASON_CHARS].encode()),
            (DEAD_LETTER_SOURCE, str(channel).encode()),
            (DEAD_LETTER_SOURCE_OFFSET, str(offset).encode()),
            *notes,
        ]
        key, value, sent = fit_dead_letter(key, value, headers, notes, self.max_bytes)
        self._sends.send(self.topic, key=key, value=value, headers=sent, partition=0)
        self.count += 1
        log.warning("dead letter from %s offset %d: %s", channel, offset, reason)

    def mark_restore(self, restored: Restored, key: JobKey) -> None:
        """Mark that generation ``restored.generation`` starts from
        ``restored.checkpoint``: the letters older generations sent after it
        are superseded.  Signed with the job's ``key``; in Kafka on return."""
        mark, value, headers = restore_mark(restored, key)
        self._sends.send(self.topic, key=mark, value=value, headers=headers, partition=0)
        self._sends.flush()
        log.info("dead letters: %s", restored)

    def flush(self) -> None:
        """Every dead letter sent so far is in Kafka (``CheckedSends.wait``, the delivery timeout)."""
        self._sends.flush()

    def abandon(self, timeout_s: float) -> str | None:
        """The dead letters so far belong to a generation the job gave up (``CheckedSends.abandon``)."""
        return self._sends.abandon(timeout_s)

    def close(self) -> None:
        self._sends.close()


@dataclass(frozen=True)
class Restored:
    """Generation ``generation`` started from checkpoint ``checkpoint`` (0:
    from the beginning); for a rescaled or changed checkpoint, the one it
    was made from (the records after it are what the restored job reads again)."""

    generation: int
    checkpoint: int

    def to_json(self) -> bytes:
        return json.dumps({"generation": self.generation, "checkpoint": self.checkpoint}).encode()

    def supersedes(self, generation: int, after_checkpoint: int) -> bool:
        """Whether a letter generation ``generation`` sent after checkpoint
        ``after_checkpoint`` is read again, and sent again, from here."""
        return generation < self.generation and after_checkpoint >= self.checkpoint

    def __str__(self) -> str:
        start = f"checkpoint {self.checkpoint}" if self.checkpoint else "the beginning"
        return f"generation {self.generation} restored from {start}"


def restore_mark(restored: Restored, key: JobKey) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    """The key, value and headers of ``restored``'s mark, signed with the job's ``key``."""
    value = restored.to_json()
    signature = key.sign(_RESTORED_SIGNED, key.job.encode(), value)
    return DEAD_LETTER_RESTORED, value, [(DEAD_LETTER_SIGNATURE, signature.encode())]


def _whole(headers: dict[str, bytes], name: str) -> int | None:
    text = headers.get(name, b"").decode("ascii", "replace")
    return int(text) if text.isdigit() and len(text) < 19 else None


def _restored(record: Any, key: JobKey) -> Restored | str:
    """The mark ``record`` holds, or why it does not count."""
    signature = dict(record.headers or []).get(DEAD_LETTER_SIGNATURE)
    value = record.value or b""
    if not key.verify(signature, _RESTORED_SIGNED, key.job.encode(), value):
        return f"offset {record.offset}: a restore mark not signed by job {key.job}"
    try:
        data = json.loads(value)
        return Restored(int(data["generation"]), int(data["checkpoint"]))
    except (ValueError, TypeError, KeyError) as exc:
        return f"offset {record.offset}: a signed restore mark that does not read ({exc})"


@dataclass
class DeadLetterLog:
    """A job's dead-letter topic as read: ``letters``, each once (the
    kafka-python records); ``superseded``, letters a restore's replay sent
    again; ``restores``, its marks; ``ignored``, marks that do not count
    (not signed by the job: anyone who can write to the topic could hide letters)."""

    letters: list[Any] = field(default_factory=list)
    superseded: list[Any] = field(default_factory=list)
    restores: list[Restored] = field(default_factory=list)
    ignored: list[str] = field(default_factory=list)


def sort_dead_letters(records: Iterable[Any], key: JobKey) -> DeadLetterLog:
    """``records`` of a dead-letter topic (restore marks among them) sorted
    into a ``DeadLetterLog``.  A mark supersedes what was sent before it or
    after it alike: a worker of an older generation may still be sending."""
    found = DeadLetterLog()
    sent = []
    for record in records:
        if record.key == DEAD_LETTER_RESTORED:
            mark = _restored(record, key)
            if isinstance(mark, Restored):
                found.restores.append(mark)
            else:
                log.warning("dead letters: %s; left out", mark)
                found.ignored.append(mark)
            continue
        sent.append(record)
    for record in sent:
        headers = dict(record.headers or [])
        generation, after = _whole(headers, DEAD_LETTER_GENERATION), _whole(headers, DEAD_LETTER_AFTER_CHECKPOINT)
        if (
            generation is not None
            and after is not None
            and any(r.supersedes(generation, after) for r in found.restores)
        ):
            found.superseded.append(record)
        else:
            found.letters.append(record)
    return found


def read_dead_letters(kafka: KafkaAccess, job: str, key: JobKey, *, timeout_ms: int = 3000) -> DeadLetterLog:
    """Job ``job``'s dead letters up to the topic's end when read, each once (``sort_dead_letters``)."""
    return sort_dead_letters(read_to_end(kafka, dead_letter_topic(job), timeout_ms), key)
