"""A task's input gate (``streaming.engine.task.gate``) on hand-made micro-batches:
segments queued per channel and handed out round-robin from the channels
that are not blocked, runs handed in pieces of the pace, held records past
the memory bound let go and read back by offset range."""

from __future__ import annotations

import collections

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from task_cases import batch

from barriers.lineage import Lineage
from barriers.messages import Barrier, ChannelId
from streaming.engine.task.gate import InputGate
from streaming.engine.task.segments import Segment, Segmenter, SegmentKind, SegmentPace
from streaming.engine.task.watermarks import watermark_headers
from streaming.errors import TaskError

A, B, C = ChannelId("t", 0), ChannelId("t", 1), ChannelId("t", 2)


def _gate(channels=(A, B, C), *, max_records=50_000, **kwargs) -> InputGate:
    segmenter = Segmenter([], 0, Lineage(), max_records=max_records)
    return InputGate("count-0", channels, segmenter, collections.Counter(), **kwargs)


def _data(channel: ChannelId, *offsets: int) -> list[tuple]:
    return [(channel.topic, channel.partition, o, {"n": o}) for o in offsets]


def _offsets(segment: Segment) -> list[int]:
    return segment.rows_in_hand()["offset"].to_pylist()


class Kafka:
    """The records a gate reads back by offset range (its ``read_range``), kept in memory."""

    def __init__(self, table: pa.Table):
        self.table = table
        self.reads: list[tuple[ChannelId, int, int]] = []

    def __call__(self, channel: ChannelId, start: int, end: int) -> pa.Table:
        self.reads.append((channel, start, end))
        rows = self.table.to_pylist()
        keep = [
            r
            for r in rows
            if (r["topic"], r["partition"]) == (channel.topic, channel.partition) and start <= r["offset"] < end
        ]
        return pa.Table.from_pylist(keep, schema=self.table.schema)


def test_add_queues_each_channels_segments_and_says_which_channels_brought_records():
    gate = _gate()
    brought = gate.add(
        batch(
            *_data(A, 0, 1),
            ("t", 0, 2, Barrier(1, job="job")),
            *_data(A, 3),
            ("t", 1, 0, Barrier(1, job="job")),  # B brings a barrier only
            ("t", 2, 0, b"", 0, dict(watermark_headers(5, 0))),  # C a watermark only
        )
    )
    assert brought == {A, C}
    assert [(s.kind, s.first_offset, s.last_offset) for s in gate.queue(A)] == [
        (SegmentKind.DATA, 0, 1),
        (SegmentKind.CONTROL, 2, 2),
        (SegmentKind.DATA, 3, 3),
    ]
    assert [s.kind for s in gate.queue(B)] == [SegmentKind.CONTROL]
    assert [s.kind for s in gate.queue(C)] == [SegmentKind.WATERMARK]
    assert gate.add(batch()) == set()


def test_drain_hands_out_one_segment_per_channel_in_turn_calling_between_before_each():
    gate = _gate(max_records=1)
    gate.add(batch(*_data(A, 0, 1, 2), *_data(B, 0), *_data(C, 0, 1)))
    log: list = []
    gate.drain(lambda c: False, lambda s: log.append((str(s.channel), s.first_offset)), lambda: log.append("between"))
    handed = [entry for entry in log if entry != "between"]
    assert handed == [("t:0", 0), ("t:1", 0), ("t:2", 0), ("t:0", 1), ("t:2", 1), ("t:0", 2)]
    # a control event that came in gets its turn before each segment, and after the last
    assert all(log[i - 1] == "between" for i, entry in enumerate(log) if entry != "between")
    assert log[-1] == "between"
    assert all(not gate.queue(c) for c in (A, B, C))


def test_a_blocked_channels_segments_are_held_in_order_while_the_others_go_on():
    gate = _gate()
    gate.add(batch(*_data(A, 0), ("t", 0, 1, Barrier(1, job="job")), *_data(A, 2, 3), *_data(B, 0, 1)))
    blocked: set[ChannelId] = set()
    handed: list[tuple[str, str, int]] = []

    def handle(segment: Segment) -> None:
        handed.append((str(segment.channel), segment.kind.value, segment.first_offset))
        if segment.kind is SegmentKind.CONTROL:  # alignment blocks a channel at its barrier
            blocked.add(segment.channel)

    gate.drain(blocked.__contains__, handle, lambda: None)
    assert handed == [("t:0", "data", 0), ("t:1", "data", 0), ("t:0", "control", 1)]
    assert [(s.first_offset, s.last_offset) for s in gate.queue(A)] == [(2, 3)]
    blocked.clear()
    gate.drain(blocked.__contains__, handle, lambda: None)
    assert handed[3:] == [("t:0", "data", 2)] and not gate.queue(A)


def test_with_a_pace_a_run_is_handed_in_pieces_timed_on_the_gates_clock():
    now = [0.0]

    def handle(segment: Segment) -> None:
        pieces.append(_offsets(segment))
        now[0] += 0.5 * segment.rows_in_hand().num_rows  # half a second per record

    pieces: list[list[int]] = []
    pace = SegmentPace(1.0, 1_000, first_records=2)
    gate = _gate(channels=(A, B), pace=pace, clock=lambda: now[0])
    gate.add(batch(*_data(A, *range(7)), ("t", 1, 0, Barrier(1, job="job"))))
    gate.drain(lambda c: False, handle, lambda: None)
    # B's barrier comes after A's first piece, not after A's whole run; the rest of the run follows in order
    assert pieces == [[0, 1], [0], [2, 3], [4, 5], [6]]
    fixed, per_record = pace.fit()
    assert per_record == pytest.approx(0.5) and fixed == pytest.approx(0.0, abs=1e-9)


def test_held_bytes_counts_the_blocked_channels_and_the_most_held_is_taken_once():
    gate = _gate()
    gate.add(batch(*_data(A, 0, 1), *_data(B, 0)))
    a, b = sum(s.nbytes for s in gate.queue(A)), sum(s.nbytes for s in gate.queue(B))
    assert gate.held_bytes([A]) == a and gate.held_bytes([A, B]) == a + b and gate.held_bytes([]) == 0
    gate.note_held(10)
    gate.note_held(30)
    gate.note_held(20)
    assert gate.take_held_max() == 30
    assert gate.take_held_max() == 0


def test_past_the_bound_the_newest_held_runs_let_go_and_are_read_back_in_order():
    table = batch(*_data(A, *range(8)), *_data(B, 0, 1))
    kafka = Kafka(table)
    gate = _gate(channels=(A, B), max_records=2, read_range=kafka)
    gate.add(table)
    run = gate.queue(A)[0].nbytes
    held = gate.held_bytes([A])
    limit = 2 * run  # room for two of A's four runs
    gate = _gate(channels=(A, B), max_records=2, read_range=kafka, held_memory_bytes=limit)
    gate.add(table)
    gate.bound(limit, [A])  # not past the bound: nothing let go
    assert not any(s.spilled for s in gate.queue(A))
    gate.bound(held, [A])
    assert [s.spilled for s in gate.queue(A)] == [False, False, True, True]
    assert not any(s.spilled for s in gate.queue(B))  # not blocked: not held
    assert gate.counters["spilled_segments"] == 2
    assert gate.held_bytes([A]) == held  # what is let go still counts as held
    handed: list[int] = []
    gate.drain(lambda c: False, lambda s: handed.extend(_offsets(gate.fresh(s, 0))), lambda: None)
    assert handed == [0, 1, 0, 1, 2, 3, 4, 5, 6, 7]
    assert sorted(kafka.reads) == [(A, 4, 6), (A, 6, 8)]
    assert gate.counters["read_back_segments"] == 2


def test_without_a_way_to_read_back_nothing_is_let_go_and_control_records_never_are():
    table = batch(*_data(A, 0, 1, 2, 3), ("t", 1, 0, Barrier(1, job="job")), ("t", 1, 1, Barrier(2, job="job")))
    gate = _gate(channels=(A, B), max_records=1, held_memory_bytes=0)
    gate.add(table)
    gate.bound(10**9, [A, B])
    assert not any(s.spilled for c in (A, B) for s in gate.queue(c))
    gate = _gate(channels=(A, B), max_records=1, held_memory_bytes=0, read_range=Kafka(table))
    gate.add(table)
    gate.bound(10**9, [A, B])
    assert [s.spilled for s in gate.queue(A)] == [True] * 4
    assert [s.spilled for s in gate.queue(B)] == [False, False]
    assert gate.counters["spilled_segments"] == 4


def test_fresh_drops_what_was_processed_and_cuts_a_segment_at_the_position():
    table = batch(*_data(A, 3, 4, 5, 6))
    gate = _gate(channels=(A,), read_range=Kafka(table))
    gate.add(table)
    (segment,) = gate.queue(A)
    assert gate.fresh(segment, 7) is None  # Spark handed all of it again
    assert gate.fresh(segment, 3) is segment
    assert _offsets(gate.fresh(segment, 5)) == [5, 6]
    assert _offsets(gate.fresh(segment, 6)) == [6]
    segment.spill()
    again = gate.fresh(segment, 5)
    assert again is not None and _offsets(again) == [5, 6] and again.kind is SegmentKind.DATA
    assert gate.counters["read_back_segments"] == 1


def test_held_records_that_cannot_be_read_back_whole_fail_the_task():
    table = batch(*_data(A, 3, 4, 5, 6))
    gone = Kafka(table.slice(1))  # retention took offset 3 meanwhile
    gate = _gate(channels=(A,), read_range=gone)
    gate.add(table)
    segment = gate.queue(A)[0]
    segment.spill()
    with pytest.raises(TaskError, match=r"held records \[3, 6\] of t:0 could not be read back .*3 records came back"):
        gate.fresh(segment, 0)
    with pytest.raises(TaskError, match="0 records came back"):
        _gate(channels=(A,), read_range=Kafka(table.slice(0, 0))).fresh(segment, 0)


# ---- properties of the round-robin


@st.composite
def _queues(draw):
    """Per channel, a run of offsets cut into segments of 1-3 records, and a max_records."""
    channels = [ChannelId("t", p) for p in range(draw(st.integers(1, 4)))]
    counts = {c: draw(st.integers(0, 7)) for c in channels}
    return channels, counts, draw(st.integers(1, 3))


@settings(max_examples=60, deadline=None, database=None)
@given(_queues(), st.sets(st.integers(0, 3)))
def test_the_round_robin_serves_every_unblocked_channel_each_pass_in_each_channels_order(queues, blocked_partitions):
    channels, counts, max_records = queues
    blocked = {c for c in channels if c.partition in blocked_partitions}
    gate = _gate(channels, max_records=max_records)
    gate.add(batch(*[r for c in channels for r in _data(c, *range(counts[c]))]))
    queued = {c: [(s.first_offset, s.last_offset) for s in gate.queue(c)] for c in channels}
    handed: list[tuple[ChannelId, int, int]] = []
    gate.drain(blocked.__contains__, lambda s: handed.append((s.channel, s.first_offset, s.last_offset)), lambda: None)
    # pass k hands the k-th segment of every open channel that has one, channels in order
    expected = [
        (c, *queued[c][k])
        for k in range(max(map(len, queued.values())))
        for c in sorted(channels)
        if c not in blocked and k < len(queued[c])
    ]
    assert handed == expected
    for c in channels:  # a blocked channel's segments all wait, untouched
        assert [(s.first_offset, s.last_offset) for s in gate.queue(c)] == (queued[c] if c in blocked else [])


@settings(max_examples=60, deadline=None, database=None)
@given(_queues(), st.integers(1, 4), st.data())
def test_blocking_and_releasing_as_it_goes_the_gate_never_hands_a_blocked_channel_nor_reorders_one(queues, limit, data):
    channels, counts, max_records = queues
    pace = SegmentPace(1.0, limit, first_records=limit)
    gate = _gate(channels, max_records=max_records, pace=pace, clock=lambda: 0.0)
    gate.add(batch(*[r for c in channels for r in _data(c, *range(counts[c]))]))
    blocked: set[ChannelId] = set()
    got: dict[ChannelId, list[int]] = {c: [] for c in channels}

    def handle(segment: Segment) -> None:
        assert segment.channel not in blocked
        assert segment.rows_in_hand().num_rows <= max(limit, 1)
        got[segment.channel].extend(_offsets(segment))
        # alignment blocks and releases channels while the gate drains
        blocked.symmetric_difference_update(data.draw(st.sets(st.sampled_from(channels), max_size=2)))

    for _ in range(100):  # each drain from nothing blocked hands at least one segment
        if not any(gate.queue(c) for c in channels):
            break
        gate.drain(blocked.__contains__, handle, lambda: None)
        for c in channels:  # drain stops only when every open channel is empty
            assert c in blocked or not gate.queue(c)
        blocked.clear()
    assert got == {c: list(range(counts[c])) for c in channels}
