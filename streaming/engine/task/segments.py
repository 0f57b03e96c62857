"""Cutting a micro-batch into segments: the unit the barrier handler drives.

A batch (all channels of a task, ordered by channel and offset) becomes, per
channel, runs of data records and single control or watermark records.
Records that an older generation wrote on an internal topic after the
restored barrier of their channel are stale (docs/architecture/restore.md,
"Restore"): they become ``SKIP`` segments, whose positions count but whose
records are not processed, since the new generation writes them again.

Runs are cut at ``max_records`` records or ``max_bytes`` of values, so a
large micro-batch still lets the task take control events (an unaligned
snapshot, an abort) between its segments.  How long a task goes without
looking is bounded in time as well: ``SegmentPace`` learns what the task's
operator takes per record and the gate hands out runs of as many records as
it processes in a time budget (``Segment.split``)."""

from __future__ import annotations

import collections
import enum
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from barriers.headers import GENERATION_HEADER, KIND_HEADER, WATERMARK_HEADER
from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming.adapters.serde.records import header_values, is_prepared, unreadable_headers, whole_numbers
from streaming.engine.task.watermarks import WATERMARK_KIND
from streaming.errors import TaskError

__all__ = ["SegmentKind", "Segment", "Segmenter", "SegmentPace"]


class SegmentKind(enum.StrEnum):
    DATA = "data"  # a run of data records
    CONTROL = "control"  # one barrier or cancellation
    WATERMARK = "watermark"  # one header-only record that moves the channel's watermark
    SKIP = "skip"  # a run of stale records of an older generation
    REJECTED = "rejected"  # one record whose headers the engine cannot read: a dead letter, with its reason


@dataclass(slots=True)
class Segment:
    """A run of records of one channel (see ``SegmentKind``).  A spilled
    segment has let go of its records (``rows`` is None): they are read again
    from Kafka by offset range when the task comes to it."""

    channel: ChannelId
    rows: pa.Table | None
    kind: SegmentKind = SegmentKind.DATA
    # why a REJECTED record cannot be read ("" for every other kind)
    reason: str = ""
    first_offset: int = field(init=False)
    last_offset: int = field(init=False)
    nbytes: int = field(init=False)

    def __post_init__(self) -> None:
        if self.rows is None:
            raise TaskError(f"{self.channel}: a segment is made with its records")
        self.first_offset = int(self.rows["offset"][0].as_py())
        self.last_offset = int(self.rows["offset"][-1].as_py())
        self.nbytes = self.rows.nbytes

    def rows_in_hand(self) -> pa.Table:
        """``rows`` of a segment that has not let go of them (a ``TaskError`` for a spilled one)."""
        if self.rows is None:
            raise TaskError(f"{self.channel}: records {self.first_offset}-{self.last_offset} were let go")
        return self.rows

    @property
    def spilled(self) -> bool:
        return self.rows is None

    @property
    def splittable(self) -> bool:
        """A run of data records in hand (not spilled; not rows a stage's
        Spark code prepared, whose markers count for the whole run)."""
        return self.kind is SegmentKind.DATA and self.rows is not None and not is_prepared(self.rows)

    def split(self, records: int) -> tuple[Segment, Segment | None]:
        """The first ``records`` rows (more where rows of one record go on:
        a record is never cut) and the rest, or None when nothing is left."""
        rows = self.rows_in_hand()
        if records >= rows.num_rows:
            return self, None
        offsets = rows["offset"]
        cut = max(1, records)
        while cut < rows.num_rows and offsets[cut].as_py() == offsets[cut - 1].as_py():
            cut += 1
        if cut >= rows.num_rows:
            return self, None
        return Segment(self.channel, rows.slice(0, cut), self.kind), Segment(self.channel, rows.slice(cut), self.kind)

    def spill(self) -> None:
        """Let go of the records (a run of data or stale records only: a
        control record is one small record and stays; so do the rows a
        stage's Spark code prepared, whose partial aggregates stand for more
        records than their offsets say)."""
        if self.kind in (SegmentKind.DATA, SegmentKind.SKIP) and not is_prepared(self.rows):
            self.rows = None


class Segmenter:
    """Cuts the batches of one task of generation ``generation``;
    ``internal_topics`` are the stage-to-stage topics (only those carry
    records of older generations that can be stale); the records ``skip``
    names (channel, first and last offsets: ``--skip-records``) are
    dead letters, unread."""

    def __init__(
        self,
        internal_topics: Iterable[str],
        generation: int,
        lineage: Lineage,
        *,
        max_records: int = 50_000,
        max_bytes: int = 4 << 20,
        skip: Iterable[tuple[ChannelId, int, int]] = (),
    ):
        self._internal = frozenset(internal_topics)
        # records an operator named to skip (channel, first and last offsets): dead letters, unread
        self._skip = tuple(skip)
        self._generation = generation
        self._lineage = lineage
        self._max_records = max_records
        self._max_bytes = max_bytes

    def cut(self, table: pa.Table) -> list[Segment]:
        n = table.num_rows
        if n == 0:
            return []
        marks = header_values(table, KIND_HEADER)
        kinds = np.full(n, _DATA, dtype=np.int8)
        kinds[pc.is_valid(marks).to_numpy(zero_copy_only=False)] = _CONTROL
        kinds[pc.fill_null(pc.equal(marks, WATERMARK_KIND), False).to_numpy(zero_copy_only=False)] = _WATERMARK
        topics = table["topic"].combine_chunks().dictionary_encode()
        topic_ids = topics.indices.to_numpy(zero_copy_only=False)
        partitions = table["partition"].to_numpy()
        offsets = table["offset"].to_numpy()
        names = topics.dictionary.to_pylist()
        # the headers the engine reads as numbers, read here once for every record: one a writer
        # made unreadable is that record's dead letter (REJECTED), wherever it came from and in
        # whichever generation, so a replay of the same records rejects the same ones
        reasons: dict[int, str] = {}
        generations = None
        prepared = is_prepared(table)
        # a stage's Spark code read the data records' headers itself (try_cast: unreadable is absent); the
        # watermark records it hands over as they came are read here
        unreadable, read = unreadable_headers(
            table, (WATERMARK_HEADER,) if prepared else (WATERMARK_HEADER, GENERATION_HEADER)
        )
        looked_at = kinds == _WATERMARK if prepared else kinds != _CONTROL  # a barrier's decoding checks its own
        reasons.update((i, why) for i, why in unreadable.items() if looked_at[i])
        if GENERATION_HEADER in read:
            generations = read[GENERATION_HEADER].values
        if not prepared:
            for channel, first, last in self._skip:
                if channel.topic not in names:
                    continue
                hit = np.flatnonzero(
                    (topic_ids == names.index(channel.topic))
                    & (partitions == channel.partition)
                    & (offsets >= first)
                    & (offsets <= last)
                    & (kinds != _CONTROL)
                )
                for i in hit:
                    reasons.setdefault(
                        int(i), f"skipped at a restore: {channel} offsets {first}..{last} (--skip-records)"
                    )
        kinds[list(reasons)] = _REJECTED
        # records of an older generation on internal topics after a restored
        # barrier were written by a run that failed
        if self._generation > 0 and self._internal.intersection(names):
            if generations is None:
                generations = whole_numbers(header_values(table, GENERATION_HEADER)).values
            older = pc.fill_null(pc.less(generations, self._generation), False).to_numpy(zero_copy_only=False)
            internal = np.isin(topic_ids, [i for i, t in enumerate(names) if t in self._internal])
            gens = generations.to_numpy(zero_copy_only=False)
            for i in np.flatnonzero(older & internal & np.isin(kinds, (_DATA, _WATERMARK))):
                channel = ChannelId(names[topic_ids[i]], int(partitions[i]))
                if self._lineage.is_stale(channel, int(gens[i]), int(offsets[i])):
                    kinds[i] = _SKIP
        # a new run where the channel or the kind changes, and at every single-record kind
        new = np.ones(n, dtype=bool)
        new[1:] = (
            (topic_ids[1:] != topic_ids[:-1])
            | (partitions[1:] != partitions[:-1])
            | (kinds[1:] != kinds[:-1])
            | ~np.isin(kinds[1:], (_DATA, _SKIP))
        )
        sizes = np.cumsum(pc.fill_null(pc.binary_length(table["value"]), 0).to_numpy(zero_copy_only=False))
        bounds = list(np.flatnonzero(new)) + [n]
        segments: list[Segment] = []
        for begin, end in zip(bounds[:-1], bounds[1:]):
            channel = ChannelId(names[topic_ids[begin]], int(partitions[begin]))
            kind = _KINDS[kinds[begin]]
            while begin < end:
                cut = begin + 1
                if kind in (SegmentKind.DATA, SegmentKind.SKIP):
                    base = sizes[begin - 1] if begin else 0
                    by_bytes = int(np.searchsorted(sizes[begin:end], base + self._max_bytes, side="left")) + 1
                    cut = min(end, begin + self._max_records, begin + max(1, by_bytes))
                    # rows of one record (a Spark stage's explode) stay in one segment
                    while cut < end and offsets[cut] == offsets[cut - 1]:
                        cut += 1
                segments.append(Segment(channel, table.slice(begin, cut - begin), kind, reasons.get(begin, "")))
                begin = cut
        return segments


class SegmentPace:
    """How many records of a run a task takes before it looks at its control
    events again: as many as it processes in ``budget_s``, by what its last
    ``window`` runs took, at most ``max_records``; ``first_records`` before
    anything was measured.

    A run of n records is taken to cost c + r·n: a fixed cost per call of
    the operator (c) and one per record (r), fitted by least squares when
    the runs measured differ in size (the last run of a micro-batch is
    shorter).  When they do not, r = time ÷ records, and every 8th run is
    twice the size, so that the next fit can tell the two costs apart.  When
    the time did not grow with the size (a fixed cost, or noise), the next
    run is twice the largest measured.  A run is then sized to take the
    budget, or 4·c where c alone is more than half of it (an operator that
    costs a fixed 100 ms per call, a batched lookup say, gets runs of 400
    ms: smaller ones could not meet the budget anyway, and one record per
    call would throw its throughput away)."""

    def __init__(self, budget_s: float, max_records: int, *, first_records: int = 16, window: int = 16):
        self.budget_s = budget_s
        self.max_records = max_records
        self._samples: collections.deque[tuple[int, float]] = collections.deque(maxlen=window)
        self._runs = 0
        self.limit = min(first_records, max_records)

    def observe(self, records: int, seconds: float) -> None:
        """A run of ``records`` records took ``seconds``: the next runs' size follows."""
        if records <= 0:
            return
        self._samples.append((records, max(0.0, seconds)))
        self._runs += 1
        fit = self.fit()
        if fit is None:  # the time did not grow with the run's size
            self.limit = min(self.max_records, 2 * max(n for n, _ in self._samples))
            return
        fixed, per_record = fit
        if per_record <= 0:  # no time at all
            self.limit = self.max_records
            return
        target = max(self.budget_s, 4 * fixed) if fixed > self.budget_s / 2 else self.budget_s
        limit = int(min(self.max_records, max(1, round((target - fixed) / per_record))))
        if not self._spread() and self._runs % 8 == 0:
            limit = min(self.max_records, 2 * limit)
        self.limit = limit

    def fit(self) -> tuple[float, float] | None:
        """(c, r): the fixed cost of a run and the cost per record, in
        seconds; None when the runs differ in size and the larger did not
        take longer."""
        n = np.array([s[0] for s in self._samples], dtype=np.float64)
        t = np.array([s[1] for s in self._samples], dtype=np.float64)
        if not self._spread():
            return 0.0, float(t.sum() / n.sum())
        dn = n - n.mean()  # least squares, as np.polyfit(n, t, 1) without its cost
        slope = float(dn @ (t - t.mean()) / (dn @ dn))
        intercept = float(t.mean() - slope * n.mean())
        if not slope > 0:
            return None
        return max(0.0, float(intercept)), float(slope)

    def _spread(self) -> bool:
        sizes = [n for n, _ in self._samples]
        return max(sizes) >= 1.5 * min(sizes)


_DATA, _CONTROL, _WATERMARK, _SKIP, _REJECTED = range(5)
_KINDS = (SegmentKind.DATA, SegmentKind.CONTROL, SegmentKind.WATERMARK, SegmentKind.SKIP, SegmentKind.REJECTED)
