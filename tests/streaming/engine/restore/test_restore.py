"""Where a task starts in a new generation: fresh, from the beginning, or
from its snapshot, with unaligned channel state first."""

from __future__ import annotations

import pyarrow as pa

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming.adapters.snapshots import LoadedTask, TaskSnapshot
from streaming.engine.restore.start import plan_start

A, B, C = ChannelId("t", 0), ChannelId("t", 1), ChannelId("t", 2)


def test_a_fresh_job_starts_every_channel_at_the_beginning():
    plan = plan_start(0, None, None)
    assert plan.query_start == {} and plan.start.generation == 0 and plan.start.checkpoint_id is None


def test_a_later_generation_without_a_checkpoint_treats_older_records_as_stale():
    plan = plan_start(3, None, None)
    assert plan.query_start == {} and plan.start.generation == 3
    assert plan.start.lineage.is_stale(A, 2, 0)


def test_from_a_snapshot_channel_state_comes_first():
    copied = pa.table({"offset": [4, 5]})
    snapshot = TaskSnapshot(
        "x-0",
        7,
        1,
        positions={"t:0": 10, "t:1": 20, "t:2": 30},
        in_flight={"t:1": (15, 18), "t:2": (25, 27)},
        metadata={"watermarks": {"t:0": 99}, "lineage": Lineage().to_json()},
    )
    loaded = LoadedTask(snapshot, {"state": pa.table({"n": [1]})}, {"t:2": copied})
    plan = plan_start(2, 7, loaded)
    # A: no channel state; B: a range, read again by the query from its start; C: copied, replayed
    assert plan.start.positions == {A: 10, B: 15, C: 25}
    assert plan.query_start == {A: 10, B: 15, C: 30}
    assert plan.start.replay == {C: copied}
    assert plan.start.replay_until == {B: 18}  # the range B [15, 18) is replayed once read again
    assert plan.start.watermarks == {A: 99} and plan.start.checkpoint_id == 7 and plan.start.generation == 2
    assert set(plan.start.state) == {"state"}
