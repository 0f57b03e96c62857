"""Records a task cannot take, sent to the job's dead-letter topic with
their reason and counted: malformed or undecodable input, input an operator
refuses, rows an operator gave up on (late, unmatched), records the stage's
code raised on (``record_errors``), and control records that fail their checks
(forged or foreign barriers).  Prometheus counts them
by a reason of few values (``REASONS``); the message keeps the whole reason."""

from __future__ import annotations

import collections
import json
import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import pyarrow as pa

from barriers.headers import (
    DEAD_LETTER_AFTER_CHECKPOINT,
    DEAD_LETTER_GENERATION,
    DEAD_LETTER_ORIGINAL,
    DEAD_LETTER_READ_FROM,
    DEAD_LETTER_ROW,
)
from barriers.messages import BarrierRejected, ChannelId
from operators.dead_letters import ORIGIN, DeadLetter, DeadLetters
from streaming.engine.metrics import TaskMetrics
from streaming.waits import Deadline

__all__ = ["Quarantine", "REASONS", "ORIGINAL_READ_S", "ORIGINALS_READ"]

# what the dead letters are counted by: input that does not decode, input or rows the operator
# refuses, rows an operator gave up on (late, unmatched), control records that fail their checks,
# records the stage's code raised on (``record_errors``)
REASONS = ("malformed", "refused", "given_up", "rejected_control", "raised")

# how long reading back the ingress records of one batch's dead letters may take, and how many
# ranges it reads at most (a burst of rejected rows must not stall the task)
ORIGINAL_READ_S = 10.0
ORIGINALS_READ = 20
# dead letters' records this close are read back in one range (the records between them too)
_WIDEST_GAP = 200

log = logging.getLogger(__name__)

Original = tuple[bytes | None, bytes | None, list[tuple[str, bytes]]]


def _headers(row: pa.Table) -> list[tuple[str, bytes]]:
    return [(h["key"], h["value"]) for h in (row["headers"][0].as_py() or [])]


def _original(records: pa.Table, index: int) -> Original:
    """The key, value and headers of record ``index`` of ``records``."""
    row = records.slice(index, 1)
    return row["key"][0].as_py(), row["value"][0].as_py(), _headers(row)


class Quarantine:
    """The dead letters of task ``task`` of generation ``generation``, sent
    with ``io.dead_letter(channel, offset, key, value, headers, reason,
    notes)`` (a ``TaskIO``'s), counted in ``metrics``; a row an operator gave
    up on is sent as the ingress record it came from (of one of
    ``ingress_topics``, topic: partitions), read back by ``io.read_range``.
    Each letter's notes name the generation and ``after_checkpoint()``, the
    newest checkpoint the task had snapshotted or started from: a restore to
    it or an older one supersedes the letter (``streaming.adapters.kafka.dead_letters``)."""

    def __init__(
        self,
        task: str,
        io: Any,
        counters: collections.Counter,
        metrics: TaskMetrics,
        *,
        generation: int,
        after_checkpoint: Callable[[], int],
        ingress_topics: Mapping[str, int] | None = None,
    ):
        self.task = task
        self.io = io
        self.generation = str(generation).encode()
        self.after_checkpoint = after_checkpoint
        self.counters = counters
        self.metrics = metrics
        # the job's ingress topics and their partition counts: the only records read back
        self.ingress_topics = dict(ingress_topics or {})

    def record(self, channel: ChannelId, row: pa.Table, reason: str, *, counted_as: str = "malformed") -> None:
        """One input record (a one-row batch table), with ``reason``
        (``counted_as``: one of ``REASONS``)."""
        self._count(counted_as)
        self._send(
            channel,
            int(row["offset"][0].as_py()),
            row["key"][0].as_py(),
            row["value"][0].as_py(),
            _headers(row),
            reason,
        )

    def _send(
        self,
        channel: ChannelId,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
        reason: str,
    ) -> None:
        notes = [
            (DEAD_LETTER_GENERATION, self.generation),
            (DEAD_LETTER_AFTER_CHECKPOINT, str(self.after_checkpoint()).encode()),
        ]
        self.io.dead_letter(channel, offset, key, value, headers, reason, notes)

    def row(self, channel: ChannelId, value: bytes, reason: str, *, counted_as: str = "given_up") -> None:
        """A row made from input records (``value``: the row as JSON), with
        ``reason`` (``counted_as``: one of ``REASONS``)."""
        self._count(counted_as)
        self._send(channel, -1, None, value, [], reason)

    def _count(self, counted_as: str) -> None:
        self.counters["dead_letters"] += 1
        if counted_as == "raised":
            self.counters["set_aside"] += 1
        self.metrics.dead_letter(counted_as)

    def control_record(self, channel: ChannelId, row: pa.Table, rejected: BarrierRejected) -> None:
        """A control record whose barrier failed its checks."""
        offset = int(row["offset"][0].as_py())
        self.counters["rejected_control_records"] += 1
        self.metrics.dead_letter("rejected_control")
        log.warning("%s: control record at %s offset %d rejected: %s", self.task, channel, offset, rejected)
        self._send(
            channel,
            offset,
            row["key"][0].as_py(),
            row["value"][0].as_py(),
            _headers(row),
            f"rejected control record: {rejected.reason}",
        )

    def from_operator(
        self, channel: ChannelId, operator: Any, records: pa.Table | None = None
    ) -> set[tuple[ChannelId, int]]:
        """The rows ``operator`` gave up on since the last call (its
        ``dead_letters``), read from ``channel`` (``records``: the records just
        read, where an origin on ``channel`` is found without asking Kafka).

        A row with its origin (``operators.dead_letters.ORIGIN``) is sent as
        the ingress record it came from: that record's key, value and
        headers, with the source and offset of the ingress record, and the
        row as the operator had it in ``spark-abs-row``.  When that record
        cannot be read back (retention removed it, Kafka does not answer in
        ``ORIGINAL_READ_S``), or the origin is a record of a stage-to-stage
        topic (the row came from an aggregate), the value is the row, and
        ``spark-abs-original`` says why.  Returns the origins of the rows given
        up (the ingress records they came from, where they name one)."""
        letters = getattr(operator, "dead_letters", None)
        if not isinstance(letters, DeadLetters) or not len(letters):
            return set()
        drained = letters.drain()
        self.letters(channel, drained, records)
        return {origin for origin in (_origin_of(letter.row.get(ORIGIN)) for letter in drained) if origin is not None}

    def letters(
        self,
        channel: ChannelId,
        drained: Sequence[DeadLetter],
        records: pa.Table | None = None,
        *,
        counted_as: str = "given_up",
    ) -> None:
        """Rows taken out of ``channel``'s run (``records``: its records),
        each with its reason, sent as ``from_operator`` says (``counted_as``:
        one of ``REASONS``)."""
        origins = [_origin_of(letter.row.get(ORIGIN)) for letter in drained]
        originals = _Originals(self.io, channel, records, self.ingress_topics)
        originals.gather([origin for origin in origins if origin is not None])
        for letter, origin in zip(drained, origins):
            row = {column: value for column, value in letter.row.items() if column != ORIGIN}
            value = json.dumps(row, default=str, separators=(",", ":")).encode()
            reason = f"{letter.operator}: {letter.reason}" if letter.operator else letter.reason
            if origin is None:
                self.row(channel, value, reason, counted_as=counted_as)
                continue
            source, offset = origin
            notes = [(DEAD_LETTER_ROW, value), (DEAD_LETTER_READ_FROM, str(channel).encode())]
            original, why = originals.get(source, offset)
            self._count(counted_as)
            if original is None:
                self._send(source, offset, None, value, [*notes, (DEAD_LETTER_ORIGINAL, why.encode())], reason)
            else:
                key, body, headers = original
                self._send(source, offset, key, body, [*headers, *notes], reason)


def _origin_of(value: Any) -> tuple[ChannelId, int] | None:
    """The channel and offset an origin names (None: no origin, or none a channel can be)."""
    if not isinstance(value, dict):
        return None
    try:
        return ChannelId(str(value["topic"]), int(value["partition"])), int(value["offset"])
    except (KeyError, TypeError, ValueError):
        return None


class _Originals:
    """The ingress records the dead letters of one batch came from: found in
    the records just read from ``channel``, or read back from Kafka
    (``read``), each run of nearby offsets in one read, within
    ``ORIGINAL_READ_S`` and ``ORIGINALS_READ`` reads.  A record of any other
    topic than ``ingress_topics`` is never read: an origin is data, whoever
    wrote it."""

    def __init__(self, io: Any, channel: ChannelId, records: pa.Table | None, ingress_topics: Mapping[str, int]):
        self.read = getattr(io, "read_range", None)
        self.channel = channel
        self.records = records
        self.ingress_topics = ingress_topics
        self.found: dict[tuple[ChannelId, int], Original] = {}
        # why the records not found could not be read, per channel
        self.unread: dict[ChannelId, str] = {}

    def gather(self, wanted: Collection[tuple[ChannelId, int]]) -> None:
        """Find the records at ``wanted`` (channel, offset)."""
        wanted = [(source, offset) for source, offset in wanted if source.topic in self.ingress_topics]
        if self.records is not None and any(source == self.channel for source, _ in wanted):
            here = {o: i for i, o in enumerate(self.records["offset"].to_pylist())}
            for source, offset in wanted:
                if source == self.channel and offset in here:
                    self.found[(source, offset)] = _original(self.records, here[offset])
        by_channel: dict[ChannelId, list[int]] = collections.defaultdict(list)
        for source, offset in sorted(set(wanted), key=lambda w: (str(w[0]), w[1])):
            if source.partition >= self.ingress_topics[source.topic]:
                self.unread[source] = f"the ingress topic {source.topic} has no partition {source.partition}"
            elif (source, offset) not in self.found:
                by_channel[source].append(offset)
        deadline, reads, read = Deadline(ORIGINAL_READ_S), 0, self.read
        for source, offsets in by_channel.items():
            for start, end in _runs(offsets):
                left = deadline.left()
                if read is None:
                    self.unread[source] = "the task cannot read Kafka back here"
                elif reads >= ORIGINALS_READ or left <= 0:
                    self.unread.setdefault(
                        source,
                        f"not read back: the dead letters of one batch read at most {ORIGINALS_READ} ranges "
                        f"in {ORIGINAL_READ_S:.0f} s; read it with streaming.adapters.kafka.ranges.read_range",
                    )
                if read is None or source in self.unread:
                    break
                reads += 1
                try:
                    # an origin is data: its offset may lie past the partition's end
                    table = read(source, start, end, timeout_s=left, to_end=True)
                except Exception as exc:  # any failure: the dead letter goes without its original, saying why
                    self.unread[source] = f"could not be read back from Kafka: {exc}"
                    log.warning("%s: dead letters' ingress records not read back: %s", source, exc)
                    break
                for index, at in enumerate(table["offset"].to_pylist()):
                    self.found[(source, at)] = _original(table, index)

    def get(self, source: ChannelId, offset: int) -> tuple[Original | None, str]:
        """The record at ``offset`` of ``source`` (key, value, headers), or None and why not."""
        found = self.found.get((source, offset))
        if found is not None:
            return found, ""
        if source.topic not in self.ingress_topics:
            return None, (
                f"the row came from the record at {source} offset {offset}, not an ingress record of the job: "
                "a stage's output (a row made from many records, such as an aggregate's, names no ingress record)"
            )
        return None, self.unread.get(source) or f"{source} has no record at offset {offset}"


def _runs(offsets: list[int]) -> list[tuple[int, int]]:
    """Sorted ``offsets`` as ranges ``[start, end)``, those ``_WIDEST_GAP`` or less apart in one."""
    runs: list[tuple[int, int]] = []
    for offset in offsets:
        if runs and offset - runs[-1][1] < _WIDEST_GAP:
            runs[-1] = (runs[-1][0], offset + 1)
        else:
            runs.append((offset, offset + 1))
    return runs
