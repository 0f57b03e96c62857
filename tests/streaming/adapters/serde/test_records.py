"""Kafka records as Arrow: header look-ups in bulk, and headers read as
whole numbers whatever a writer put in them."""

from __future__ import annotations

import re

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

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


def test_whole_numbers_reads_what_the_engine_writes_and_marks_everything_else_malformed():
    from streaming.adapters.serde.records import whole_numbers

    given = [
        (b"12", 12),
        (None, None),  # absent: not malformed
        (b"-5", -5),
        (b"0007", 7),
        (b"9223372036854775807", 2**63 - 1),  # the end of input's watermark
        (b"-9223372036854775808", -(2**63)),
    ]
    malformed = [b"zz", b"", b" 1", b"1 ", b"1e3", b"--1", b"-", b"+1", b"\xff", b"9223372036854775808", b"9" * 5000]
    malformed += [b"-9223372036854775809", "\u0661".encode()]  # past int64; an Arabic-Indic digit one
    read = whole_numbers(pa.array([v for v, _ in given] + malformed, pa.binary()))
    assert read.values.to_pylist() == [n for _, n in given] + [None] * len(malformed)
    assert read.malformed.tolist() == [False] * len(given) + [True] * len(malformed)


@given(st.lists(st.one_of(st.none(), st.binary(max_size=24), st.integers().map(lambda n: str(n).encode()))))
@settings(max_examples=300, deadline=None)
def test_whole_numbers_never_raises_and_agrees_with_python_on_every_value(values):
    from streaming.adapters.serde.records import whole_numbers

    read = whole_numbers(pa.array(values, pa.binary()))
    for value, number, bad in zip(values, read.values.to_pylist(), read.malformed.tolist()):
        try:
            expected = int(value) if value is not None and re.fullmatch(rb"-?[0-9]+", value) else None
        except ValueError:
            expected = None
        if expected is not None and not -(2**63) <= expected < 2**63:
            expected = None
        assert number == expected, value
        assert bad == (value is not None and expected is None), value
