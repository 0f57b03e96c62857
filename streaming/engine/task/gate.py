"""A task's input gate: its micro-batches cut into segments per channel and
queued, handed out round-robin from the channels alignment has not blocked,
with the held records' memory bounded.

Each micro-batch (all channels of the task, ordered by channel and offset)
is cut into segments (``streaming.engine.task.segments``): runs of data records,
and single control records (barriers, cancellations).  Segments wait in
per-channel queues; a blocked channel's segments are held (alignment) while
the others go on.  A run of data is handed out in pieces of as many records
as the task processes in its time budget (``SegmentPace``), so a control
event waits for at most about that long.  Past ``held_memory_bytes`` the
newest held runs let go of their records, which are read again from Kafka by
offset range when their channel is released, as unaligned channel state is."""

from __future__ import annotations

import collections
import time
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.compute as pc

from barriers.messages import ChannelId
from streaming.adapters.serde.records import BATCH_COLUMNS, is_prepared
from streaming.engine.task.segments import Segment, Segmenter, SegmentKind, SegmentPace
from streaming.errors import TaskError

__all__ = ["InputGate"]

# (channel, start, end) -> the records at [start, end), read from Kafka in bulk
ReadRange = Callable[[ChannelId, int, int], pa.Table]


class InputGate:
    """The input queues of task ``task`` over ``channels`` (see the module docstring)."""

    def __init__(
        self,
        task: str,
        channels: Iterable[ChannelId],
        segmenter: Segmenter,
        counters: collections.Counter,
        *,
        read_range: ReadRange | None = None,
        held_memory_bytes: int = 256 << 20,
        pace: SegmentPace | None = None,
        clock: Callable[[], float] = time.perf_counter,
    ):
        self.task = task
        self._segmenter = segmenter
        self.pace = pace
        self._clock = clock
        self._queues: dict[ChannelId, collections.deque[Segment]] = {c: collections.deque() for c in channels}
        self.counters = counters
        self._read_range = read_range
        # held records past this many bytes are let go and read again from Kafka
        self._held_memory = held_memory_bytes
        self.held_max = 0

    def queue(self, channel: ChannelId) -> collections.deque[Segment]:
        return self._queues[channel]

    def add(self, table: pa.Table) -> set[ChannelId]:
        """A micro-batch, ordered by channel and offset, cut into the queues;
        the channels that brought records (barriers and cancellations aside)."""
        brought = set()
        for segment in self._segmenter.cut(table):
            self._queues[segment.channel].append(segment)
            if segment.kind is not SegmentKind.CONTROL:
                brought.add(segment.channel)
        return brought

    def drain(
        self, is_blocked: Callable[[ChannelId], bool], handle: Callable[[Segment], None], between: Callable[[], None]
    ) -> None:
        """Hand every queued segment of a channel that is not blocked to
        ``handle``, round-robin over the channels, calling ``between`` before
        each (and once at the end) until no channel can go on."""
        progress = True
        while progress:
            progress = False
            for channel in sorted(self._queues):
                between()
                queue = self._queues[channel]
                if queue and not is_blocked(channel):
                    self._hand(queue, handle)
                    progress = True
        between()

    def _hand(self, queue: collections.deque[Segment], handle: Callable[[Segment], None]) -> None:
        """The queue's next segment to ``handle``: a run of data as much of it
        as the pace allows (the rest stays first in the queue), timed."""
        segment = queue.popleft()
        if self.pace is not None and segment.kind is SegmentKind.DATA and segment.spilled:
            segment = self._read_back(segment)  # to be handed out in pieces too
        if self.pace is None or not segment.splittable:
            handle(segment)
            return
        segment, rest = segment.split(self.pace.limit)
        if rest is not None:
            queue.appendleft(rest)
        began = self._clock()
        handle(segment)
        self.pace.observe(segment.rows_in_hand().num_rows, self._clock() - began)

    def held_bytes(self, blocked: Iterable[ChannelId]) -> int:
        """Bytes of the records held on the ``blocked`` channels (spilled ones included)."""
        return sum(s.nbytes for c in blocked for s in self._queues[c])

    def note_held(self, held: int) -> None:
        """``held`` bytes are held now (the most since ``take_held_max`` is kept)."""
        self.held_max = max(self.held_max, held)

    def bound(self, held: int, blocked: Iterable[ChannelId]) -> None:
        """With ``held`` bytes held, more than ``held_memory_bytes``: the newest
        held runs of the ``blocked`` channels let go of their records."""
        if held > self._held_memory:
            self._spill(blocked)

    def take_held_max(self) -> int:
        """The most bytes held since the last call."""
        held, self.held_max = self.held_max, 0
        return held

    def _spill(self, blocked: Iterable[ChannelId]) -> None:
        if self._read_range is None:
            return
        blocked = sorted(blocked)
        in_memory = sum(s.nbytes for c in blocked for s in self._queues[c] if not s.spilled)
        for channel in blocked:
            for segment in reversed(self._queues[channel]):
                if in_memory <= self._held_memory:
                    return
                if not segment.spilled:
                    segment.spill()
                    if segment.spilled:
                        in_memory -= segment.nbytes
                        self.counters["spilled_segments"] += 1

    def fresh(self, segment: Segment, position: int) -> Segment | None:
        """``segment`` from ``position`` (its channel's) on: None when Spark
        handed all of it again (a retried batch), its records read back from
        Kafka when they were let go, the part before the position cut off."""
        if segment.last_offset < position:
            return None
        if segment.spilled:
            segment = self._read_back(segment)
        if segment.first_offset < position:
            rows = segment.rows_in_hand()
            kept = rows.filter(pc.greater_equal(rows["offset"], position))
            segment = Segment(segment.channel, kept, segment.kind, segment.reason)
        return segment

    def _read_back(self, segment: Segment) -> Segment:
        assert self._read_range is not None  # only spilled with a way to read back
        rows = self._read_range(segment.channel, segment.first_offset, segment.last_offset + 1)
        offsets = rows["offset"]
        if (
            rows.num_rows == 0
            or offsets[0].as_py() != segment.first_offset
            or offsets[-1].as_py() != segment.last_offset
        ):
            raise TaskError(
                f"{self.task}: held records [{segment.first_offset}, {segment.last_offset}] of "
                f"{segment.channel} could not be read back from Kafka ({rows.num_rows} records came back)"
            )
        self.counters["read_back_segments"] += 1
        return Segment(segment.channel, rows if is_prepared(rows) else rows.select(list(BATCH_COLUMNS)), segment.kind)
