"""The per-task barrier handler: the ABS state machine of one task with any
number of input channels, for every mode.

Events come in (a record processed, a barrier or a cancellation read from a
channel, a barrier's position announced, end of input, a tick of the clock);
each state answers with the next state; effects go out through the narrow
``Controller`` protocol (``block``, ``release``, ``snapshot``,
``forward_barrier``, ``record_in_flight``, ``acknowledge``, ``abort``).

- ``Idle``: waiting for the first barrier of the next checkpoint.
- ``Aligning``: aligned mode (seed 002): a channel that delivered barrier n
  is blocked until barrier n came on every open input; then snapshot, forward
  and release.  With a timeout or held-bytes budget in the options, passing
  either turns the running checkpoint unaligned.
- ``Announced``: an aligned checkpoint with a timeout whose barrier was
  announced (its position on a channel is known) but not read yet; nothing is
  blocked.  Its first barrier makes it ``Aligning``; the timeout passing
  first turns it unaligned at the announced positions.
- ``Unaligned``: one or more checkpoints whose snapshot is taken (at the first
  barrier, at an announcement of a barrier's position, or on a trigger) and
  whose barriers are still owed by some channels; what such a channel
  delivers until its barrier is in flight and becomes that checkpoint's
  channel state (EWD 864a: "the string of white messages accepted in red
  actions"), kept as the offset range ``[position at the snapshot, barrier)``.
- ``Collecting``: at-least-once (seed 002's "alignment skipped"): barriers are
  counted, nothing is blocked, the snapshot is taken when the last one comes.

Every task checkpoint resumes each channel right after its barrier n (or at
its end, if the channel ended first); unaligned ones replay their channel
state before that.

The alignment timeout counts from the checkpoint's trigger, as Flink's does:
the barrier carries the coordinator's wall-clock time of the trigger, and a
task that first sees barrier n (or its announcement) after the timeout has
passed takes checkpoint n unaligned at once; one aligning, or waiting for an
announced barrier, switches when it passes.  Clocks of other hosts may be
skewed, so the timeout also passes, at the latest, that long after the task
first saw the checkpoint (its own monotonic clock): a task whose clock is
behind the coordinator's switches no later than it did when the timeout
counted from the first barrier; one whose clock is ahead switches up to the
skew earlier.  Either way the checkpoint is consistent; only how much is
channel state changes.  A barrier without a trigger time counts from the
task's first sight alone.

Barriers that cannot belong to the running protocol (another generation,
an unknown or ended channel, a duplicate, one older than a checkpoint the
task already started, a cancelled checkpoint) are ignored, and the handler
returns and counts an ``Ignored`` with the reason."""

from __future__ import annotations

import collections
import enum
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from barriers.errors import ProtocolError
from barriers.failures import CheckpointFailure
from barriers.messages import Alignment, Barrier, CancelBarrier, ChannelId

__all__ = [
    "Controller",
    "BarrierHandler",
    "TaskCheckpoint",
    "CheckpointKind",
    "Switch",
    "Ignored",
    "IgnoreReason",
    "ProtocolError",
]

log = logging.getLogger(__name__)


class CheckpointKind(enum.Enum):
    """What a task checkpoint turned out to be (the manifest says it, by
    name; the value is what a person reads)."""

    ALIGNED = "aligned"
    UNALIGNED = "unaligned"
    TIMED_OUT_TO_UNALIGNED = "aligned, unaligned after the alignment timeout"
    OVER_BUDGET_TO_UNALIGNED = "aligned, unaligned after the held-bytes budget"
    AT_LEAST_ONCE = "at-least-once"
    # written by a rescale (the engine re-divides a checkpoint's state), never by a handler
    RESCALED = "rescaled"
    # written by a restore into a changed pipeline (stages added or removed), never by a handler
    CHANGED = "restored into a changed pipeline"


class Switch(enum.Enum):
    """Why an aligned checkpoint turned unaligned in a task (the manifest says
    it, by name; the value is what a person reads)."""

    LATE_BARRIER = "its first barrier came after the alignment timeout had passed since the trigger"
    LATE_ANNOUNCEMENT = "its first barrier was announced after the alignment timeout had passed since the trigger"
    TIMEOUT_WHILE_ALIGNING = "the alignment timeout passed while it aligned"
    TIMEOUT_WHILE_ANNOUNCED = "the alignment timeout passed while its announced barriers were still unread"
    OVER_BUDGET = "the records it held while aligning passed the held-bytes budget"
    OLDER_UNALIGNED = "an older checkpoint was still unaligned in the task"


class IgnoreReason(enum.Enum):
    UNKNOWN_CHANNEL = "not an input channel of this task"
    CHANNEL_ENDED = "the channel already ended"
    STALE_GENERATION = "of an older generation"
    FUTURE_GENERATION = "of a generation this task has not reached"
    DUPLICATE = "this channel already delivered it"
    OUT_OF_ORDER = "this channel already delivered a newer barrier"
    LATE = "not newer than a checkpoint this task already started or restored from"
    CANCELLED = "the checkpoint was cancelled"
    ANNOUNCEMENT_UNUSED = "announcements only start or close unaligned checkpoints and ones with an alignment timeout"


@dataclass(frozen=True, slots=True)
class Ignored:
    """A barrier, cancellation or announcement the handler did not act on."""

    channel: ChannelId
    checkpoint_id: int
    reason: IgnoreReason

    def __str__(self) -> str:
        return f"checkpoint {self.checkpoint_id} on {self.channel} ignored: {self.reason.value}"


@dataclass(frozen=True, slots=True)
class TaskCheckpoint:
    """What a task acknowledges for checkpoint n.

    ``positions``: per input channel, the offset to resume at (right after
    barrier n, or the channel's end).  ``in_flight``: per channel, the
    non-empty offset ranges ``[start, end)`` that are channel state.  Times are
    the handler's clock.  ``switch``: why an aligned checkpoint turned
    unaligned, with the milliseconds since its trigger when it did
    (``switched_after_ms``, None without a trigger time)."""

    barrier: Barrier
    kind: CheckpointKind
    positions: Mapping[ChannelId, int]
    in_flight: Mapping[ChannelId, tuple[int, int]]
    started_at: float
    snapshot_at: float
    completed_at: float
    switch: Switch | None = None
    switched_after_ms: float | None = None

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id

    @property
    def alignment_duration(self) -> float:
        return (
            self.completed_at - self.started_at
            if self.kind is CheckpointKind.ALIGNED
            else (self.snapshot_at - self.started_at)
        )


class Controller(Protocol):
    """The effects of the handler, implemented by the task that owns it."""

    def block(self, channel: ChannelId) -> None:
        """Stop delivering ``channel``'s records (hold them) until released."""

    def release(self, channel: ChannelId) -> None:
        """Deliver ``channel`` again, held records first."""

    def snapshot(self, barrier: Barrier) -> None:
        """Take the task's state snapshot for ``barrier`` now (a copy; upload may follow)."""

    def forward_barrier(self, barrier: Barrier) -> None:
        """Write ``barrier`` to every output channel before anything else."""

    def record_in_flight(self, checkpoint_id: int, channel: ChannelId, start: int, end: int) -> None:
        """Offsets ``[start, end)`` of ``channel`` are channel state of ``checkpoint_id``."""

    def acknowledge(self, checkpoint: TaskCheckpoint) -> None:
        """The task's part of checkpoint n is complete."""

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str) -> None:
        """The task gives up checkpoint n (declines it; forwards a cancellation)."""


# --------------------------------------------------------------------------
# bookkeeping of one checkpoint inside the task


@dataclass(slots=True)
class _Pending:
    barrier: Barrier
    started_at: float
    # channels whose barrier n came (or was announced) -> its offset
    barrier_offsets: dict[ChannelId, int] = field(default_factory=dict)
    # unaligned: channel -> position when the snapshot was taken
    starts: dict[ChannelId, int] = field(default_factory=dict)
    # aligned with a timeout: channels whose barrier n was announced -> its offset
    announced: dict[ChannelId, int] = field(default_factory=dict)
    snapshot_at: float | None = None
    kind: CheckpointKind = CheckpointKind.ALIGNED
    switch: Switch | None = None
    switched_after_ms: float | None = None

    @property
    def checkpoint_id(self) -> int:
        return self.barrier.checkpoint_id


class _Context:
    """What every state reads and changes: inputs, positions, the controller."""

    def __init__(
        self,
        controller: Controller,
        inputs: Iterable[ChannelId],
        positions: Mapping[ChannelId, int],
        clock: Callable[[], float],
        wall_clock: Callable[[], float],
        max_concurrent: int,
    ):
        self.controller = controller
        self.inputs = frozenset(inputs)
        self.open: set[ChannelId] = set(self.inputs)
        self.positions: dict[ChannelId, int] = {c: int(positions.get(c, 0)) for c in self.inputs}
        self.blocked: set[ChannelId] = set()
        self.clock = clock
        self.wall_clock = wall_clock
        self.max_concurrent = max_concurrent

    def since_trigger_ms(self, barrier: Barrier) -> float | None:
        """Milliseconds since ``barrier``'s trigger by this host's wall clock
        (None when the barrier has no trigger time; never negative)."""
        if not barrier.timestamp_ms:
            return None
        return max(0.0, round(self.wall_clock() * 1000.0 - barrier.timestamp_ms, 3))

    def timed_out(self, pending: _Pending) -> bool:
        """The alignment timeout of ``pending`` has passed: since its trigger,
        or (bounding clock skew) since this task first saw it."""
        timeout = pending.barrier.options.alignment_timeout_ms
        if timeout is None:
            return False
        since_trigger = self.since_trigger_ms(pending.barrier)
        return (since_trigger is not None and since_trigger >= timeout) or (
            round((self.clock() - pending.started_at) * 1000.0, 3) >= timeout
        )

    def switch(self, pending: _Pending, kind: CheckpointKind, why: Switch) -> None:
        """Turn ``pending`` unaligned: take its snapshot now.  Channels whose
        barrier came were blocked at it (nothing of them is in flight); ones
        whose barrier was announced close at the announced offset."""
        pending.kind = kind
        pending.switch = why
        pending.switched_after_ms = self.since_trigger_ms(pending.barrier)
        log.info("checkpoint %d: unaligned: %s", pending.checkpoint_id, why.value)
        self.take_snapshot(pending)
        for channel, offset in pending.barrier_offsets.items():
            pending.starts[channel] = offset
        for channel, offset in pending.announced.items():
            if channel in self.open:
                pending.barrier_offsets.setdefault(channel, offset)

    # effects, each logged with the checkpoint and channel

    def block(self, checkpoint_id: int, channel: ChannelId) -> None:
        self.blocked.add(channel)
        log.debug("checkpoint %d: %s blocked", checkpoint_id, channel)
        self.controller.block(channel)

    def release_all(self, checkpoint_id: int) -> None:
        for channel in sorted(self.blocked):
            log.debug("checkpoint %d: %s released", checkpoint_id, channel)
            self.controller.release(channel)
        self.blocked.clear()

    def take_snapshot(self, pending: _Pending) -> None:
        pending.snapshot_at = self.clock()
        pending.starts = dict(self.positions)
        self.controller.snapshot(pending.barrier)
        self.controller.forward_barrier(pending.barrier)

    def acknowledge(self, pending: _Pending) -> None:
        positions = {
            c: pending.barrier_offsets[c] + 1 if c in pending.barrier_offsets else self.positions[c]
            for c in self.inputs
        }
        in_flight: dict[ChannelId, tuple[int, int]] = {}
        if pending.kind not in (CheckpointKind.ALIGNED, CheckpointKind.AT_LEAST_ONCE):
            for channel in sorted(self.inputs):
                start = pending.starts[channel]
                end = pending.barrier_offsets.get(channel, self.positions[channel])
                if start < end:
                    in_flight[channel] = (start, end)
                    self.controller.record_in_flight(pending.checkpoint_id, channel, start, end)
        now = self.clock()
        checkpoint = TaskCheckpoint(
            barrier=pending.barrier,
            kind=pending.kind,
            positions=positions,
            in_flight=in_flight,
            started_at=pending.started_at,
            snapshot_at=pending.snapshot_at if pending.snapshot_at is not None else now,
            completed_at=now,
            switch=pending.switch,
            switched_after_ms=pending.switched_after_ms,
        )
        log.debug("checkpoint %d: acknowledged (%s)", pending.checkpoint_id, pending.kind.value)
        self.controller.acknowledge(checkpoint)

    def abort(self, pending: _Pending, reason: CheckpointFailure, detail: str) -> None:
        log.info("checkpoint %d: aborted in this task: %s (%s)", pending.checkpoint_id, reason.value, detail)
        self.controller.abort(pending.checkpoint_id, reason, detail)

    def owes_barrier(self, pending: _Pending) -> set[ChannelId]:
        return self.open - set(pending.barrier_offsets)


# --------------------------------------------------------------------------
# the states


class _State:
    """A state of the handler; every event returns the next state."""

    def barrier(self, ctx: _Context, channel: ChannelId, barrier: Barrier, offset: int) -> _State:
        raise NotImplementedError

    def announcement(self, ctx: _Context, channel: ChannelId, barrier: Barrier, offset: int) -> _State | None:
        """None: the announcement is of no use in this state."""
        return None

    def trigger(self, ctx: _Context, barrier: Barrier) -> _State:
        raise NotImplementedError

    def end_of_input(self, ctx: _Context, channel: ChannelId) -> _State:
        return self

    def tick(self, ctx: _Context, held_bytes: int) -> _State:
        return self

    def abort(self, ctx: _Context, checkpoint_id: int, reason: CheckpointFailure, detail: str) -> _State:
        return self

    def pending_ids(self) -> tuple[int, ...]:
        return ()


def _start(
    ctx: _Context,
    channel: ChannelId,
    barrier: Barrier,
    offset: int,
    announced: bool = False,
    pending: _Pending | None = None,
) -> _State:
    """The state after the first barrier (or announcement, or trigger) of a
    new checkpoint; ``pending``: the one an ``Announced`` state was keeping."""
    pending = pending or _Pending(barrier, ctx.clock())
    mode = barrier.options.alignment
    if announced and mode is not Alignment.UNALIGNED:  # aligned with a timeout
        pending.announced[channel] = offset
        if ctx.timed_out(pending):
            ctx.switch(pending, CheckpointKind.TIMED_OUT_TO_UNALIGNED, Switch.LATE_ANNOUNCEMENT)
            return Unaligned({}).add(ctx, pending)
        return Announced(pending)
    pending.barrier_offsets[channel] = offset
    if mode is Alignment.UNALIGNED or announced:
        pending.kind = CheckpointKind.UNALIGNED
        ctx.take_snapshot(pending)
        if not announced:
            pending.starts[channel] = offset  # its barrier came: nothing in flight on it
        return Unaligned({}).add(ctx, pending)
    if mode is Alignment.AT_LEAST_ONCE:
        pending.kind = CheckpointKind.AT_LEAST_ONCE
        return Collecting(pending).check(ctx)
    if channel in ctx.open and ctx.owes_barrier(pending):
        ctx.block(barrier.checkpoint_id, channel)
    state = Aligning(pending).check(ctx)
    # a barrier that comes after the timeout (a timeout of zero: any barrier) turns unaligned at once
    return state.tick(ctx, 0, first=True) if isinstance(state, Aligning) else state


class Idle(_State):
    """No checkpoint in progress."""

    def barrier(self, ctx, channel, barrier, offset):
        return _start(ctx, channel, barrier, offset)

    def announcement(self, ctx, channel, barrier, offset):
        if barrier.options.alignment is not Alignment.UNALIGNED and barrier.options.alignment_timeout_ms is None:
            return None
        return _start(ctx, channel, barrier, offset, announced=True)

    def trigger(self, ctx, barrier):
        if barrier.options.alignment is not Alignment.UNALIGNED and ctx.open:
            raise ProtocolError(
                f"checkpoint {barrier.checkpoint_id}: a task with inputs can only initiate unaligned "
                f"checkpoints (an aligned initiator would lose the messages in flight towards it)"
            )
        pending = _Pending(
            barrier,
            ctx.clock(),
            kind=CheckpointKind.UNALIGNED
            if ctx.open
            else (
                CheckpointKind.AT_LEAST_ONCE
                if barrier.options.alignment is Alignment.AT_LEAST_ONCE
                else CheckpointKind.ALIGNED
            ),
        )
        ctx.take_snapshot(pending)
        return Unaligned({}).add(ctx, pending)

    def __repr__(self) -> str:
        return "Idle"


class _OneCheckpoint(_State):
    """A state with one checkpoint in progress; aborting it ends the state."""

    def __init__(self, pending: _Pending):
        self.pending = pending

    def pending_ids(self):
        return (self.pending.checkpoint_id,)

    def abort(self, ctx, checkpoint_id, reason, detail):
        if checkpoint_id != self.pending.checkpoint_id:
            return self
        ctx.abort(self.pending, reason, detail)
        return Idle()


class Announced(_OneCheckpoint):
    """Aligned checkpoint n with a timeout: its barrier was announced on some
    channels but none was read yet.  Nothing is blocked; the first barrier
    starts the alignment, the timeout passing first turns it unaligned."""

    def barrier(self, ctx, channel, barrier, offset):
        if barrier.checkpoint_id == self.pending.checkpoint_id:
            return _start(ctx, channel, barrier, offset, pending=self.pending)
        ctx.abort(self.pending, CheckpointFailure.SUBSUMED, f"barrier {barrier.checkpoint_id} came on {channel} first")
        return _start(ctx, channel, barrier, offset)

    def announcement(self, ctx, channel, barrier, offset):
        if barrier.checkpoint_id != self.pending.checkpoint_id:
            return None
        self.pending.announced[channel] = offset
        return self

    def trigger(self, ctx, barrier):
        raise ProtocolError(
            f"checkpoint {barrier.checkpoint_id} triggered while {self.pending.checkpoint_id} was announced"
        )

    def end_of_input(self, ctx, channel):
        if ctx.owes_barrier(self.pending):
            return self
        return Aligning(self.pending).check(ctx)  # no input left open: nothing to align

    def tick(self, ctx, held_bytes):
        if not ctx.timed_out(self.pending):
            return self
        ctx.switch(self.pending, CheckpointKind.TIMED_OUT_TO_UNALIGNED, Switch.TIMEOUT_WHILE_ANNOUNCED)
        return Unaligned({}).add(ctx, self.pending)

    def __repr__(self) -> str:
        return f"Announced({self.pending.checkpoint_id}, on={sorted(map(str, self.pending.announced))})"


class Aligning(_OneCheckpoint):
    """Aligned checkpoint n: channels that delivered barrier n are blocked."""

    def check(self, ctx: _Context) -> _State:
        if ctx.owes_barrier(self.pending):
            return self
        ctx.take_snapshot(self.pending)
        ctx.acknowledge(self.pending)
        ctx.release_all(self.pending.checkpoint_id)
        return Idle()

    def barrier(self, ctx, channel, barrier, offset):
        if barrier.checkpoint_id == self.pending.checkpoint_id:
            self.pending.barrier_offsets[channel] = offset
            if ctx.owes_barrier(self.pending):
                ctx.block(barrier.checkpoint_id, channel)
            return self.check(ctx)
        # a newer barrier on a channel that still owed n: n was given up upstream
        self._give_up(ctx, CheckpointFailure.SUBSUMED, f"barrier {barrier.checkpoint_id} came on {channel} first")
        return _start(ctx, channel, barrier, offset)

    def announcement(self, ctx, channel, barrier, offset):
        if barrier.checkpoint_id != self.pending.checkpoint_id or barrier.options.alignment_timeout_ms is None:
            return None
        self.pending.announced[channel] = offset  # where it closes if the timeout passes
        return self

    def trigger(self, ctx, barrier):
        raise ProtocolError(f"checkpoint {barrier.checkpoint_id} triggered while aligning {self.pending.checkpoint_id}")

    def end_of_input(self, ctx, channel):
        return self.check(ctx)

    def tick(self, ctx, held_bytes, first: bool = False):
        """``first``: the task just saw its first barrier of the checkpoint."""
        options = self.pending.barrier.options
        if ctx.timed_out(self.pending):
            why = Switch.LATE_BARRIER if first else Switch.TIMEOUT_WHILE_ALIGNING
            return self._switch(ctx, CheckpointKind.TIMED_OUT_TO_UNALIGNED, why)
        if options.held_bytes_budget is not None and held_bytes > options.held_bytes_budget:
            return self._switch(ctx, CheckpointKind.OVER_BUDGET_TO_UNALIGNED, Switch.OVER_BUDGET)
        return self

    def abort(self, ctx, checkpoint_id, reason, detail):
        if checkpoint_id != self.pending.checkpoint_id:
            return self
        self._give_up(ctx, reason, detail)
        return Idle()

    def _switch(self, ctx: _Context, kind: CheckpointKind, why: Switch) -> _State:
        ctx.switch(self.pending, kind, why)
        ctx.release_all(self.pending.checkpoint_id)
        return Unaligned({}).add(ctx, self.pending)

    def _give_up(self, ctx: _Context, reason: CheckpointFailure, detail: str) -> None:
        ctx.abort(self.pending, reason, detail)
        ctx.release_all(self.pending.checkpoint_id)

    def __repr__(self) -> str:
        return f"Aligning({self.pending.checkpoint_id}, blocked={sorted(map(str, self.pending.barrier_offsets))})"


class Unaligned(_State):
    """Snapshots taken; barriers still owed by some channels."""

    def __init__(self, pending: dict[int, _Pending]):
        self.pending = pending

    def pending_ids(self):
        return tuple(sorted(self.pending))

    def add(self, ctx: _Context, pending: _Pending) -> _State:
        while len(self.pending) >= ctx.max_concurrent:
            oldest = self.pending.pop(min(self.pending))
            ctx.abort(
                oldest,
                CheckpointFailure.SUBSUMED,
                f"checkpoint {pending.checkpoint_id} started; at most {ctx.max_concurrent} may run at once",
            )
        self.pending[pending.checkpoint_id] = pending
        return self.check(ctx)

    def check(self, ctx: _Context) -> _State:
        for checkpoint_id in sorted(self.pending):
            pending = self.pending[checkpoint_id]
            if not ctx.owes_barrier(pending):
                del self.pending[checkpoint_id]
                ctx.acknowledge(pending)
        return self if self.pending else Idle()

    def barrier(self, ctx, channel, barrier, offset):
        pending = self.pending.get(barrier.checkpoint_id)
        if pending is not None:
            pending.barrier_offsets.setdefault(channel, offset)
            return self.check(ctx)
        if barrier.options.alignment is Alignment.UNALIGNED:
            return self._start_unaligned(ctx, channel, barrier, offset, announced=False)
        if barrier.options.may_switch_to_unaligned:
            # an older checkpoint is still unaligned: blocking now could not make this one aligned in time
            return self._start_unaligned(
                ctx,
                channel,
                barrier,
                offset,
                announced=False,
                kind=CheckpointKind.TIMED_OUT_TO_UNALIGNED,
                why=Switch.OLDER_UNALIGNED,
            )
        for old in sorted(self.pending):
            ctx.abort(
                self.pending[old],
                CheckpointFailure.SUBSUMED,
                f"checkpoint {barrier.checkpoint_id} ({barrier.options.alignment.value}) started",
            )
        return _start(ctx, channel, barrier, offset)

    def announcement(self, ctx, channel, barrier, offset):
        pending = self.pending.get(barrier.checkpoint_id)
        if pending is not None:
            pending.barrier_offsets.setdefault(channel, offset)
            return self.check(ctx)
        if barrier.options.alignment is not Alignment.UNALIGNED:
            return None
        return self._start_unaligned(ctx, channel, barrier, offset, announced=True)

    def trigger(self, ctx, barrier):
        pending = _Pending(barrier, ctx.clock(), kind=CheckpointKind.UNALIGNED)
        ctx.take_snapshot(pending)
        return self.add(ctx, pending)

    def end_of_input(self, ctx, channel):
        return self.check(ctx)

    def abort(self, ctx, checkpoint_id, reason, detail):
        pending = self.pending.pop(checkpoint_id, None)
        if pending is not None:
            ctx.abort(pending, reason, detail)
        return self if self.pending else Idle()

    def _start_unaligned(
        self, ctx, channel, barrier, offset, *, announced, kind=CheckpointKind.UNALIGNED, why=None
    ) -> _State:
        pending = _Pending(barrier, ctx.clock(), kind=kind, switch=why)
        if why is not None:
            pending.switched_after_ms = ctx.since_trigger_ms(barrier)
        pending.barrier_offsets[channel] = offset
        ctx.take_snapshot(pending)
        if not announced:
            pending.starts[channel] = offset
        return self.add(ctx, pending)

    def __repr__(self) -> str:
        return f"Unaligned({sorted(self.pending)})"


class Collecting(_OneCheckpoint):
    """At-least-once checkpoint n: barriers are counted, nothing is blocked."""

    def check(self, ctx: _Context) -> _State:
        if ctx.owes_barrier(self.pending):
            return self
        ctx.take_snapshot(self.pending)
        ctx.acknowledge(self.pending)
        return Idle()

    def barrier(self, ctx, channel, barrier, offset):
        if barrier.checkpoint_id == self.pending.checkpoint_id:
            self.pending.barrier_offsets.setdefault(channel, offset)
            return self.check(ctx)
        ctx.abort(self.pending, CheckpointFailure.SUBSUMED, f"barrier {barrier.checkpoint_id} came on {channel} first")
        return _start(ctx, channel, barrier, offset)

    def trigger(self, ctx, barrier):
        raise ProtocolError(
            f"checkpoint {barrier.checkpoint_id} triggered while collecting {self.pending.checkpoint_id}"
        )

    def end_of_input(self, ctx, channel):
        return self.check(ctx)

    def __repr__(self) -> str:
        return f"Collecting({self.pending.checkpoint_id})"


# --------------------------------------------------------------------------
# the handler


class BarrierHandler:
    """The barrier handler of one task.

    ``inputs``: the task's input channels; ``positions``: where each starts
    (the offset of the next record it will deliver; 0 when not given);
    ``generation``: barriers of any other generation are ignored;
    ``max_concurrent``: unaligned checkpoints that may be pending at once
    (starting one more aborts the oldest); ``clock``: monotonic seconds, for
    durations; ``wall_clock``: seconds since the epoch, compared with the
    trigger time a barrier carries (the alignment timeout).

    The task drives it: ``record_processed`` for every record it processes,
    ``barrier_received`` / ``cancel_received`` for every control record it
    reads, ``announcement_received`` for announced barrier positions,
    ``end_of_input`` when a channel ends, ``tick`` now and then (alignment
    timeout and held-bytes budget), ``trigger`` on a source or initiator.
    A blocked channel's records must not be delivered until released."""

    def __init__(
        self,
        controller: Controller,
        inputs: Iterable[ChannelId],
        *,
        positions: Mapping[ChannelId, int] | None = None,
        generation: int = 0,
        max_concurrent: int = 1,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        newest_started: int = 0,
    ):
        if max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        self._ctx = _Context(controller, inputs, positions or {}, clock, wall_clock, max_concurrent)
        self._state: _State = Idle()
        self.generation = generation
        self.ignored: collections.Counter[IgnoreReason] = collections.Counter()
        self._last_barrier: dict[ChannelId, int] = {}
        self._announced: dict[ChannelId, int] = {}
        self._newest_started = newest_started
        self._cancelled: set[int] = set()

    # ---- what the task asks

    @property
    def state(self) -> _State:
        return self._state

    @property
    def pending(self) -> tuple[int, ...]:
        """Checkpoint ids this task started and has not acknowledged or aborted."""
        return self._state.pending_ids()

    @property
    def newest_started(self) -> int:
        """The newest checkpoint id this task started (or restored from)."""
        return self._newest_started

    def is_blocked(self, channel: ChannelId) -> bool:
        return channel in self._ctx.blocked

    @property
    def blocked(self) -> frozenset[ChannelId]:
        return frozenset(self._ctx.blocked)

    @property
    def open_inputs(self) -> frozenset[ChannelId]:
        return frozenset(self._ctx.open)

    def position(self, channel: ChannelId) -> int:
        return self._ctx.positions[channel]

    # ---- events

    def record_processed(self, channel: ChannelId, offset: int) -> None:
        """The task processed the record at ``offset`` of ``channel``."""
        if channel not in self._ctx.inputs:
            raise ProtocolError(f"record from {channel}, which is not an input of this task")
        if channel in self._ctx.blocked:
            raise ProtocolError(f"record {offset} of {channel} delivered while the channel is blocked")
        if offset < self._ctx.positions[channel]:
            raise ProtocolError(
                f"record {offset} of {channel} is behind the channel's position {self._ctx.positions[channel]}"
            )
        self._ctx.positions[channel] = offset + 1

    def barrier_received(self, channel: ChannelId, barrier: Barrier, offset: int) -> Ignored | None:
        """Barrier ``barrier`` read at ``offset`` of ``channel``; None when it was acted on."""
        ignored = self._check(channel, barrier.checkpoint_id, barrier.generation, offset)
        if ignored is not None:
            return ignored
        self._ctx.positions[channel] = offset + 1
        self._last_barrier[channel] = barrier.checkpoint_id
        if self._announced.get(channel) == barrier.checkpoint_id and barrier.checkpoint_id not in self.pending:
            return None  # its announcement already closed this channel's part of the checkpoint
        if barrier.checkpoint_id in self._cancelled:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.CANCELLED)
        if barrier.checkpoint_id <= self._newest_started and barrier.checkpoint_id not in self.pending:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.LATE)
        self._newest_started = max(self._newest_started, barrier.checkpoint_id)
        self._state = self._state.barrier(self._ctx, channel, barrier, offset)
        return None

    def announcement_received(self, channel: ChannelId, barrier: Barrier, offset: int) -> Ignored | None:
        """Barrier ``barrier`` was written at ``offset`` of ``channel`` (not read yet)."""
        ignored = self._check(channel, barrier.checkpoint_id, barrier.generation, offset, announcement=True)
        if ignored is not None:
            return ignored
        if self._announced.get(channel, 0) >= barrier.checkpoint_id:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.DUPLICATE)
        if barrier.checkpoint_id in self._cancelled:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.CANCELLED)
        if barrier.checkpoint_id <= self._newest_started and barrier.checkpoint_id not in self.pending:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.LATE)
        next_state = self._state.announcement(self._ctx, channel, barrier, offset)
        if next_state is None:
            return self._ignore(channel, barrier.checkpoint_id, IgnoreReason.ANNOUNCEMENT_UNUSED)
        self._announced[channel] = barrier.checkpoint_id
        self._newest_started = max(self._newest_started, barrier.checkpoint_id)
        self._state = next_state
        return None

    def cancel_received(self, channel: ChannelId, cancel: CancelBarrier, offset: int) -> Ignored | None:
        """A cancellation of checkpoint n read at ``offset`` of ``channel``."""
        ignored = self._check(channel, cancel.checkpoint_id, cancel.generation, offset, cancellation=True)
        if ignored is not None:
            return ignored
        self._ctx.positions[channel] = offset + 1
        self.abort(
            cancel.checkpoint_id,
            CheckpointFailure.CANCELLED,
            f"cancelled upstream ({cancel.reason or 'no reason given'}), read on {channel}",
        )
        return None

    def trigger(self, barrier: Barrier) -> None:
        """Start checkpoint n here (a source, or an initiator as in EWD 864a)."""
        if barrier.generation != self.generation:
            raise ProtocolError(f"trigger of {barrier} in generation {self.generation}")
        if barrier.checkpoint_id <= self._newest_started:
            raise ProtocolError(f"trigger of checkpoint {barrier.checkpoint_id}, not newer than {self._newest_started}")
        self._state = self._state.trigger(self._ctx, barrier)
        self._newest_started = barrier.checkpoint_id

    def end_of_input(self, channel: ChannelId) -> None:
        """``channel`` will deliver nothing more."""
        if channel not in self._ctx.open:
            return
        self._ctx.open.discard(channel)
        if channel in self._ctx.blocked:
            self._ctx.blocked.discard(channel)
        self._state = self._state.end_of_input(self._ctx, channel)

    def tick(self, held_bytes: int = 0) -> None:
        """Let time pass: an aligned checkpoint may switch to unaligned now."""
        self._state = self._state.tick(self._ctx, held_bytes)

    def abort(self, checkpoint_id: int, reason: CheckpointFailure, detail: str = "") -> None:
        """Give up checkpoint n (a cancellation, the coordinator's abort, a failed snapshot)."""
        self._cancelled.add(checkpoint_id)
        self._state = self._state.abort(self._ctx, checkpoint_id, reason, detail)

    # ---- validation

    def _check(
        self,
        channel: ChannelId,
        checkpoint_id: int,
        generation: int,
        offset: int,
        *,
        announcement: bool = False,
        cancellation: bool = False,
    ) -> Ignored | None:
        if channel not in self._ctx.inputs:
            return self._ignore(channel, checkpoint_id, IgnoreReason.UNKNOWN_CHANNEL)
        if channel not in self._ctx.open:
            return self._ignore(channel, checkpoint_id, IgnoreReason.CHANNEL_ENDED)
        if not announcement and channel in self._ctx.blocked:
            raise ProtocolError(
                f"checkpoint {checkpoint_id}: control record {offset} of {channel} "
                f"delivered while the channel is blocked"
            )
        if not announcement and offset < self._ctx.positions[channel]:
            raise ProtocolError(
                f"control record {offset} of {channel} is behind the channel's position {self._ctx.positions[channel]}"
            )
        if generation < self.generation:
            reason = IgnoreReason.STALE_GENERATION
        elif generation > self.generation:
            reason = IgnoreReason.FUTURE_GENERATION
        elif announcement or cancellation:
            return None
        elif checkpoint_id == self._last_barrier.get(channel):
            reason = IgnoreReason.DUPLICATE
        elif checkpoint_id < self._last_barrier.get(channel, 0):
            reason = IgnoreReason.OUT_OF_ORDER
        else:
            return None
        if not announcement:
            self._ctx.positions[channel] = offset + 1
        return self._ignore(channel, checkpoint_id, reason)

    def _ignore(self, channel: ChannelId, checkpoint_id: int, reason: IgnoreReason) -> Ignored:
        self.ignored[reason] += 1
        ignored = Ignored(channel, checkpoint_id, reason)
        log.warning("checkpoint %d: %s", checkpoint_id, ignored)
        return ignored

    def __repr__(self) -> str:
        return f"BarrierHandler({self._state!r}, generation={self.generation})"
