"""Cutting micro-batches into segments: runs per channel and kind, single
control and watermark records, and long runs cut by records and by bytes."""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from barriers.lineage import Lineage
from barriers.messages import UNSIGNED, Barrier, ChannelId, encode
from streaming.engine.task.segments import Segmenter, SegmentKind, SegmentPace
from streaming.engine.task.watermarks import watermark_headers

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
            (0, 2, b"", encode(Barrier(1, job="j"), key=UNSIGNED)),
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


def test_a_split_never_cuts_a_record_and_keeps_every_row():
    rows = records([(0, o, b"{}", []) for o in (0, 1, 1, 1, 2, 3)])
    (run,) = Segmenter([], 0, Lineage()).cut(rows)
    head, rest = run.split(2)
    assert (head.first_offset, head.last_offset, head.rows.num_rows) == (0, 1, 4)
    assert (rest.first_offset, rest.last_offset, rest.rows.num_rows) == (2, 3, 2)
    assert run.split(6) == (run, None)
    assert run.split(3)[1].first_offset == 2  # rows of offset 1 go together


def test_the_pace_sizes_runs_to_the_budget_from_the_cost_per_record():
    pace = SegmentPace(0.040, 50_000, first_records=1_000)
    assert pace.limit == 1_000
    pace.observe(1_000, 10.0)  # 10 ms per record
    assert pace.limit == 4
    for n in (4, 4, 2, 4):
        pace.observe(n, 0.010 * n)
    assert pace.limit == 4
    for _ in range(16):  # a fast operator: 1 µs per record, capped at max_records
        pace.observe(pace.limit, 1e-6 * pace.limit)
    assert pace.limit == 40_000
    pace.observe(40_000, 0.0)
    assert pace.limit == 50_000


def test_the_pace_does_not_cut_runs_below_what_a_fixed_cost_per_call_makes_worth_it():
    """An operator that costs 100 ms per call plus 10 µs per record: runs of
    one record would meet no budget and lose all throughput."""
    pace = SegmentPace(0.040, 50_000, first_records=1_000)
    cost = lambda n: 0.100 + 1e-5 * n  # noqa: E731
    for _ in range(20):
        pace.observe(pace.limit, cost(pace.limit))
    fixed, per_record = pace.fit()
    assert abs(fixed - 0.100) < 1e-6 and abs(per_record - 1e-5) < 1e-9
    assert pace.limit == 30_000  # runs of 4 × 100 ms, 3/4 of them records


def test_the_pace_finds_a_fixed_cost_through_noise_even_from_runs_of_one_record():
    """Runs of one record all alike cannot tell a fixed cost from a cost per
    record, and noise can make a larger run look no slower: the pace tries
    larger runs until the fit sees the fixed cost."""
    noise = np.random.default_rng(7)
    pace = SegmentPace(0.040, 50_000, first_records=1)
    sizes = []
    for _ in range(60):
        sizes.append(pace.limit)
        pace.observe(pace.limit, (0.100 + 1e-5 * pace.limit) * noise.uniform(0.9, 1.1))
    assert sizes[0] == 1 and min(sizes[-10:]) > 10_000, sizes


def test_a_record_whose_number_headers_are_unreadable_is_a_rejected_segment_of_its_own_in_every_generation():
    """``abs.wm`` and ``abs.gen`` are read as numbers: a record (data or
    watermark) where a writer put anything else is a REJECTED segment of its
    own, with the reason; the records around it stay one run.  The decision
    does not depend on the task's generation, so a replay after a restore
    rejects the same records."""
    rows = records(
        [
            (0, 0, b"a", [("abs.gen", b"0")]),
            (0, 1, b"b", [("abs.wm", b"zz")]),
            (0, 2, b"c", [("abs.gen", b"zz")]),
            (0, 3, b"d", []),
            (0, 4, b"", [("abs.kind", b"watermark"), ("abs.wm", b"9" * 30)]),
            (0, 5, b"e", [("abs.gen", b"1"), ("abs.wm", b"-7")]),
        ]
    )
    for generation in (0, 3):
        segments = Segmenter(["t"], generation, Lineage()).cut(rows)
        assert shape(segments) == [
            ("t:0", "data", 0, 0),
            ("t:0", "rejected", 1, 1),
            ("t:0", "rejected", 2, 2),
            ("t:0", "data", 3, 3),
            ("t:0", "rejected", 4, 4),
            ("t:0", "data", 5, 5),
        ], generation
        reasons = [s.reason for s in segments]
        assert reasons[1] == "header abs.wm is b'zz', not a whole number (decimal digits of a signed 64-bit integer)"
        assert reasons[2].startswith("header abs.gen is b'zz'")
        assert reasons[4].startswith("header abs.wm is b'9999") and "(30 bytes)" not in reasons[4]
        assert [r for i, r in enumerate(reasons) if i not in (1, 2, 4)] == ["", "", ""]


def test_a_barrier_with_an_unreadable_number_header_is_left_to_the_barrier_checks():
    barrier = encode(Barrier(1, job="j"), key=UNSIGNED) + [("abs.wm", b"zz")]
    (segment,) = Segmenter([], 0, Lineage()).cut(records([(0, 0, b"", barrier)]))
    assert segment.kind is SegmentKind.CONTROL and segment.reason == ""


def test_records_an_operator_named_to_skip_are_dead_letters_and_barriers_among_them_stay():
    table = records([(0, o, b"{}", []) for o in range(4)] + [(0, 4, b"", encode(Barrier(1, job="j"), key=UNSIGNED))])
    table = pa.concat_tables([table, records([(0, 5, b"{}", []), (1, 2, b"{}", [])])])
    segmenter = Segmenter([], 0, Lineage(), skip=[(ChannelId("t", 0), 2, 5), (ChannelId("other", 0), 0, 9)])
    cut = segmenter.cut(table)
    assert shape(cut) == [
        ("t:0", "data", 0, 1),
        ("t:0", "rejected", 2, 2),
        ("t:0", "rejected", 3, 3),
        ("t:0", "control", 4, 4),
        ("t:0", "rejected", 5, 5),
        ("t:1", "data", 2, 2),
    ]
    assert cut[1].reason == "skipped at a restore: t:0 offsets 2..5 (--skip-records)"


def test_a_watermark_record_a_stage_of_spark_code_hands_over_is_read_here_and_a_bad_one_rejected():
    kind = ("abs.kind", b"watermark")
    table = records([(0, 0, b"", watermark_headers(5, 0)), (0, 1, b"", [kind, ("abs.wm", b"zz")])])
    prepared = table.append_column("_abs_part", pa.array([3, 3], pa.int8()))  # Part.CONTROL: as they came
    cut = Segmenter([], 0, Lineage()).cut(prepared)
    assert [s.kind.value for s in cut] == ["watermark", "rejected"]
    assert cut[1].reason.startswith("header abs.wm is b'zz'")  # before: read as no watermark, silently
