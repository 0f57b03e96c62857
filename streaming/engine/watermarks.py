"""Event-time watermarks of a stage task.

An ingress topic may name an event-time column whose values do not decrease
within a partition; a record on an internal topic carries the watermark of
the task that wrote it in its ``abs.wm`` header, and a header-only record
(``abs.kind=watermark``) moves a channel's watermark where no row goes.  A
task's watermark is the minimum over its open inputs (None until every one
has one), so windows close only when every input passed them."""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import GENERATION_HEADER, KIND_HEADER, ChannelId
from streaming.adapters.records import header_values

__all__ = ["WATERMARK_HEADER", "WATERMARK_KIND", "WatermarkTracker", "watermark_headers"]

WATERMARK_HEADER = "abs.wm"
# a record with only headers that moves the watermark of its channel
WATERMARK_KIND = b"watermark"

_NEVER_SENT = -(1 << 63)


def watermark_headers(watermark: int, generation: int | None = None) -> list[tuple[str, bytes]]:
    """Headers of a watermark record (sources append one to say event time
    reached ``watermark``, e.g. a far-future one at the end of their input)."""
    headers = [(KIND_HEADER, WATERMARK_KIND), (WATERMARK_HEADER, str(watermark).encode())]
    if generation is not None:
        headers.append((GENERATION_HEADER, str(generation).encode()))
    return headers


class WatermarkTracker:
    """Each input channel's watermark, and what was last sent downstream.
    ``event_time`` maps an ingress topic to its event-time column."""

    def __init__(self, event_time: Mapping[str, str], start: Mapping[ChannelId, int]):
        self._event_time = dict(event_time)
        self._by_channel: dict[ChannelId, int] = dict(start)
        self._sent = _NEVER_SENT

    def current(self, inputs: Iterable[ChannelId]) -> int | None:
        """The minimum over ``inputs`` (None until all have a watermark)."""
        inputs = list(inputs)
        if not all(c in self._by_channel for c in inputs):
            return None
        return min(self._by_channel[c] for c in inputs)

    def advance(
        self, channel: ChannelId, rows: pa.Table, decoded: pa.Table | None, inputs: Iterable[ChannelId]
    ) -> int | None:
        """Take what ``rows`` of ``channel`` say about event time (their
        ``abs.wm`` headers; with ``decoded``, the event-time column); the
        task's new watermark over ``inputs`` when that moved it, else None."""
        inputs = list(inputs)
        latest = max((int(m) for m in header_values(rows, WATERMARK_HEADER).to_pylist() if m), default=None)
        column = self._event_time.get(channel.topic)
        if column is not None and decoded is not None and column in decoded.column_names and decoded.num_rows:
            latest = max(v for v in (latest, pc.max(decoded[column]).as_py()) if v is not None)
        if latest is None or latest <= self._by_channel.get(channel, latest - 1):
            return None
        before = self.current(inputs)
        self._by_channel[channel] = int(latest)
        after = self.current(inputs)
        return after if after is not None and after != before else None

    def take_unsent(self, inputs: Iterable[ChannelId]) -> int | None:
        """The watermark over ``inputs`` if it is newer than the last one
        taken (which it then becomes), else None."""
        watermark = self.current(inputs)
        if watermark is None or watermark <= self._sent:
            return None
        self._sent = watermark
        return watermark

    def snapshot(self) -> dict[ChannelId, int]:
        return dict(self._by_channel)
