"""Cutting micro-batches into segments: runs per channel and kind, single
control and watermark records, and long runs cut by records and by bytes."""

from __future__ import annotations

import pyarrow as pa

from barriers.lineage import Lineage
from barriers.messages import Barrier, ChannelId, encode
from streaming.engine.segments import Segmenter, SegmentKind
from streaming.engine.watermarks import watermark_headers

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def records(rows) -> pa.Table:
    """rows: (partition, offset, value, headers)."""
    return pa.table(
        {
            "topic": pa.array(["t"] * len(rows)),
            "partition": pa.array([r[0] for r in rows], pa.int32()),
            "offset": pa.array([r[1] for r in rows], pa.int64()),
            "key": pa.nulls(len(rows), pa.binary()),
            "value": pa.array([r[2] for r in rows], pa.binary()),
            "headers": pa.array([[{"key": k, "value": v} for k, v in r[3]] for r in rows], HEADERS),
        }
    )


def shape(segments):
    return [(str(s.channel), s.kind.value, s.first_offset, s.last_offset) for s in segments]


def test_runs_split_at_channels_and_at_every_control_or_watermark_record():
    table = records(
        [
            (0, 0, b"{}", []),
            (0, 1, b"{}", []),
            (0, 2, b"", encode(Barrier(1, job="j"))),
            (0, 3, b"", watermark_headers(5, 0)),
            (0, 4, b"", watermark_headers(6, 0)),
            (0, 5, b"{}", []),
            (1, 0, b"{}", []),
        ]
    )
    assert shape(Segmenter([], 0, Lineage()).cut(table)) == [
        ("t:0", "data", 0, 1),
        ("t:0", "control", 2, 2),
        ("t:0", "watermark", 3, 3),
        ("t:0", "watermark", 4, 4),
        ("t:0", "data", 5, 5),
        ("t:1", "data", 0, 0),
    ]


def test_long_runs_are_cut_by_records_and_by_bytes_in_order():
    table = records([(0, i, b"x" * 10, []) for i in range(25)])
    by_records = Segmenter([], 0, Lineage(), max_records=10).cut(table)
    assert shape(by_records) == [("t:0", "data", 0, 9), ("t:0", "data", 10, 19), ("t:0", "data", 20, 24)]
    by_bytes = Segmenter([], 0, Lineage(), max_bytes=35).cut(table)
    assert [s.rows.num_rows for s in by_bytes] == [4, 4, 4, 4, 4, 4, 1]
    assert all(s.kind is SegmentKind.DATA and s.channel == ChannelId("t", 0) for s in by_bytes)
    assert Segmenter([], 0, Lineage()).cut(table.slice(0, 0)) == []


def test_rows_of_one_record_stay_in_one_segment():
    # a Spark stage's explode gives several rows the offset of one record: a run cut between
    # them would have the task take the rest for a retried batch's and drop it
    table = records([(0, o, b"", []) for o in (0, 0, 0, 1, 2, 2, 3)])
    assert shape(Segmenter([], 0, Lineage(), max_records=2).cut(table)) == [
        ("t:0", "data", 0, 0),
        ("t:0", "data", 1, 2),
        ("t:0", "data", 3, 3),
    ]
