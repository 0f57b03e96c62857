"""The per-task barrier handler, mode by mode, driven event by event with a
controller that records every effect in order."""

from __future__ import annotations

import pytest

from barriers.failures import CheckpointFailure
from barriers.handler import BarrierHandler, CheckpointKind, IgnoreReason, ProtocolError, Switch
from barriers.messages import Barrier, CancelBarrier, ChannelId, CheckpointOptions

A, B, C = ChannelId("in", 0), ChannelId("in", 1), ChannelId("in", 2)
ALIGNED = CheckpointOptions.aligned()
UNALIGNED = CheckpointOptions.unaligned()


class Recorder:
    """A controller that writes down what the handler asks for."""

    def __init__(self):
        self.effects: list[tuple] = []
        self.acks = {}

    def block(self, channel):
        self.effects.append(("block", channel))

    def release(self, channel):
        self.effects.append(("release", channel))

    def snapshot(self, barrier):
        self.effects.append(("snapshot", barrier.checkpoint_id))

    def forward_barrier(self, barrier):
        self.effects.append(("forward", barrier.checkpoint_id))

    def record_in_flight(self, checkpoint_id, channel, start, end):
        self.effects.append(("in_flight", checkpoint_id, channel, start, end))

    def acknowledge(self, checkpoint):
        self.effects.append(("ack", checkpoint.checkpoint_id))
        self.acks[checkpoint.checkpoint_id] = checkpoint

    def abort(self, checkpoint_id, reason, detail):
        self.effects.append(("abort", checkpoint_id, reason))

    def names(self):
        return [effect[0] for effect in self.effects]


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def handler(inputs=(A, B), **kwargs):
    recorder = Recorder()
    return BarrierHandler(recorder, inputs, **kwargs), recorder


def feed(h, channel, *offsets):
    for offset in offsets:
        h.record_processed(channel, offset)


def test_aligned_blocks_until_every_channel_delivered_then_snapshots_forwards_and_releases():
    h, rec = handler()
    feed(h, A, 0, 1)
    assert h.barrier_received(A, Barrier(1, options=ALIGNED), 2) is None
    assert h.blocked == {A} and h.pending == (1,)
    with pytest.raises(ProtocolError, match="blocked"):
        h.record_processed(A, 3)
    feed(h, B, 0, 1, 2)
    assert rec.names() == ["block"]
    h.barrier_received(B, Barrier(1, options=ALIGNED), 3)
    assert rec.effects == [("block", A), ("snapshot", 1), ("forward", 1), ("ack", 1), ("release", A)]
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.ALIGNED
    assert ack.positions == {A: 3, B: 4}
    assert ack.in_flight == {}
    assert h.pending == () and h.blocked == frozenset()


def test_aligned_with_one_input_snapshots_at_once():
    h, rec = handler(inputs=(A,))
    h.barrier_received(A, Barrier(1), 0)
    assert rec.names() == ["snapshot", "forward", "ack"]


def test_unaligned_snapshots_at_the_first_barrier_and_records_what_was_in_flight():
    h, rec = handler(positions={A: 10, B: 20})
    h.barrier_received(A, Barrier(1, options=UNALIGNED), 10)
    assert rec.names() == ["snapshot", "forward"] and h.blocked == frozenset()
    feed(h, A, 11, 12)  # after A's barrier: belongs to checkpoint 2, not channel state
    feed(h, B, 20, 21, 22)  # before B's barrier: in flight
    h.barrier_received(B, Barrier(1, options=UNALIGNED), 23)
    assert rec.effects[2:] == [("in_flight", 1, B, 20, 23), ("ack", 1)]
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.UNALIGNED
    assert ack.positions == {A: 11, B: 24}
    assert ack.in_flight == {B: (20, 23)}


def test_an_announcement_starts_the_unaligned_snapshot_before_the_backlog_is_read():
    h, rec = handler(positions={A: 0, B: 0})
    h.announcement_received(A, Barrier(1, options=UNALIGNED), 500)
    h.announcement_received(B, Barrier(1, options=UNALIGNED), 700)
    assert rec.names() == ["snapshot", "forward", "in_flight", "in_flight", "ack"]
    assert rec.acks[1].in_flight == {A: (0, 500), B: (0, 700)}
    assert rec.acks[1].positions == {A: 501, B: 701}
    # reading the backlog and then the barriers themselves changes nothing more
    feed(h, A, *range(500))
    assert h.barrier_received(A, Barrier(1, options=UNALIGNED), 500) is None
    assert len(rec.effects) == 5 and not h.ignored


def test_aligned_checkpoints_do_not_use_announcements():
    h, rec = handler()
    ignored = h.announcement_received(A, Barrier(1, options=ALIGNED), 5)
    assert ignored.reason is IgnoreReason.ANNOUNCEMENT_UNUSED and rec.effects == []


def test_alignment_timeout_switches_the_running_checkpoint_to_unaligned():
    clock = Clock()
    h, rec = handler(clock=clock)
    options = CheckpointOptions.aligned_with_timeout(timeout_ms=100)
    h.barrier_received(A, Barrier(1, options=options), 0)
    feed(h, B, 0)
    clock.now = 0.05
    h.tick()
    assert rec.names() == ["block"]
    clock.now = 0.1
    h.tick()
    assert rec.effects[1:] == [("snapshot", 1), ("forward", 1), ("release", A)]
    feed(h, B, 1, 2)
    h.barrier_received(B, Barrier(1, options=options), 3)
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.TIMED_OUT_TO_UNALIGNED
    assert ack.in_flight == {B: (1, 3)}
    assert ack.positions == {A: 1, B: 4}


# ---- the alignment timeout counts from the trigger (the barrier's timestamp_ms, the coordinator's wall clock)

TRIGGERED_MS = 1_000_000  # when the coordinator triggered checkpoint 1, by its wall clock
TIMEOUT_200 = CheckpointOptions.aligned_with_timeout(timeout_ms=200)


def timed_handler(inputs=(A, B), **kwargs):
    """A handler whose wall clock and monotonic clock are the same fake clock,
    set to the trigger time (seconds)."""
    clock = Clock()
    clock.now = TRIGGERED_MS / 1000
    h, rec = handler(inputs, clock=clock, wall_clock=clock, **kwargs)
    return h, rec, clock


def barrier_1(options=TIMEOUT_200):
    return Barrier(1, options=options, timestamp_ms=TRIGGERED_MS)


def test_a_barrier_that_comes_after_the_timeout_since_the_trigger_turns_unaligned_at_once():
    h, rec, clock = timed_handler()
    clock.now += 0.35  # the backlog in front of the barrier took 350 ms to read
    h.barrier_received(A, barrier_1(), 0)
    assert rec.names() == ["block", "snapshot", "forward", "release"] and h.blocked == frozenset()
    feed(h, B, 0, 1)
    h.barrier_received(B, barrier_1(), 2)
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.TIMED_OUT_TO_UNALIGNED and ack.in_flight == {B: (0, 2)}
    assert ack.switch is Switch.LATE_BARRIER and ack.switched_after_ms == pytest.approx(350)


def test_a_task_already_aligning_switches_when_the_timeout_since_the_trigger_passes():
    h, rec, clock = timed_handler()
    clock.now += 0.15
    h.barrier_received(A, barrier_1(), 0)
    assert h.blocked == {A}
    clock.now += 0.049  # 199 ms since the trigger, 49 ms since the first barrier
    h.tick()
    assert h.blocked == {A}
    clock.now += 0.001  # 200 ms since the trigger: the first-barrier count would wait 150 ms more
    h.tick()
    assert h.blocked == frozenset() and rec.names() == ["block", "snapshot", "forward", "release"]
    feed(h, B, 0)
    h.barrier_received(B, barrier_1(), 1)
    ack = rec.acks[1]
    assert ack.switch is Switch.TIMEOUT_WHILE_ALIGNING and ack.switched_after_ms == pytest.approx(200)
    assert ack.in_flight == {B: (0, 1)} and ack.positions == {A: 1, B: 2}


def test_announced_barriers_close_their_channels_when_the_timeout_passes_before_they_are_read():
    h, rec, clock = timed_handler()
    h.announcement_received(A, barrier_1(), 500)
    h.announcement_received(B, barrier_1(), 700)
    assert rec.effects == [] and h.pending == (1,) and h.blocked == frozenset()
    feed(h, A, *range(100))  # the backlog is read, nothing is blocked
    clock.now += 0.2
    h.tick()
    ack = rec.acks[1]
    assert rec.names() == ["snapshot", "forward", "in_flight", "in_flight", "ack"]
    assert ack.kind is CheckpointKind.TIMED_OUT_TO_UNALIGNED and ack.switch is Switch.TIMEOUT_WHILE_ANNOUNCED
    assert ack.in_flight == {A: (100, 500), B: (0, 700)} and ack.positions == {A: 501, B: 701}
    # the rest of the backlog and the barriers themselves change nothing more
    feed(h, A, *range(100, 500))
    assert h.barrier_received(A, barrier_1(), 500) is None
    assert len(rec.effects) == 5 and not h.ignored


def test_an_announcement_after_the_timeout_starts_the_checkpoint_unaligned_at_once():
    h, rec, clock = timed_handler()
    clock.now += 0.25
    h.announcement_received(A, barrier_1(), 40)
    assert rec.names() == ["snapshot", "forward"]
    h.announcement_received(B, barrier_1(), 60)
    ack = rec.acks[1]
    assert ack.switch is Switch.LATE_ANNOUNCEMENT and ack.in_flight == {A: (0, 40), B: (0, 60)}


def test_a_barrier_read_before_the_timeout_aligns_as_usual_and_announcements_wait():
    h, rec, clock = timed_handler()
    h.announcement_received(A, barrier_1(), 2)
    h.announcement_received(B, barrier_1(), 1)
    feed(h, A, 0, 1)
    clock.now += 0.05
    h.barrier_received(A, barrier_1(), 2)
    assert h.blocked == {A}
    feed(h, B, 0)
    h.barrier_received(B, barrier_1(), 1)
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.ALIGNED and ack.switch is None and ack.in_flight == {}
    assert ack.positions == {A: 3, B: 2}


def test_a_switch_while_aligning_closes_the_announced_channels_at_their_barriers():
    h, rec, clock = timed_handler()
    h.announcement_received(B, barrier_1(), 9)
    clock.now += 0.01
    h.barrier_received(A, barrier_1(), 0)
    feed(h, B, 0, 1, 2)
    clock.now += 0.19
    h.tick()
    ack = rec.acks[1]  # B's barrier position is known: nothing more to wait for
    assert ack.switch is Switch.TIMEOUT_WHILE_ALIGNING and ack.in_flight == {B: (3, 9)}


def test_a_clock_behind_the_coordinators_still_switches_the_timeout_after_the_first_barrier():
    h, rec, clock = timed_handler()
    clock.now -= 5.0  # this host's wall clock is five seconds behind: "since the trigger" stays 0
    h.barrier_received(A, barrier_1(), 0)
    clock.now += 0.199
    h.tick()
    assert h.blocked == {A}
    clock.now += 0.001
    h.tick()
    assert h.blocked == frozenset()
    h.barrier_received(B, barrier_1(), 0)
    ack = rec.acks[1]
    assert ack.switch is Switch.TIMEOUT_WHILE_ALIGNING and ack.switched_after_ms == 0


def test_a_barrier_without_a_trigger_time_counts_the_timeout_from_the_first_barrier():
    h, rec, clock = timed_handler()
    h.barrier_received(A, Barrier(1, options=TIMEOUT_200), 0)
    clock.now += 0.2
    h.tick()
    h.barrier_received(B, Barrier(1, options=TIMEOUT_200), 0)
    assert rec.acks[1].switch is Switch.TIMEOUT_WHILE_ALIGNING and rec.acks[1].switched_after_ms is None


def test_an_announced_checkpoint_given_up_upstream_is_declined():
    h, rec, clock = timed_handler()
    h.announcement_received(A, barrier_1(), 5)
    h.barrier_received(B, Barrier(2, options=TIMEOUT_200, timestamp_ms=TRIGGERED_MS + 100), 0)
    assert ("abort", 1, CheckpointFailure.SUBSUMED) in rec.effects and h.pending == (2,) and h.blocked == {B}


def test_announcements_of_an_aligned_checkpoint_with_only_a_budget_are_unused():
    h, rec, clock = timed_handler()
    options = CheckpointOptions.aligned_with_timeout(held_bytes_budget=10)
    ignored = h.announcement_received(A, Barrier(1, options=options, timestamp_ms=TRIGGERED_MS), 5)
    assert ignored.reason is IgnoreReason.ANNOUNCEMENT_UNUSED


def test_held_bytes_budget_switches_to_unaligned():
    h, rec = handler()
    options = CheckpointOptions.aligned_with_timeout(held_bytes_budget=1000)
    h.barrier_received(A, Barrier(1, options=options), 0)
    h.tick(held_bytes=1000)
    assert h.blocked == {A}
    h.tick(held_bytes=1001)
    assert h.blocked == frozenset()
    h.barrier_received(B, Barrier(1, options=options), 0)
    assert rec.acks[1].kind is CheckpointKind.OVER_BUDGET_TO_UNALIGNED and rec.acks[1].switch is Switch.OVER_BUDGET


def test_at_least_once_never_blocks_and_resumes_after_the_barriers():
    h, rec = handler()
    h.barrier_received(A, Barrier(1, options=CheckpointOptions.at_least_once()), 0)
    feed(h, A, 1, 2)  # processed before the snapshot: replayed again after a restore
    assert "block" not in rec.names()
    h.barrier_received(B, Barrier(1, options=CheckpointOptions.at_least_once()), 0)
    ack = rec.acks[1]
    assert ack.kind is CheckpointKind.AT_LEAST_ONCE
    assert ack.positions == {A: 1, B: 1} and ack.in_flight == {}


def test_end_of_input_on_the_last_owing_channel_completes_the_checkpoint():
    h, rec = handler(positions={B: 7})
    h.barrier_received(A, Barrier(1), 0)
    feed(h, B, 7, 8)
    h.end_of_input(B)
    assert rec.names()[-2:] == ["ack", "release"]
    assert rec.acks[1].positions == {A: 1, B: 9}
    assert h.barrier_received(B, Barrier(2), 9).reason is IgnoreReason.CHANNEL_ENDED


def test_end_of_input_closes_unaligned_channel_state_at_the_channel_end():
    h, rec = handler()
    h.barrier_received(A, Barrier(1, options=UNALIGNED), 0)
    feed(h, B, 0, 1)
    h.end_of_input(B)
    assert rec.acks[1].in_flight == {B: (0, 2)}


def test_a_newer_barrier_on_a_channel_that_owed_the_older_one_subsumes_it():
    h, rec = handler(inputs=(A, B, C))
    h.barrier_received(A, Barrier(1), 0)
    h.barrier_received(B, Barrier(2), 0)
    assert ("abort", 1, CheckpointFailure.SUBSUMED) in rec.effects
    assert ("release", A) in rec.effects
    assert h.pending == (2,) and h.blocked == {B}
    h.barrier_received(A, Barrier(2), 1)
    h.barrier_received(C, Barrier(2), 0)
    assert list(rec.acks) == [2]
    late = h.barrier_received(C, Barrier(1), 1)
    assert late.reason is IgnoreReason.OUT_OF_ORDER


def test_barrier_older_than_the_started_one_is_late():
    h, rec = handler(inputs=(A, B, C))
    h.barrier_received(A, Barrier(1), 0)
    h.barrier_received(B, Barrier(2), 0)  # subsumes 1
    assert h.barrier_received(C, Barrier(1), 0).reason is IgnoreReason.LATE
    assert h.ignored[IgnoreReason.LATE] == 1


def test_concurrent_unaligned_checkpoints_up_to_the_limit_then_the_oldest_is_subsumed():
    h, rec = handler(max_concurrent=2)
    h.barrier_received(A, Barrier(1, options=UNALIGNED), 0)
    feed(h, A, 1)
    h.barrier_received(A, Barrier(2, options=UNALIGNED), 2)
    assert h.pending == (1, 2)
    feed(h, B, 0, 1)
    h.barrier_received(A, Barrier(3, options=UNALIGNED), 3)
    assert ("abort", 1, CheckpointFailure.SUBSUMED) in rec.effects and h.pending == (2, 3)
    h.barrier_received(B, Barrier(2, options=UNALIGNED), 2)
    h.barrier_received(B, Barrier(3, options=UNALIGNED), 3)
    assert rec.acks[2].in_flight == {B: (0, 2)}
    assert rec.acks[3].in_flight == {B: (2, 3)}
    assert h.pending == ()


def test_a_cancellation_aborts_the_pending_checkpoint_and_its_later_barriers_are_ignored():
    h, rec = handler(inputs=(A, B, C))
    h.barrier_received(A, Barrier(4), 0)
    h.cancel_received(B, CancelBarrier(4, reason="upstream declined"), 0)
    assert rec.effects[-2:] == [("abort", 4, CheckpointFailure.CANCELLED), ("release", A)]
    assert h.barrier_received(C, Barrier(4), 0).reason is IgnoreReason.CANCELLED
    assert h.pending == ()


@pytest.mark.parametrize(
    "channel, barrier, reason",
    [
        (ChannelId("elsewhere", 0), Barrier(1, 2), IgnoreReason.UNKNOWN_CHANNEL),
        (A, Barrier(1, 1), IgnoreReason.STALE_GENERATION),
        (A, Barrier(1, 3), IgnoreReason.FUTURE_GENERATION),
    ],
)
def test_barriers_that_cannot_belong_here_are_ignored_with_a_reason(channel, barrier, reason):
    h, rec = handler(generation=2)
    ignored = h.barrier_received(channel, barrier, 0)
    assert ignored.reason is reason and reason.value in str(ignored)
    assert h.ignored[reason] == 1 and rec.effects == []
    if channel in (A, B):
        assert h.position(channel) == 1  # consumed, not re-read


def test_a_duplicate_barrier_on_the_same_channel_is_ignored():
    h, rec = handler(inputs=(A,))
    h.barrier_received(A, Barrier(1, options=UNALIGNED), 0)
    assert h.barrier_received(A, Barrier(1, options=UNALIGNED), 1).reason is IgnoreReason.DUPLICATE
    assert list(rec.acks) == [1]


def test_records_must_arrive_in_channel_order():
    h, _ = handler()
    feed(h, A, 5)
    with pytest.raises(ProtocolError, match="behind"):
        h.record_processed(A, 5)
    with pytest.raises(ProtocolError, match="not an input"):
        h.record_processed(ChannelId("x", 0), 0)


def test_a_source_without_inputs_completes_on_trigger():
    h, rec = handler(inputs=())
    h.trigger(Barrier(1))
    assert rec.names() == ["snapshot", "forward", "ack"]
    with pytest.raises(ProtocolError, match="not newer"):
        h.trigger(Barrier(1))


def test_an_initiator_with_inputs_records_its_channels_like_chandy_lamport():
    h, rec = handler(positions={A: 3, B: 0})
    with pytest.raises(ProtocolError, match="only initiate unaligned"):
        h.trigger(Barrier(1, options=ALIGNED))
    h.trigger(Barrier(1, options=UNALIGNED))
    assert rec.names() == ["snapshot", "forward"]
    feed(h, A, 3)
    h.barrier_received(A, Barrier(1, options=UNALIGNED), 4)
    h.barrier_received(B, Barrier(1, options=UNALIGNED), 0)
    assert rec.acks[1].in_flight == {A: (3, 4)}


def test_the_coordinator_can_abort_a_pending_checkpoint():
    h, rec = handler()
    h.barrier_received(A, Barrier(1), 0)
    h.abort(1, CheckpointFailure.TIMEOUT, "too slow")
    assert rec.effects[-2:] == [("abort", 1, CheckpointFailure.TIMEOUT), ("release", A)]
    assert h.barrier_received(B, Barrier(1), 0).reason is IgnoreReason.CANCELLED


def test_after_a_restore_the_restored_barrier_is_late_and_the_next_one_counts():
    h, rec = handler(positions={A: 3, B: 7}, newest_started=5)
    assert h.barrier_received(A, Barrier(5, options=UNALIGNED), 4).reason is IgnoreReason.LATE
    h.barrier_received(A, Barrier(6, options=UNALIGNED), 5)
    h.barrier_received(B, Barrier(6, options=UNALIGNED), 7)
    assert rec.acks[6].positions == {A: 6, B: 8}


def test_a_zero_alignment_timeout_turns_unaligned_at_the_first_barrier():
    h, rec = handler()
    options = CheckpointOptions.aligned_with_timeout(timeout_ms=0)
    h.barrier_received(A, Barrier(1, options=options), 0)
    assert rec.names() == ["block", "snapshot", "forward", "release"] and h.blocked == frozenset()
    feed(h, B, 0)
    h.barrier_received(B, Barrier(1, options=options), 1)
    assert rec.acks[1].kind is CheckpointKind.TIMED_OUT_TO_UNALIGNED and rec.acks[1].in_flight == {B: (0, 1)}
