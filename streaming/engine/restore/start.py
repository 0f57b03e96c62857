"""Where a task starts in a new generation (docs/architecture/restore.md, "Restore").

From checkpoint n, a task loads its operator state and watermarks; its
channels resume at the offsets its snapshot recorded, except that unaligned
channel state comes first: copied records are replayed before anything the
query reads, and a channel kept as an offset range is read again by the
query from the start of that range (records an older generation wrote there
are channel state; after the channel's barrier they are stale).  A new
generation from no checkpoint starts every channel at the beginning and
treats everything older generations wrote as stale."""

from __future__ import annotations

from dataclasses import dataclass

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming.adapters.snapshots import LoadedTask
from streaming.engine.task.stage_task import TaskStart

__all__ = ["TaskRestore", "plan_start"]


@dataclass(frozen=True)
class TaskRestore:
    """What a task starts from (``start``) and where its query starts reading
    each channel (``query_start``; channels not named start at the earliest offset)."""

    start: TaskStart
    query_start: dict[ChannelId, int]


def plan_start(generation: int, checkpoint_id: int | None, loaded: LoadedTask | None) -> TaskRestore:
    """The start of a task in ``generation``: fresh (generation 0), from the
    beginning (a later generation with no checkpoint) or from ``loaded``, its
    snapshot in checkpoint ``checkpoint_id``."""
    if loaded is None or checkpoint_id is None:
        if generation > 0:  # a restore from the beginning: everything older is stale
            return TaskRestore(TaskStart(generation=generation, lineage=Lineage().after_restore(generation, None)), {})
        return TaskRestore(TaskStart(generation=generation), {})
    snapshot = loaded.snapshot
    positions = {ChannelId.parse(c): p for c, p in snapshot.positions.items()}
    ranges = {ChannelId.parse(c): (int(a), int(b)) for c, (a, b) in snapshot.in_flight.items()}
    replay = {ChannelId.parse(c): t for c, t in loaded.channel_records.items()}
    # channel state first: copied records are replayed; a range is read again by the query,
    # from its start (older-generation records skipped only after the barrier)
    handler_positions = {c: min(p, ranges[c][0]) if c in ranges else p for c, p in positions.items()}
    query_start = {c: handler_positions[c] if c in ranges and c not in replay else p for c, p in positions.items()}
    start = TaskStart(
        generation=generation,
        checkpoint_id=checkpoint_id,
        positions=handler_positions,
        state=loaded.state,
        watermarks={ChannelId.parse(c): int(w) for c, w in (snapshot.metadata.get("watermarks") or {}).items()},
        lineage=Lineage.from_json(snapshot.metadata.get("lineage")).after_restore(generation, positions),
        replay=replay,
        replay_until={c: end for c, (_, end) in ranges.items() if c not in replay},
        resume={c: positions[c] for c in replay if c in positions},
    )
    return TaskRestore(start, query_start)
