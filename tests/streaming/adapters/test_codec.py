"""JSON values to Arrow and back; malformed records are named, never dropped."""

from __future__ import annotations

import pyarrow as pa

from streaming.adapters.codec import decode, encode

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
