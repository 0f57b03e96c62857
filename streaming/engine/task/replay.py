"""Channel state a restore copied into a snapshot (records, not offset ranges),
replayed while the restored job runs and checkpoints.

A task restored from an unaligned checkpoint whose channel state was copied
processes those records before anything its query reads on the same
channels.  It does not do so before it says it is ready: the records are
handed over in runs (``next_run``) on a thread of the task's own once it
is ready, or ahead of the first micro-batch, so checkpoints go on during a
long replay, as Flink 2.3 does since FLIP-547.  A checkpoint taken before a
channel's copied records are all processed holds the rest of them as its
own channel state (``rest``), followed by Kafka's records from where the
query resumes that channel: the copied ones may be in no Kafka range it
could keep instead (retention was expected to delete them).

``RestoredChannelState`` is a task's whole restored channel state: the
copied records and the offset ranges its query reads again, until each
channel is past its end, then said on the control topic (a restore's last
step)."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from barriers.messages import ChannelId
from streaming.waits import join_within

__all__ = ["CopiedReplay", "ReplayRest", "RestoredChannelState"]

log = logging.getLogger(__name__)

# records handed over at once: the task takes announcements between the segments of a run anyway
RUN_RECORDS = 5_000


@dataclass(frozen=True)
class ReplayRest:
    """A channel's copied records a task had not processed at a snapshot, and
    the offset its Kafka records go on from (where the query resumes it)."""

    records: pa.Table
    kafka_from: int


class CopiedReplay:
    """The copied channel state of a restored task, by channel (each table
    in offset order, as ``read_range`` and the snapshot store give it)."""

    def __init__(
        self,
        tables: Mapping[ChannelId, pa.Table],
        run_records: int = RUN_RECORDS,
        *,
        resume: Mapping[ChannelId, int] | None = None,
    ):
        if run_records < 1:
            raise ValueError(f"run_records must be at least 1, not {run_records}")
        self._tables = {c: t for c, t in sorted(tables.items()) if t.num_rows}
        self._offsets = {c: t["offset"].to_numpy() for c, t in self._tables.items()}
        # each channel's copied records end here (the offset after the last one)
        self.ends = {c: int(offsets[-1]) + 1 for c, offsets in self._offsets.items()}
        # where the query resumes each channel (past the barrier that ended its channel state)
        self._resume = {c: max(end, (resume or {}).get(c, end)) for c, end in self.ends.items()}
        self.records = sum(t.num_rows for t in self._tables.values())
        self._runs = collections.deque(
            (c, start, min(start + run_records, t.num_rows))
            for c, t in self._tables.items()
            for start in range(0, t.num_rows, run_records)
        )

    @property
    def handing(self) -> bool:
        """Whether records are left to hand over."""
        return bool(self._runs)

    def next_run(self) -> pa.Table | None:
        """The next run of records to process (channel by channel, in offset order)."""
        if not self._runs:
            return None
        channel, start, end = self._runs.popleft()
        return self._tables[channel].slice(start, end - start)

    def rest(self, positions: Mapping[ChannelId, int]) -> dict[ChannelId, ReplayRest]:
        """The copied records each channel has not processed at ``positions``
        (the task's next offset per channel): what a checkpoint taken now
        holds of them."""
        rest = {}
        for channel, offsets in self._offsets.items():
            position = positions.get(channel, 0)
            if position < self.ends[channel]:
                first = int(np.searchsorted(offsets, position, side="left"))
                rest[channel] = ReplayRest(self._tables[channel].slice(first), self._resume[channel])
        return rest

    def forget(self, positions: Mapping[ChannelId, int]) -> None:
        """Let go of the channels processed past their copied records (no later checkpoint needs them)."""
        for channel in [c for c, end in self.ends.items() if positions.get(c, 0) >= end]:
            if not any(c == channel for c, _, _ in self._runs):
                del self._tables[channel], self._offsets[channel], self.ends[channel], self._resume[channel]


class RestoredChannelState:
    """The channel state task ``task`` still has to process again after a
    restore: each channel up to an offset (``pending``), the copied part of
    it (``copied``) handed over in runs on a thread of the task's own
    (``start``).  ``position`` is the task's next offset on a channel;
    ``announce(records)`` says the whole of it was processed again."""

    def __init__(
        self,
        task: str,
        position: Callable[[ChannelId], int],
        announce: Callable[[int], None],
        run_records: int = RUN_RECORDS,
    ):
        self.task = task
        self._position = position
        self._announce = announce
        self._run_records = run_records
        # each channel still to process again up to this offset
        self.pending: dict[ChannelId, int] = {}
        self.copied: CopiedReplay | None = None
        # the records to process again, copied and read again alike
        self.records = 0
        # what stopped the replay of the copied records (the worker stops on it)
        self.error: BaseException | None = None
        self._thread: threading.Thread | None = None
        self._closing = threading.Event()

    def note(
        self,
        copied: Mapping[ChannelId, pa.Table],
        read_again_until: Mapping[ChannelId, int],
        resume: Mapping[ChannelId, int],
    ) -> CopiedReplay | None:
        """The restored channel state: ``copied`` records (processed before
        anything the query reads on their channels) and the offset ranges the
        query reads again, up to ``read_again_until``; the copied part, if any."""
        replay = CopiedReplay(copied, self._run_records, resume=resume)
        if replay.records:
            self.copied = replay
        ends = {**read_again_until, **replay.ends}
        self.pending = {c: end for c, end in ends.items() if self._position(c) < end}
        self.records = sum(end - self._position(c) for c, end in self.pending.items())
        return self.copied

    def start(self, run: Callable[[], bool]) -> None:
        """Hand the copied records over on a thread of the task's own: ``run()``
        (one run, whether one was) until none is left, the task closes or a
        run fails (``error``)."""
        if self.copied is None or not self.copied.handing or self._thread is not None:
            return

        def replay() -> None:
            try:
                while not self._closing.is_set() and run():
                    pass
            except Exception as exc:  # the worker stops on it (``error``)
                log.error("%s: replaying the restored channel state failed: %s", self.task, exc)
                self.error = exc

        self._thread = threading.Thread(target=replay, name=f"replay-{self.task}", daemon=True)
        self._thread.start()

    def wait(self, timeout_s: float) -> None:
        """Until the replay ``start`` began ended (done, failed or closed), at most ``timeout_s``."""
        if self._thread is not None:
            join_within(self._thread, timeout_s, f"the replay of {self.task}'s restored channel state")

    def check(self, channel: ChannelId) -> None:
        """``channel`` got past its restored channel state: once every channel
        did, say so (``announce``)."""
        end = self.pending.get(channel)
        position = self._position(channel)
        if end is None or position < end:
            return
        del self.pending[channel]
        if self.copied is not None:
            self.copied.forget({channel: position})
        if not self.pending:
            self._announce(self.records)

    def close(self, timeout_s: float = 30.0) -> None:
        self._closing.set()
        self.wait(timeout_s)
