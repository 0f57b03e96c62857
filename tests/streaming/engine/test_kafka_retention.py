"""What checkpoints rely on Kafka to keep (``streaming.engine.kafka_retention``),
without services: the offsets a restore reads again, a restore that skips a
checkpoint whose offsets are gone for the newest one Kafka still holds (or
stops, naming what is gone, when none is left), and a task that copies the
channel state time retention may delete before its checkpoint is superseded
and warns about a position it may delete."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest
from task_cases import batch, make_task

from barriers.messages import Barrier, ChannelId, CheckpointOptions
from operators import KeyedAggregate, count, sum_
from streaming.adapters.kafka.control.events import Trigger, announced_barrier
from streaming.adapters.snapshots import Manifest, PartInfo, TaskSnapshot
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.kafka_retention import (
    AtRisk,
    KafkaKept,
    Need,
    RetentionWatch,
    needs,
    pick_restorable,
    relied_on_ms,
)
from streaming.errors import JobFailed, OffsetsGoneError

A, B, L = ChannelId("in", 0), ChannelId("in", 1), ChannelId("job.legs", 0)


def _snapshot(checkpoint_id, task="t-0", positions=None, in_flight=None, copied=()):
    return TaskSnapshot(
        task,
        checkpoint_id,
        0,
        positions=positions or {},
        in_flight=in_flight or {},
        channel_parts=tuple(PartInfo(c, f"t-0/channels/{c}.parquet", 1, 1, "x") for c in copied),
    )


def _manifest(checkpoint_id, *snapshots):
    return Manifest("job", checkpoint_id, 0, {s.task: s for s in snapshots}, "2026-11-26T00:00:00+00:00")


def test_a_restore_reads_a_range_from_its_start_and_a_copied_one_from_its_position():
    snapshot = _snapshot(
        3,
        positions={"in:0": 120, "in:1": 40, "job.legs:0": 71},
        in_flight={"in:0": (90, 119), "job.legs:0": (12, 70)},
        copied=("job.legs:0",),
    )
    assert needs(snapshot) == [
        Need("t-0", A, 90, "range"),
        Need("t-0", B, 40, "position"),
        Need("t-0", L, 71, "position"),  # its records are in the checkpoint
    ]


class _Store:
    """Checkpoints newest first as ``latest_verified(exclude)`` walks them; ``damaged`` do not verify."""

    def __init__(self, manifests, damaged=()):
        self.manifests = {m.checkpoint_id: m for m in manifests}
        self.damaged = set(damaged)

    def latest_verified(self, exclude=()):
        skipped = []
        for checkpoint_id in sorted(self.manifests, reverse=True):
            if checkpoint_id in set(exclude):
                continue
            if checkpoint_id in self.damaged:
                skipped.append((checkpoint_id, ["part 'state' is missing"]))
                continue
            return self.manifests[checkpoint_id], skipped
        return None, skipped


def _kept(earliest):
    asked = []

    def query(channels):
        asked.append(list(channels))
        return {c: earliest.get(c, 0) for c in channels}

    return KafkaKept(query), asked


def test_a_checkpoint_whose_range_is_gone_is_skipped_for_the_newest_one_kafka_still_holds():
    # checkpoint 5 kept [100, 180) of in:0 as a range; checkpoint 4 copied its channel state and resumes at 150
    store = _Store(
        [
            _manifest(4, _snapshot(4, positions={"in:0": 150}, in_flight={"in:0": (95, 149)}, copied=("in:0",))),
            _manifest(5, _snapshot(5, positions={"in:0": 181}, in_flight={"in:0": (100, 180)})),
            _manifest(6, _snapshot(6, positions={"in:0": 200})),
        ],
        damaged=[6],
    )
    kept, asked = _kept({A: 120})
    manifest, skipped = pick_restorable(store.latest_verified, kept)
    assert manifest.checkpoint_id == 4
    assert [c for c, _ in skipped] == [6, 5]
    (problem,) = dict(skipped)[5]
    assert problem.startswith("offsets gone: task t-0 needs in:0 from offset 100 (its channel state starts there)")
    assert "Kafka's earliest offset is 120" in problem
    assert asked == [[A]]  # one query for the restore, remembered for the next candidate


def test_no_checkpoint_at_all_is_a_start_from_the_beginning():
    kept, asked = _kept({})
    assert pick_restorable(_Store([]).latest_verified, kept) == (None, [])
    assert asked == []


def test_when_every_checkpoint_needs_what_is_gone_the_restore_stops_and_says_what_to_do():
    store = _Store(
        [
            _manifest(1, _snapshot(1, positions={"in:0": 10, "in:1": 5})),
            _manifest(2, _snapshot(2, positions={"in:0": 40, "in:1": 9}, in_flight={"in:0": (20, 39)})),
        ]
    )
    kept, _ = _kept({A: 30})
    with pytest.raises(OffsetsGoneError) as raised:
        pick_restorable(store.latest_verified, kept)
    text = str(raised.value)
    assert "no checkpoint can be restored: checkpoints 2, 1 need Kafka records" in text
    assert "in:0 from offset 20" in text and "earliest offset is 30" in text
    assert "another --job name" in text and "retention.ms" in text and "do not verify" not in text
    assert isinstance(raised.value, JobFailed)  # the runner stops: no silent start from the beginning
    store.manifests[3] = _manifest(3, _snapshot(3, positions={"in:0": 50, "in:1": 9}))
    store.damaged.add(3)
    with pytest.raises(OffsetsGoneError, match=r"checkpoints 2, 1 need .*, and checkpoints 3 do not verify; "):
        pick_restorable(store.latest_verified, kept)


def test_a_checkpoint_asked_for_by_name_whose_offsets_are_gone_is_refused_by_name():
    kept, _ = _kept({B: 7})
    manifest = _manifest(3, _snapshot(3, positions={"in:0": 10, "in:1": 6}))
    with pytest.raises(OffsetsGoneError, match=r"checkpoint 3 cannot be restored: offsets gone: .* in:1 from offset 6"):
        kept.check(manifest)
    _kept({B: 6})[0].check(manifest)  # the earliest offset itself is still there


def test_retention_risk_is_asked_once_per_topic_with_its_own_cutoff():
    asked = []

    def first_newer(channels, timestamp_ms):
        asked.append((sorted(map(str, channels)), timestamp_ms))
        return {A: 100, B: None, L: 5}

    watch = RetentionWatch({"in": 600_000, "job.legs": None}, first_newer, horizon_ms=20_000, clock=lambda: 1_000_000.0)
    risky = watch.at_risk({A: 99, B: 7, L: 0})
    # the first record newer than now + horizon - retention.ms: anything before it may be gone by then
    assert asked == [(["in:0", "in:1"], 1_000_000_000 + 20_000 - 600_000)]  # job.legs is kept forever
    assert sorted(risky) == [A, B]  # B: every record it has is older
    assert watch.at_risk({A: 100, B: 7}).keys() == {B}
    assert relied_on_ms(2.0, 60.0) == 124_000


def _pipeline():
    return Pipeline(
        "job",
        (Ingress("in", 2, {"account": pa.string(), "amount": pa.int64()}),),
        (
            Stage(
                "count",
                ("in",),
                lambda: KeyedAggregate("account", {"n": count(), "total": sum_("amount")}),
                key="account",
                sink=Sink(),
            ),
        ),
    )


def _unaligned_checkpoint(risky, caplog, copy_everything=False):
    """An unaligned checkpoint announced at offsets 50 (in:0) and 30 (in:1)
    after the task read records 0 to 2 of in:0: channel state [3, 50) and
    [0, 30); ``risky`` is what the retention watch says."""
    task, io = make_task(_pipeline(), sink=True, copy_in_flight=copy_everything)
    reads, asked = [], []

    def read_range(channel, start, end):
        reads.append((str(channel), start, end))
        return batch(*[(channel.topic, channel.partition, o, {"account": "x", "amount": 1}) for o in range(start, end)])

    def retention_risk(wanted):
        asked.append(dict(wanted))
        return {c: AtRisk(c, wanted[c], wanted[c] + 1, 600_000, 124_000.0) for c in risky}

    task.io.read_range, task.io.retention_risk = read_range, retention_risk
    task.process_batch(batch(*[("in", 0, i, {"account": "x", "amount": 1}) for i in range(3)]))
    barrier = Barrier(1, job="job", options=CheckpointOptions.unaligned())
    with caplog.at_level(logging.WARNING, logger="streaming"):
        task.on_control(
            Trigger(
                checkpoint_id=1,
                generation=0,
                barrier=announced_barrier(barrier),
                offsets={"in:0": 50, "in:1": 30},
            )
        )
        task.process_batch(batch(("in", 0, 3, {"account": "y", "amount": 2})))
        task.wait_for_uploads()
    return io, reads, asked


def test_a_range_retention_may_delete_is_copied_into_the_checkpoint_with_a_warning(caplog):
    io, reads, asked = _unaligned_checkpoint([A], caplog)
    _, positions, in_flight, metadata = io.snapshots[1]
    assert in_flight == {"in:0": (3, 50), "in:1": (0, 30)}
    assert asked == [{A: 3, B: 0}]  # where a restore would read each channel from: the ranges' starts
    assert reads == [("in:0", 3, 50)] and sorted(io.copied) == ["in:0"]  # only the range at risk
    assert metadata["retention_at_risk"] == {"in:0": 3}
    assert "count-0: checkpoint 1: in:0: retention (retention.ms 600000) may delete offset 3" in caplog.text
    assert "copying its channel state [3, 50) into the checkpoint" in caplog.text


def test_nothing_at_risk_keeps_ranges_and_says_nothing(caplog):
    io, reads, _ = _unaligned_checkpoint([], caplog)
    assert reads == [] and not io.copied and io.snapshots[1][3]["retention_at_risk"] == {}
    assert "retention" not in caplog.text


def test_a_position_at_risk_is_warned_about(caplog):
    """A checkpoint that copies its channel state anyway resumes at its
    positions: one retention may delete is where the task is behind."""
    io, reads, asked = _unaligned_checkpoint([B], caplog, copy_everything=True)
    assert asked == [{A: 51, B: 31}] and sorted(io.copied) == ["in:0", "in:1"]
    assert (
        "count-0: checkpoint 1: in:1: retention (retention.ms 600000) may delete offset 31, where a restore"
        in caplog.text
    )
    assert io.snapshots[1][3]["retention_at_risk"] == {"in:1": 31}
