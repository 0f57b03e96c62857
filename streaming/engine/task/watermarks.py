"""Event-time watermarks of a stage task (docs/architecture/protocol.md, "Event time").

Which inputs take part: an ingress channel whose topic names an
``event_time`` column, and an internal channel whose upstream stage has such
an input, however far up (``Pipeline.carries_event_time``).  The others (a
table, a changelog) never hold event time back.

Each channel's watermark:

- ingress: the highest event time read on it minus the ingress's
  ``max_out_of_orderness``; a watermark record a producer appended
  (``abs.kind=watermark``, ``abs.wm=N``; ``streaming.end_input`` writes
  ``MAX_WATERMARK``, the end of the partition's input) moves it to N;
- internal: the ``abs.wm`` header of its records, the watermark of the task
  that wrote them (a header-only watermark record where no row goes).

Idleness: an ingress channel is idle once a micro-batch of the task comes
without its records after it brought none for its topic's ``idle_timeout``
(the batch shows that Kafka had none to give: a slow batch is not
silence), or once a batch comes without its records after the task's other
event-time inputs moved on by its ``idle_after_event_time`` since it last
brought one (no clock: a pause of every input makes nothing idle), until
its next record.  One that brought none yet counts from where the others
were when the task started: their restored watermarks (so a partition that
never speaks is left behind even when the rest of the others' input comes
in the first micro-batch after a restore), or, on a first start, where the
batch that gave them their first watermark took them.  Once the others'
input ended (``MAX_WATERMARK``) it is left behind at once; while the task
replays copied channel state, the channels still to replay count as
bringing records.  An internal channel is idle from a
watermark record of its writer that says so (``abs.idle``) to its next
record.  Idle channels are left out of the minimum.

The task's watermark is the minimum over its active event-time inputs; it
never goes back, stays where it is while an active input has none yet and
while every input is idle.  A task whose every event-time input is idle is
idle itself and says so downstream, so that tasks there do not wait for it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import cast

import pyarrow as pa
import pyarrow.compute as pc

from barriers.headers import GENERATION_HEADER, IDLE_HEADER, KIND_HEADER, WATERMARK_HEADER
from barriers.messages import ChannelId
from streaming.adapters.serde.records import header_values, whole_numbers
from streaming.api.pipeline import Pipeline, TaskSpec
from streaming.api.producing import MAX_WATERMARK, WATERMARK_KIND

__all__ = [
    "WATERMARK_KIND",
    "MAX_WATERMARK",
    "EventTimeInput",
    "event_time_inputs",
    "WatermarkTracker",
    "watermark_headers",
]


_NEVER_SENT = -(1 << 63)


def watermark_headers(watermark: int | None, generation: int | None = None, *, idle: bool = False) -> list:
    """Headers of a watermark record: event time reached ``watermark`` (None:
    unknown yet), and with ``idle`` the writer has no active input."""
    headers = [(KIND_HEADER, WATERMARK_KIND)]
    if watermark is not None:
        headers.append((WATERMARK_HEADER, str(watermark).encode()))
    if idle:
        headers.append((IDLE_HEADER, b"1"))
    if generation is not None:
        headers.append((GENERATION_HEADER, str(generation).encode()))
    return headers


@dataclass(frozen=True, slots=True)
class EventTimeInput:
    """How one input channel of a task carries event time: an ingress
    channel's ``column`` (with its delay and idleness: a wall-clock
    timeout, an amount of event time the others move on), or, with no
    column, the ``abs.wm`` headers its upstream task writes."""

    column: str | None = None
    delay_ms: int = 0
    idle_timeout_s: float | None = None
    idle_after_ms: int | None = None


def event_time_inputs(pipeline: Pipeline, spec: TaskSpec) -> dict[ChannelId, EventTimeInput]:
    """The input channels of task ``spec`` that carry event time."""
    inputs: dict[ChannelId, EventTimeInput] = {}
    for channel, name in spec.inputs.items():
        ingress = pipeline.ingress_named(name)
        if ingress is not None:
            if ingress.event_time is not None:
                # Ingress turned each duration into whole milliseconds when it was made
                delay = cast(int, ingress.max_out_of_orderness)
                idle_ms = cast(int | None, ingress.idle_timeout)
                behind = cast(int | None, ingress.idle_after_event_time)
                idle = None if idle_ms is None else idle_ms / 1000
                inputs[channel] = EventTimeInput(ingress.event_time, delay, idle, behind)
        elif pipeline.carries_event_time(name):
            inputs[channel] = EventTimeInput()
    return inputs


def _millis(values: pa.ChunkedArray | pa.Array) -> int | None:
    """The highest of ``values`` (int ms or a timestamp) in milliseconds."""
    if pa.types.is_timestamp(values.type):
        values = values.cast(pa.timestamp("ms", values.type.tz)).cast(pa.int64())
    highest = pc.max(values).as_py()
    return None if highest is None else int(highest)


class WatermarkTracker:
    """Each event-time input's watermark and idleness, the task's watermark,
    and what was last said downstream (see the module docstring)."""

    def __init__(
        self,
        inputs: Mapping[ChannelId, EventTimeInput],
        start: Mapping[ChannelId, int],
        *,
        clock: Callable[[], float] = time.monotonic,
    ):
        self._inputs = dict(inputs)
        self._by_channel: dict[ChannelId, int] = {c: int(w) for c, w in start.items() if c in self._inputs}
        self._clock = clock
        now = clock()
        self._last_seen = {c: now for c in self._inputs}
        self._said_idle: set[ChannelId] = set()
        self._timed_out: set[ChannelId] = set()
        # idle_after_event_time: its channels, and how far the other inputs had got when one last brought records
        self._behind_after = {c: s.idle_after_ms for c, s in self._inputs.items() if s.idle_after_ms is not None}
        # a channel that brought none yet counts from where the others were restored (an ended input aside)
        self._anchor: dict[ChannelId, int] = {}
        for channel in self._behind_after:
            others = [w for c, w in self._by_channel.items() if c != channel and w < MAX_WATERMARK]
            if others:
                self._anchor[channel] = max(others)
        self._left_behind: set[ChannelId] = set()
        self._brought: set[ChannelId] = set()
        self._watermark: int | None = None
        self._sent = _NEVER_SENT
        self._sent_idle = False

    @property
    def has_event_time(self) -> bool:
        """Whether any input carries event time."""
        return bool(self._inputs)

    @property
    def current(self) -> int | None:
        """The task's watermark (None before its first)."""
        return self._watermark

    def batch(self, brought: Iterable[ChannelId]) -> None:
        """A micro-batch came, with records (not barriers) on ``brought``: an
        idle ingress channel among them holds event time back again, and an
        ingress channel not among them that brought none for its
        ``idle_timeout``, or while the others moved on by its
        ``idle_after_event_time``, is idle from now on."""
        now = self._clock()
        brought = set(brought)
        self._brought = brought
        for channel, source in self._inputs.items():
            if source.column is None:
                continue
            if channel in brought:
                self._last_seen[channel] = now
                self._timed_out.discard(channel)
                self._left_behind.discard(channel)
            elif source.idle_timeout_s is not None and now - self._last_seen[channel] >= source.idle_timeout_s:
                self._timed_out.add(channel)

    def _leave_behind(self) -> None:
        """``idle_after_event_time``, as the batch in hand moved watermarks:
        a channel that brought records in it is anchored where the other
        inputs got to; one that did not is idle once they moved on past its
        anchor by that much."""
        for channel, after_ms in self._behind_after.items():
            others = max((w for c, w in self._by_channel.items() if c != channel), default=None)
            if others is None:
                continue
            if channel in self._brought:
                self._anchor[channel] = others
            elif others >= MAX_WATERMARK or others - self._anchor.setdefault(channel, others) >= after_ms:
                self._left_behind.add(channel)  # the others moved on that much, or their input ended

    def observe(self, channel: ChannelId, rows: pa.Table, decoded: pa.Table | None) -> None:
        """Take what the processed ``rows`` of ``channel`` say about event
        time: their ``abs.wm`` headers, and with ``decoded`` (data records;
        None for a watermark record, whose ``abs.idle`` header counts) the
        event-time column of an ingress channel."""
        source = self._inputs.get(channel)
        if source is None or rows.num_rows == 0:
            return
        # a record whose abs.wm is no whole number never gets here: the segmenter made it a dead letter
        latest = pc.max(whole_numbers(header_values(rows, WATERMARK_HEADER)).values).as_py()
        if source.column is None:
            # a data record says its writer is active; a watermark record says whether it is
            if decoded is None and header_values(rows, IDLE_HEADER)[-1].is_valid:
                self._said_idle.add(channel)
            else:
                self._said_idle.discard(channel)
        elif decoded is not None and decoded.num_rows and source.column in decoded.column_names:
            highest = _millis(decoded[source.column])
            if highest is not None:
                highest -= source.delay_ms
                latest = highest if latest is None else max(latest, highest)
        self._move(channel, latest)

    def event_time_of(self, channel: ChannelId, rows: pa.Table) -> tuple[bool, int | None]:
        """Whether ``rows`` (of ``channel``) carry its event-time column (ms
        or a timestamp), and the highest event time among them (ms, None
        when none has one), as ``observe_event_time`` takes it."""
        source = self._inputs.get(channel)
        if source is None or source.column is None or source.column not in rows.column_names:
            return False, None
        values = rows[source.column]
        if not (pa.types.is_integer(values.type) or pa.types.is_timestamp(values.type)):
            return False, None  # a column of that name the stage's code made, but no time
        return True, _millis(values) if rows.num_rows else None

    def observe_event_time(self, channel: ChannelId, highest: int | None) -> None:
        """Records of ingress channel ``channel`` were processed whose highest
        event time is ``highest`` ms (None: none had one), as a stage's Spark
        code reports it."""
        source = self._inputs.get(channel)
        if source is not None and source.column is not None and highest is not None:
            self._move(channel, highest - source.delay_ms)

    def _move(self, channel: ChannelId, latest: int | None) -> None:
        if latest is not None and latest > self._by_channel.get(channel, latest - 1):
            self._by_channel[channel] = latest

    def idle(self, channel: ChannelId) -> bool:
        return channel in self._said_idle or channel in self._timed_out or channel in self._left_behind

    def idle_inputs(self, inputs: Iterable[ChannelId]) -> int:
        """How many event-time channels among ``inputs`` are idle."""
        return sum(1 for c in inputs if c in self._inputs and self.idle(c))

    def _active(self, inputs: Iterable[ChannelId]) -> tuple[list[ChannelId], bool]:
        """The active event-time channels among ``inputs``, and whether every
        event-time channel among them is idle (there being one)."""
        timed = [c for c in inputs if c in self._inputs]
        active = [c for c in timed if not self.idle(c)]
        return active, bool(timed) and not active

    def update(self, inputs: Iterable[ChannelId]) -> int | None:
        """The task's watermark over the open ``inputs`` if it moved on since
        the last call, else None."""
        self._leave_behind()
        active, _ = self._active(inputs)
        if not active or any(c not in self._by_channel for c in active):
            return None
        low = min(self._by_channel[c] for c in active)
        if self._watermark is not None and low <= self._watermark:
            return None
        self._watermark = low
        return low

    def take_unsent(self, inputs: Iterable[ChannelId], watermark: int | None) -> tuple[int | None, bool] | None:
        """What to tell downstream, when it changed since the last call:
        ``watermark`` (the task's, held back by what its operator buffers)
        and whether the task is idle; else None."""
        _, idle = self._active(inputs)
        moved = watermark is not None and watermark > self._sent
        if not moved and idle == self._sent_idle:
            return None
        if watermark is not None:
            self._sent = max(self._sent, watermark)
        self._sent_idle = idle
        return watermark, idle

    def snapshot(self) -> dict[ChannelId, int]:
        return dict(self._by_channel)
