"""A checkpoint's unaligned channel state (``spark-abs checkpoints show
--channels``): one row per Kafka record, copied records and ranges read back
from Kafka alike (``held``), each marked with the generation that wrote it
and whether it is stale (records an older generation wrote after a restore's
cut are not channel state), plus the rows those records carry, decoded."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from barriers.headers import GENERATION_HEADER, KIND_HEADER
from barriers.lineage import Lineage
from barriers.messages import ChannelId
from streaming.adapters.kafka.ranges import read_range
from streaming.adapters.serde import codec
from streaming.adapters.serde.records import RECORD_SCHEMA, header_values
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.errors import KafkaUnavailableError
from streaming.tools.checkpoints.state import loaded_tasks

__all__ = ["ChannelState", "ChannelStateReader", "channel_rows", "classify_channel_records"]


@dataclass(frozen=True)
class ChannelState:
    """A checkpoint's channel state: ``records`` (one row per Kafka record:
    task, channel, offset, held as ``copied`` or ``kafka``, written_by,
    stale, kind, value rows and bytes, then the record itself), ``rows`` (the
    data rows of the records that are channel state, decoded, with task,
    channel and offset) and ``problems`` (ranges Kafka no longer holds,
    records that do not decode)."""

    records: pa.Table
    rows: pa.Table
    problems: list[str]


def classify_channel_records(
    records: pa.Table, channel: ChannelId, generation: int, lineage: Lineage, *, task: str = "", held: str = "copied"
) -> pa.Table:
    """``records`` (Kafka records as a task holds them) with what they are:
    ``written_by`` (the generation in their header, null for records a
    producer outside spark-abs wrote), ``stale`` (written by an older
    generation after a restore's cut on this channel: the task skips them,
    they are not channel state), ``kind`` (data, barrier, watermark, ...) and
    ``value_bytes``."""
    n = records.num_rows
    written = pc.cast(pc.cast(header_values(records, GENERATION_HEADER), pa.string()), pa.int64())
    offsets = records["offset"].to_pylist()
    stale = [
        gen is not None and 0 <= gen < generation and lineage.is_stale(channel, gen, offset)
        for gen, offset in zip(written.to_pylist(), offsets)
    ]
    kinds = pc.fill_null(pc.cast(header_values(records, KIND_HEADER), pa.string()), "data")
    values = records["value"]
    described = pa.table(
        {
            "task": pa.array([task] * n, pa.string()),
            "channel": pa.array([str(channel)] * n, pa.string()),
            "offset": records["offset"],
            "held": pa.array([held] * n, pa.string()),
            "written_by": written,
            "stale": pa.array(stale, pa.bool_()),
            "kind": kinds,
            "value_bytes": pc.fill_null(pc.binary_length(values), 0),
        }
    )
    for name in ("key", "value", "headers", "timestamp"):
        described = described.append_column(name, records[name])
    return described


def channel_rows(described: pa.Table, problems: list[str]) -> pa.Table:
    """The data rows carried by the records of ``described`` (from
    ``classify_channel_records``) that are channel state, with task, channel
    and offset first; records that do not decode are added to ``problems``."""
    keep = pc.and_(pc.invert(described["stale"]), pc.equal(described["kind"], "data"))
    keep = pc.and_(keep, pc.greater(described["value_bytes"], 0))
    held = described.filter(keep)
    if held.num_rows == 0:
        return pa.table({"task": pa.array([], pa.string()), "channel": pa.array([], pa.string())})
    # shown, not processed: Arrow batches are read on any channel, within the default cap
    decoded = codec.decode_records(held, codec.ChannelReading.internal())
    for index, reason in decoded.rejected[:5]:
        problems.append(f"{held['channel'][index]} offset {held['offset'][index]}: {reason}")
    if len(decoded.rejected) > 5:
        problems.append(f"... and {len(decoded.rejected) - 5} more records that do not decode")
    index = pa.array(decoded.index, pa.int64())
    rows = decoded.table
    front = {name: held[name].take(index) for name in ("task", "channel", "offset")}
    for position, (name, column) in enumerate(front.items()):
        label = name if name not in rows.column_names else f"_{name}"
        rows = rows.add_column(position, label, column)
    return rows


class ChannelStateReader:
    """The channel state of ``store``'s checkpoints; ``kafka`` is the
    Kafka cluster ranges are read back from (without it, ranges are
    reported, not read)."""

    def __init__(self, store: SnapshotStore, kafka: KafkaAccess | None = None):
        self.store = store
        self.kafka = kafka

    def read(
        self, checkpoint_id: int, *, task: str | None = None, progress: Callable[[str], None] = lambda _: None
    ) -> ChannelState:
        """The checkpoint's channel state (see ``ChannelState``): copied records
        as stored, ranges read back from Kafka while it still holds them."""
        described: list[pa.Table] = []
        problems: list[str] = []
        for loaded in loaded_tasks(self.store, checkpoint_id, task):
            snapshot = loaded.snapshot
            lineage = Lineage.from_json(snapshot.metadata.get("lineage"))
            for name, (start, end) in sorted(snapshot.in_flight.items()):
                channel = ChannelId.parse(name)
                if name in loaded.channel_records:
                    records, held = loaded.channel_records[name], "copied"
                elif self.kafka is None:
                    problems.append(f"{snapshot.task} {name}: [{start}, {end}) kept as a range; no Kafka to read it")
                    continue
                else:
                    progress(f"reading {snapshot.task} {name} [{start}, {end}) from Kafka")
                    try:
                        records, held = read_range(self.kafka, channel, start, end), "kafka"
                    except KafkaUnavailableError as exc:
                        problems.append(f"{snapshot.task} {name}: {exc}")
                        continue
                records = records.select(RECORD_SCHEMA.names).cast(RECORD_SCHEMA)
                described.append(
                    classify_channel_records(
                        records, channel, snapshot.generation, lineage, task=snapshot.task, held=held
                    )
                )
        if described:
            records = pa.concat_tables(described)
        else:
            records = classify_channel_records(RECORD_SCHEMA.empty_table(), ChannelId("-", 0), 0, Lineage())
        # each channel decoded on its own: channels of different stages carry different columns
        rows = [channel_rows(part, problems) for part in described]
        rows = [r for r in rows if r.num_rows] or [channel_rows(records.slice(0, 0), problems)]
        try:
            decoded = pa.concat_tables(rows, promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            problems.append(f"the channels' rows have types that do not combine ({exc}): read one task at a time")
            decoded = rows[0]
        return ChannelState(records, decoded, problems)
