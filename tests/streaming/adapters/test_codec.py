"""JSON values to Arrow and back; malformed records are named, never dropped."""

from __future__ import annotations

import json

import pyarrow as pa

from streaming.adapters.codec import decode, decode_records, encode, encode_batches

SCHEMA = pa.schema([("account", pa.string()), ("amount", pa.int64())])


def test_good_values_decode_in_bulk_and_round_trip():
    table = pa.table({"account": ["a", "b"], "amount": [5, -3]}, schema=SCHEMA)
    decoded = decode(encode(table), SCHEMA)
    assert decoded.table.equals(table) and decoded.index == [0, 1] and decoded.rejected == []


def test_missing_fields_are_null_and_extra_fields_ignored_with_a_schema():
    decoded = decode([b'{"account":"a"}', b'{"account":"b","amount":2,"note":"x"}'], SCHEMA)
    assert decoded.table.to_pylist() == [{"account": "a", "amount": None}, {"account": "b", "amount": 2}]


def test_each_malformed_record_is_rejected_with_its_reason():
    values = [
        b'{"account":"a","amount":1}',
        b"not json",
        None,
        b"[1,2]",
        b'{"account":"c","amount":"lots"}',
        b'{"account":"d",\n"amount":4}',
    ]
    decoded = decode(values, SCHEMA)
    assert decoded.index == [0, 5]
    assert decoded.table.to_pylist() == [{"account": "a", "amount": 1}, {"account": "d", "amount": 4}]
    reasons = dict(decoded.rejected)
    assert sorted(reasons) == [1, 2, 3, 4]
    assert "not JSON" in reasons[1] and "no value" in reasons[2]
    assert "not an object" in reasons[3] and "does not fit the schema" in reasons[4]


def test_without_a_schema_types_are_inferred():
    decoded = decode([b'{"k":"x","n":1}', b'{"k":"y","n":2}'])
    assert decoded.table.column("n").to_pylist() == [1, 2]
    assert decode([]).table.num_rows == 0


def _records(values, arrow_flags) -> pa.Table:
    headers = [[{"key": "abs.fmt", "value": b"arrow"}] if flag else [] for flag in arrow_flags]
    return pa.table(
        {
            "value": pa.array(values, pa.binary()),
            "headers": pa.array(headers, pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        }
    )


def test_arrow_batches_stay_below_the_size_limit_and_round_trip_in_order():
    table = pa.table({"k": [f"key-{i}" for i in range(50_000)], "n": list(range(50_000))})
    values = encode_batches(table, max_bytes=60_000)
    assert len(values) > 1 and all(len(v) <= 60_000 for v in values)
    decoded = decode_records(_records(values, [True] * len(values)))
    assert decoded.table.equals(table) and not decoded.rejected
    # every row knows the record it came from
    assert decoded.index[0] == 0 and decoded.index[-1] == len(values) - 1 and len(decoded.index) == 50_000


def test_json_and_arrow_records_decode_in_record_order_and_a_broken_batch_is_rejected():
    first = encode_batches(pa.table({"a": [1, 2]}))[0]
    last = encode_batches(pa.table({"a": [5]}))[0]
    records = _records([first, b'{"a": 3}', b'{"a": 4}', first[:20], last], [True, False, False, True, True])
    decoded = decode_records(records)
    assert decoded.table["a"].to_pylist() == [1, 2, 3, 4, 5]
    assert decoded.index == [0, 0, 1, 2, 4]
    assert [i for i, _ in decoded.rejected] == [3]
    assert "not a readable Arrow IPC stream" in decoded.rejected[0][1]


def test_json_rows_are_written_in_bulk_exactly_as_one_json_dumps_per_row():
    table = pa.table(
        {
            "s": ["x", None, 'quote " and\nnewline'],
            "n": [1, None, -3],
            "f": [1.5, 2.0, None],
            "b": [True, None, False],
        }
    )
    expected = [json.dumps(row, separators=(",", ":")).encode() for row in table.to_pylist()]
    assert encode(table) == expected
    assert encode(table.slice(0, 0)) == []
