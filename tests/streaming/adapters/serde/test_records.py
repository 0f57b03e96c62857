"""Kafka records as Arrow: header look-ups in bulk."""

from __future__ import annotations

import pyarrow as pa

from streaming.adapters.serde.records import header_values


def test_header_values_takes_the_named_header_of_each_row():
    headers = pa.array(
        [
            [{"key": "a", "value": b"1"}, {"key": "g", "value": b"7"}],
            [],
            [{"key": "g", "value": b"8"}, {"key": "g", "value": b"9"}],
            [{"key": "b", "value": b"2"}],
        ],
        pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())])),
    )
    table = pa.table({"headers": headers})
    assert header_values(table, "g").to_pylist() == [b"7", None, b"8", None]
    assert header_values(table, "zzz").to_pylist() == [None] * 4


def test_a_prepared_micro_batch_counts_the_records_it_stands_for():
    from streaming.adapters.serde.records import PART, RECORDS, Part, is_prepared, part_of, records_in

    parts = [Part.ROW, Part.ROW, Part.MARKER, Part.CONTROL, Part.REJECTED, Part.MARKER, Part.PARTIAL]
    prepared = pa.table(
        {
            "offset": pa.array([0, 0, 3, 4, 5, 6, 6], pa.int64()),
            PART: pa.array([int(p) for p in parts], pa.int8()),
            RECORDS: pa.array([None, None, 4, None, None, 2, None], pa.int64()),
        }
    )
    assert is_prepared(prepared) and not is_prepared(prepared.drop_columns([PART]))
    # the markers count every data record of their run (filtered and undecodable ones too), plus the control record
    assert records_in(prepared) == 4 + 2 + 1
    assert records_in(prepared.drop_columns([PART, RECORDS])) == 7  # Kafka records: one row each
    assert part_of(prepared, Part.ROW)["offset"].to_pylist() == [0, 0]
