"""Cutting a micro-batch into segments: the unit the barrier handler drives.

A batch (all channels of a task, ordered by channel and offset) becomes, per
channel, runs of data records and single control or watermark records.
Records that an older generation wrote on an internal topic after the
restored barrier of their channel are stale (docs/architecture.md,
"Restore"): they become ``SKIP`` segments, whose positions count but whose
records are not processed, since the new generation writes them again."""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa

from barriers.lineage import Lineage
from barriers.messages import GENERATION_HEADER, KIND_HEADER, ChannelId
from streaming.adapters.records import header_values
from streaming.engine.watermarks import WATERMARK_KIND

__all__ = ["SegmentKind", "Segment", "Segmenter"]


class SegmentKind(enum.StrEnum):
    DATA = "data"  # a run of data records
    CONTROL = "control"  # one barrier or cancellation
    WATERMARK = "watermark"  # one header-only record that moves the channel's watermark
    SKIP = "skip"  # a run of stale records of an older generation


@dataclass(slots=True)
class Segment:
    """A run of records of one channel (see ``SegmentKind``)."""

    channel: ChannelId
    rows: pa.Table
    kind: SegmentKind = SegmentKind.DATA

    @property
    def first_offset(self) -> int:
        return int(self.rows["offset"][0].as_py())

    @property
    def last_offset(self) -> int:
        return int(self.rows["offset"][-1].as_py())

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes


class Segmenter:
    """Cuts the batches of one task of generation ``generation``;
    ``internal_topics`` are the stage-to-stage topics (only those carry
    records of older generations that can be stale)."""

    def __init__(self, internal_topics: Iterable[str], generation: int, lineage: Lineage):
        self._internal = frozenset(internal_topics)
        self._generation = generation
        self._lineage = lineage

    def cut(self, table: pa.Table) -> list[Segment]:
        n = table.num_rows
        marks = header_values(table, KIND_HEADER).to_pylist()
        generations = header_values(table, GENERATION_HEADER).to_pylist()
        topics = table["topic"].to_pylist()
        partitions = table["partition"].to_pylist()
        offsets = table["offset"].to_pylist()
        kinds = []
        for i in range(n):
            kind = (
                SegmentKind.DATA
                if marks[i] is None
                else SegmentKind.WATERMARK
                if marks[i] == WATERMARK_KIND
                else SegmentKind.CONTROL
            )
            # records of an older generation on internal topics after a
            # restored barrier were written by a run that failed
            if (
                kind is not SegmentKind.CONTROL
                and topics[i] in self._internal
                and generations[i] is not None
                and int(generations[i]) < self._generation
                and self._lineage.is_stale(ChannelId(topics[i], partitions[i]), int(generations[i]), offsets[i])
            ):
                kind = SegmentKind.SKIP
            kinds.append(kind)
        segments: list[Segment] = []
        start = 0
        for i in range(1, n + 1):
            if (
                i < n
                and kinds[i] is kinds[start]
                and kinds[i] in (SegmentKind.DATA, SegmentKind.SKIP)
                and (topics[i], partitions[i]) == (topics[start], partitions[start])
            ):
                continue
            channel = ChannelId(topics[start], int(partitions[start]))
            segments.append(Segment(channel, table.slice(start, i - start), kinds[start]))
            start = i
        return segments
