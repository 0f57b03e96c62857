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
could keep instead (retention was expected to delete them)."""

from __future__ import annotations

import collections
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from barriers.messages import ChannelId

__all__ = ["CopiedReplay", "ReplayRest"]

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
