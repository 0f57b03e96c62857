"""What checkpoints rely on Kafka to keep, and what happens when it did not
(docs/operations/retention.md).

A restore reads Kafka again from each channel's position, or from the start
of the channel's state kept as an offset range (``needs``).  Retention
(``retention.ms``, ``retention.bytes``) and ``DeleteRecords`` move a
partition's earliest offset forward; a checkpoint that needs an offset below
it cannot be restored exactly.

- **At restore** (``KafkaKept``, ``pick_restorable``): every offset a
  candidate checkpoint needs is compared with its partition's earliest
  offset (one query for all partitions, cached for the restore).  One that is
  gone is an ``OffsetGone`` (channel, the offset needed, the earliest); the
  checkpoint is skipped as a damaged one is, and the restore takes the
  newest one that can be restored.  When none can, the restore stops with
  ``OffsetsGoneError`` instead of starting from the beginning, which Kafka no
  longer holds either.
- **Before** (``RetentionWatch``, used by a task's upload): time retention
  deletes a partition's oldest records once they are older than
  ``retention.ms``.  For each checkpoint the task asks Kafka once per topic
  for the first offset whose record is newer than ``now + horizon -
  retention.ms``; an offset the checkpoint needs below it may be deleted
  before the checkpoint is superseded.  Such a range is copied into the
  checkpoint instead (``at_risk`` says which), and a position is warned
  about (the job is that far behind: nothing to copy)."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from barriers.messages import ChannelId
from streaming.adapters.snapshots import Manifest, TaskSnapshot
from streaming.errors import OffsetsGoneError

__all__ = [
    "Need",
    "OffsetGone",
    "AtRisk",
    "needs",
    "KafkaKept",
    "pick_restorable",
    "RetentionWatch",
    "relied_on_ms",
]


@dataclass(frozen=True, slots=True)
class Need:
    """An offset a restore of task ``task`` reads Kafka from: the start of a
    channel's state kept as a range (``range``) or the channel's position
    (``position``)."""

    task: str
    channel: ChannelId
    offset: int
    what: str  # "range" or "position"


def needs(snapshot: TaskSnapshot) -> list[Need]:
    """Where a restore of ``snapshot`` reads each of its channels from: a
    range's start unless its records were copied, the position otherwise."""
    copied = {part.name for part in snapshot.channel_parts}
    found = []
    for channel, position in sorted(snapshot.positions.items()):
        if channel in snapshot.in_flight and channel not in copied:
            found.append(Need(snapshot.task, ChannelId.parse(channel), snapshot.in_flight[channel][0], "range"))
        else:
            found.append(Need(snapshot.task, ChannelId.parse(channel), position, "position"))
    return found


@dataclass(frozen=True, slots=True)
class OffsetGone:
    """A checkpoint needs ``needed`` of ``channel``; Kafka starts that
    partition at ``earliest`` now."""

    checkpoint_id: int
    need: Need
    earliest: int

    def describe(self) -> str:
        held = "its channel state starts" if self.need.what == "range" else "it resumes"
        return (
            f"offsets gone: task {self.need.task} needs {self.need.channel} from offset {self.need.offset} "
            f"({held} there), Kafka's earliest offset is {self.earliest} (retention or DeleteRecords removed them)"
        )


class KafkaKept:
    """Whether Kafka still holds what a checkpoint needs, at a restore:
    ``earliest(channels)`` (each partition's earliest offset) is asked once
    for every channel a checkpoint reads, and remembered for the restore."""

    def __init__(self, earliest: Callable[[Iterable[ChannelId]], Mapping[ChannelId, int]]):
        self._earliest = earliest
        self._known: dict[ChannelId, int] = {}

    def gone(self, manifest: Manifest) -> list[OffsetGone]:
        """What ``manifest``'s checkpoint needs that Kafka no longer holds."""
        wanted = [need for snapshot in manifest.tasks.values() for need in needs(snapshot)]
        unknown = sorted({need.channel for need in wanted} - set(self._known))
        if unknown:
            self._known.update(self._earliest(unknown))
        return [
            OffsetGone(manifest.checkpoint_id, need, self._known[need.channel])
            for need in wanted
            if need.channel in self._known and need.offset < self._known[need.channel]
        ]

    def check(self, manifest: Manifest) -> None:
        """``OffsetsGoneError`` when ``manifest``'s checkpoint, asked for by
        name, needs what Kafka no longer holds."""
        gone = self.gone(manifest)
        if gone:
            raise OffsetsGoneError(
                f"checkpoint {manifest.checkpoint_id} cannot be restored: {'; '.join(g.describe() for g in gone)}"
            )


def pick_restorable(
    latest_verified: Callable[[Iterable[int]], tuple[Manifest | None, list[tuple[int, list[str]]]]],
    kept: KafkaKept,
) -> tuple[Manifest | None, list[tuple[int, list[str]]]]:
    """The newest checkpoint that verifies (``latest_verified(exclude)``)
    and whose offsets Kafka still holds, and the newer ones skipped with
    their problems (offsets gone among them).  None when there is no
    checkpoint at all; ``OffsetsGoneError`` when there are, but every one
    that verifies needs offsets Kafka no longer holds: a start from the
    beginning would lose those records without saying so."""
    manifest, skipped = latest_verified(())
    gone_ids = []
    while manifest is not None:
        gone = kept.gone(manifest)
        if not gone:
            return manifest, skipped
        skipped.append((manifest.checkpoint_id, [g.describe() for g in gone]))
        gone_ids.append(manifest.checkpoint_id)
        manifest, more = latest_verified([c for c, _ in skipped])
        skipped.extend(more)
    if gone_ids:
        first = next(p for c, p in skipped if c == gone_ids[0])
        damaged = ", ".join(str(c) for c, _ in skipped if c not in gone_ids)
        raise OffsetsGoneError(
            f"no checkpoint can be restored: checkpoints {', '.join(map(str, gone_ids))} need Kafka records "
            f"that retention or DeleteRecords removed ({first[0]})"
            f"{f', and checkpoints {damaged} do not verify' if damaged else ''}; starting "
            f"from the beginning would lose them too.  Kafka no longer holds this job's input: run it under "
            f"another --job name to start from what Kafka still holds (those records are lost), and keep the "
            f"topics' records longer (retention.ms) than the job may lag"
        )
    return None, skipped


@dataclass(frozen=True, slots=True)
class AtRisk:
    """An offset a checkpoint needs whose record time retention may delete
    before the checkpoint is superseded: the partition's records before
    ``first_kept`` are older than its topic's ``retention_ms`` allows for
    the ``horizon_ms`` to come (None: every record is)."""

    channel: ChannelId
    offset: int
    first_kept: int | None
    retention_ms: int
    horizon_ms: float


def relied_on_ms(interval_s: float, timeout_s: float) -> float:
    """How long a restore may rely on the newest checkpoint: until the next
    one completes, at most an interval and a timeout away; twice that, so a
    checkpoint that fails does not leave its predecessor unguarded at once."""
    return 2 * (interval_s + timeout_s) * 1000


class RetentionWatch:
    """Per task: which offsets a checkpoint needs may be deleted by time
    retention within ``horizon_ms`` (the time until a later checkpoint
    supersedes it).  ``retention_ms`` maps each input topic to its
    ``retention.ms`` (None: kept forever), read once when the task is built;
    ``first_newer(channels, timestamp_ms)`` is one query per topic: each
    partition's first offset whose record's timestamp is at or after
    ``timestamp_ms`` (None when there is none)."""

    def __init__(
        self,
        retention_ms: Mapping[str, int | None],
        first_newer: Callable[[list[ChannelId], int], Mapping[ChannelId, int | None]],
        horizon_ms: float,
        *,
        clock: Callable[[], float] = time.time,
    ):
        self.retention_ms = {topic: ms for topic, ms in retention_ms.items() if ms is not None}
        self._first_newer = first_newer
        self.horizon_ms = horizon_ms
        self._clock = clock

    def at_risk(self, wanted: Mapping[ChannelId, int]) -> dict[ChannelId, AtRisk]:
        """The offsets of ``wanted`` (channel -> the offset a restore reads
        from) whose records time retention may delete within the horizon."""
        now_ms = self._clock() * 1000
        by_topic: dict[str, list[ChannelId]] = {}
        for channel in sorted(wanted):
            if channel.topic in self.retention_ms:
                by_topic.setdefault(channel.topic, []).append(channel)
        risky = {}
        for topic, channels in by_topic.items():
            kept_ms = self.retention_ms[topic]
            first = self._first_newer(channels, int(now_ms + self.horizon_ms - kept_ms))
            for channel in channels:
                first_kept = first.get(channel)
                if first_kept is None or wanted[channel] < first_kept:
                    risky[channel] = AtRisk(channel, wanted[channel], first_kept, kept_ms, self.horizon_ms)
        return risky
