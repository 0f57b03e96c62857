"""Kafka records as Arrow: header look-ups in bulk."""

from __future__ import annotations

import pyarrow as pa

from streaming.adapters.records import header_values


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
