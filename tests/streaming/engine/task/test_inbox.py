"""A task's control inbox (``streaming.engine.task.inbox``): events applied at
once when the task's lock is free and queued while another thread holds it,
then applied in order; the coordinator's abort of a pending checkpoint handed
to the barrier handler (not one the task itself caused, nor one not pending);
the barrier positions of a trigger or an announcement handed over for the
task's own input channels, for unaligned barriers and aligned ones with an
alignment timeout only; the barrier's fields taken unsigned (the event's own
signature vouches for them), and fields that are no barrier of this job
ignored with a warning.

Barrier headers and events are the project's own; the handler is a fake that
records what it is told."""

from __future__ import annotations

import contextlib
import logging
import threading

import pytest

from barriers.failures import CheckpointFailure
from barriers.messages import UNSIGNED, Barrier, CancelBarrier, ChannelId, CheckpointOptions, encode
from streaming.adapters.kafka.control.events import Abort, Announce, Complete, Trigger, announced_barrier
from streaming.engine.task.inbox import ControlInbox

JOB = "job"
TASK = "count-1"
A, B = ChannelId("in", 1), ChannelId("in", 3)  # the task's inputs
OTHER = ChannelId("in", 0)  # another task's input
UNALIGNED = CheckpointOptions.unaligned()


class Handler:
    """The barrier handler as the inbox uses it: its pending checkpoints, and
    what it was told, in order."""

    def __init__(self, pending=()):
        self.pending = set(pending)
        self.calls: list[tuple] = []

    def abort(self, checkpoint_id, reason, detail):
        self.calls.append(("abort", checkpoint_id, reason, detail))
        self.pending.discard(checkpoint_id)

    def announcement_received(self, channel, barrier, offset):
        self.calls.append(("announced", channel, barrier, offset))


def _inbox(handler=None, *, lock=None) -> ControlInbox:
    handler = Handler() if handler is None else handler
    return ControlInbox(TASK, JOB, {A: "in", B: "in"}, handler, lock or threading.RLock())


def _trigger(barrier: Barrier, offsets: dict[str, int]) -> Trigger:
    return Trigger(barrier.checkpoint_id, barrier.generation, offsets=offsets, barrier=announced_barrier(barrier))


def _announce(barrier: Barrier, offsets: dict[str, int], *, sender="parse-0") -> Announce:
    return Announce(
        barrier.checkpoint_id, sender, barrier.generation, barrier=announced_barrier(barrier), offsets=offsets
    )


def _abort(checkpoint_id: int, *, task="", detail="too slow") -> Abort:
    return Abort(checkpoint_id, 0, reason=CheckpointFailure.TIMEOUT, detail=detail, task=task)


@contextlib.contextmanager
def _held_by_another_thread(lock: threading.RLock):
    """``lock`` held by a thread of its own (an ``RLock`` lets its owner in
    again) until the block ends."""
    taken, release = threading.Event(), threading.Event()

    def hold():
        with lock:
            taken.set()
            release.wait(10)

    thread = threading.Thread(target=hold)
    thread.start()
    assert taken.wait(10)
    try:
        yield
    finally:
        release.set()
        thread.join(10)


# ---- when events are applied


def test_an_event_is_applied_at_once_when_the_task_is_idle():
    handler = Handler(pending={4})
    inbox = _inbox(handler)
    inbox.offer(_abort(4))
    assert handler.calls == [("abort", 4, CheckpointFailure.TIMEOUT, "too slow")]


def test_events_wait_while_the_task_holds_its_lock_and_apply_takes_them_in_order():
    lock = threading.RLock()
    handler = Handler(pending={4, 5})
    inbox = _inbox(handler, lock=lock)
    barrier = Barrier(6, job=JOB, options=UNALIGNED)
    with _held_by_another_thread(lock):
        inbox.offer(_abort(5, detail="first"))
        inbox.offer(_trigger(barrier, {"in:1": 70}))
        inbox.offer(_abort(4, detail="last"))
        assert handler.calls == []  # nothing while the processing thread works
    with lock:
        inbox.apply()
    assert handler.calls == [
        ("abort", 5, CheckpointFailure.TIMEOUT, "first"),
        ("announced", A, barrier, 70),
        ("abort", 4, CheckpointFailure.TIMEOUT, "last"),
    ]
    inbox.apply()  # the queue is empty once taken
    assert len(handler.calls) == 3


def test_an_event_offered_when_the_lock_is_free_takes_the_queued_ones_first():
    lock = threading.RLock()
    handler = Handler(pending={1, 2})
    inbox = _inbox(handler, lock=lock)
    with _held_by_another_thread(lock):
        inbox.offer(_abort(1))
    inbox.offer(_abort(2))
    assert [call[1] for call in handler.calls] == [1, 2]


# ---- aborts


def test_an_abort_of_a_pending_checkpoint_aborts_it_with_the_coordinators_reason():
    handler = Handler(pending={7})
    _inbox(handler).offer(Abort(7, 0, reason=CheckpointFailure.DECLINED, detail="sums-0 declined", task="sums-0"))
    assert handler.calls == [("abort", 7, CheckpointFailure.DECLINED, "sums-0 declined")]
    assert handler.pending == set()


def test_an_abort_this_task_caused_is_not_applied_again():
    handler = Handler(pending={7})
    _inbox(handler).offer(_abort(7, task=TASK))
    assert handler.calls == [] and handler.pending == {7}


def test_an_abort_of_a_checkpoint_not_pending_here_is_ignored():
    handler = Handler(pending={7})
    inbox = _inbox(handler)
    inbox.offer(_abort(6))
    inbox.offer(_abort(8))
    assert handler.calls == [] and handler.pending == {7}


def test_events_a_task_does_not_act_on_are_dropped():
    handler = Handler(pending={3})
    inbox = _inbox(handler)
    inbox.offer(Complete(3, 0))
    inbox.offer(Trigger(3, 0, offsets={"in:1": 5}))  # no barrier headers: nothing to start
    assert handler.calls == []
    inbox.offer(_abort(3))
    assert [call[0] for call in handler.calls] == ["abort"]  # nothing of the dropped ones was left queued


# ---- announcements


def test_a_trigger_announces_an_unaligned_barrier_on_the_tasks_inputs_only():
    handler = Handler()
    barrier = Barrier(2, generation=0, options=UNALIGNED, timestamp_ms=1_000, job=JOB)
    _inbox(handler).offer(_trigger(barrier, {"in:0": 9, "in:1": 12, "in:3": 40, "other:1": 3}))
    assert handler.calls == [("announced", A, barrier, 12), ("announced", B, barrier, 40)]


def test_an_announcement_naming_no_channel_or_no_offset_skips_that_entry_only(caplog):
    handler = Handler()
    barrier = Barrier(2, generation=0, options=UNALIGNED, job=JOB)
    _inbox(handler).offer(_trigger(barrier, {"no channel": 3, "in:1": "twelve", "in:3": 40}))
    assert handler.calls == [("announced", B, barrier, 40)]  # before: the ValueError stopped the task
    assert "names no channel 'no channel'" in caplog.text


def test_an_announce_from_an_upstream_task_gives_the_offsets_on_its_outputs():
    handler = Handler()
    barrier = Barrier(5, generation=2, options=UNALIGNED, job=JOB)
    _inbox(handler).offer(_announce(barrier, {"in:3": 17, "in:2": 4}))
    [(what, channel, announced, offset)] = handler.calls
    assert (what, channel, offset) == ("announced", B, 17)
    assert announced == barrier and announced.generation == 2 and announced.options == UNALIGNED


def test_an_aligned_barrier_with_an_alignment_timeout_is_announced():
    handler = Handler()
    options = CheckpointOptions.aligned_with_timeout(timeout_ms=250)
    barrier = Barrier(3, options=options, job=JOB)
    _inbox(handler).offer(_trigger(barrier, {"in:1": 8}))
    [(_, channel, announced, offset)] = handler.calls
    assert (channel, offset) == (A, 8)
    assert announced.options.alignment_timeout_ms == 250


@pytest.mark.parametrize(
    "options",
    [
        CheckpointOptions.aligned(),
        CheckpointOptions.aligned_with_timeout(held_bytes_budget=1_000),
        CheckpointOptions.at_least_once(),
    ],
    ids=["aligned", "aligned-with-a-held-bytes-budget-only", "at-least-once"],
)
def test_a_barrier_without_an_alignment_timeout_waits_for_the_barriers_themselves(options):
    handler = Handler()
    inbox = _inbox(handler)
    barrier = Barrier(3, options=options, job=JOB)
    inbox.offer(_trigger(barrier, {"in:1": 8, "in:3": 9}))
    inbox.offer(_announce(barrier, {"in:1": 8}))
    assert handler.calls == []


def test_a_cancellation_in_the_announced_headers_is_not_an_announcement():
    handler = Handler()
    headers = {name: value.decode() for name, value in encode(CancelBarrier(3, reason="gone", job=JOB), key=UNSIGNED)}
    _inbox(handler).offer(Announce(3, "parse-0", 0, barrier=headers, offsets={"in:1": 8}))
    assert handler.calls == []


def test_the_announced_barrier_carries_no_signature_and_is_taken_as_the_event_vouches():
    """A barrier's signature in an event would be one any reader of the
    control topic could copy onto a channel; the event's own is enough."""
    handler = Handler()
    barrier = Barrier(4, options=UNALIGNED, job=JOB)
    announce = _announce(barrier, {"in:1": 11})
    assert "abs.sig" not in announce.barrier and "abs.channel" not in announce.barrier
    _inbox(handler).offer(announce)
    assert handler.calls == [("announced", A, barrier, 11)]


@pytest.mark.parametrize(
    ("job", "change", "why"),
    [
        ("another-job", {}, "belongs to job 'another-job'"),
        (JOB, {"abs.checkpoint": "x"}, "not a non-negative integer"),
        (JOB, {"abs.alignment": "sideways"}, "bad options"),
    ],
    ids=["another-job", "no-checkpoint", "no-alignment"],
)
def test_announced_fields_that_are_no_barrier_of_this_job_are_ignored_with_a_warning(caplog, job, change, why):
    handler = Handler(pending={1})
    inbox = _inbox(handler)
    trigger = _trigger(Barrier(4, options=UNALIGNED, job=job), {"in:1": 11})
    trigger = Trigger(4, 0, offsets=trigger.offsets, barrier={**trigger.barrier, **change})
    with caplog.at_level(logging.WARNING, logger="streaming.engine.task.inbox"):
        inbox.offer(trigger)
        inbox.offer(_abort(1))  # the events after it are still taken
    assert [call[0] for call in handler.calls] == ["abort"]
    [warning] = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert TASK in warning.getMessage() and "checkpoint 4" in warning.getMessage()
    assert why in warning.getMessage()
