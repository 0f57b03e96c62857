"""``CopiedReplay``: restored copied channel state, handed over in runs, and
what a checkpoint taken meanwhile holds of it."""

from __future__ import annotations

import pyarrow as pa
import pytest
from task_cases import batch

from barriers.messages import ChannelId
from streaming.engine.task.replay import CopiedReplay

A, B = ChannelId("in", 0), ChannelId("in", 1)


def _copied(channel: ChannelId, offsets) -> pa.Table:
    return batch(*[(channel.topic, channel.partition, o, {"n": o}) for o in offsets])


def test_runs_go_channel_by_channel_in_offset_order():
    replay = CopiedReplay({B: _copied(B, range(0, 3)), A: _copied(A, range(5, 10))}, run_records=2)
    assert replay.records == 8 and replay.ends == {A: 10, B: 3}
    runs = []
    while replay.handing:
        runs.append([(r["partition"], r["offset"]) for r in replay.next_run().to_pylist()])
    assert runs == [[(0, 5), (0, 6)], [(0, 7), (0, 8)], [(0, 9)], [(1, 0), (1, 1)], [(1, 2)]]
    assert replay.next_run() is None


def test_the_rest_is_what_a_channel_has_not_processed():
    replay = CopiedReplay({A: _copied(A, [5, 6, 8, 9]), B: _copied(B, range(0, 3))})
    rest = replay.rest({A: 7, B: 3})  # B is done; A processed up to 6 (7 is not in the copy)
    assert list(rest) == [A] and rest[A].records["offset"].to_pylist() == [8, 9]
    assert rest[A].kafka_from == 10  # no resume offset given: right after the copy
    assert replay.rest({A: 0, B: 0})[A].records["offset"].to_pylist() == [5, 6, 8, 9]


def test_kafka_goes_on_from_where_the_query_resumes_the_channel():
    replay = CopiedReplay({A: _copied(A, range(5, 10))}, resume={A: 11})  # the barrier at 10
    assert replay.ends == {A: 10} and replay.rest({A: 7})[A].kafka_from == 11


def test_a_channel_processed_past_its_copy_is_let_go_once_handed_over():
    replay = CopiedReplay({A: _copied(A, range(5, 7)), B: _copied(B, range(0, 3))}, run_records=5)
    replay.forget({A: 7})  # not handed over yet: kept
    assert set(replay.ends) == {A, B}
    replay.next_run()
    replay.forget({A: 7, B: 1})
    assert set(replay.ends) == {B} and list(replay.rest({B: 1})) == [B]


def test_empty_tables_are_nothing_to_replay():
    replay = CopiedReplay({A: _copied(A, [])})
    assert replay.records == 0 and not replay.handing and replay.rest({}) == {}
    with pytest.raises(ValueError, match="run_records"):
        CopiedReplay({}, run_records=0)
