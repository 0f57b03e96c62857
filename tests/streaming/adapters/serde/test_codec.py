"""JSON values to Arrow and back; malformed records are named, never dropped;
Arrow batches read only on internal channels, each within a cap on its
decompressed bytes, and a record that does not decode rejects itself alone."""

from __future__ import annotations

import json
import resource

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from streaming.adapters.serde import arrow_ipc
from streaming.adapters.serde.codec import (
    ARROW_ON_INGRESS,
    ChannelReading,
    decode,
    decode_records,
    encode,
    encode_batches,
)

INTERNAL = ChannelReading.internal()

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


def test_a_binary_value_is_named_binary_with_its_first_bytes_not_a_text_encoding_error():
    avro = b"\x00\x00\x00\x00\x07\x02a\x04"  # Confluent's wire format: magic byte, schema id, then Avro
    utf16 = '{"account":"a"}'.encode("utf-16-le")  # zero bytes: json.loads would guess UTF-16
    decoded = decode([avro, utf16, b"\xff\xfe" + b"x" * 40], SCHEMA)
    reasons = dict(decoded.rejected)
    assert sorted(reasons) == [0, 1, 2] and decoded.index == []
    assert reasons[0] == (
        "value is binary, not JSON text: 8 bytes starting 00 00 00 00 07 02 61 04, not text at byte 0 (0x00); "
        "an ingress of Avro values takes avro=SCHEMA"
    )
    assert reasons[1].startswith("value is binary, not JSON text: 30 bytes starting 7b 00 22 00")
    assert reasons[2].startswith("value is binary, not JSON text: 42 bytes starting ff fe 78") and " ...," in reasons[2]
    assert "not text at byte 0 (0xff)" in reasons[2]
    # text that is not JSON is still said so, a stray control character too
    assert dict(decode([b"{\tnot json\n", b'{"account":"a\x01"}'], SCHEMA).rejected)[0].startswith("value is not JSON")
    assert dict(decode([b'{"account":"a\x01"}'], SCHEMA).rejected)[0].startswith("value is not JSON: ")


def test_a_byte_order_mark_before_json_is_read_in_bulk_and_record_by_record():
    marked = b'\xef\xbb\xbf{"account":"a","amount":1}'
    for values in ([marked], [marked, None]):  # a missing value makes the batch go record by record
        decoded = decode(values, SCHEMA)
        assert decoded.table.to_pylist()[0] == {"account": "a", "amount": 1}, values


def test_a_field_declared_not_null_is_required_in_bulk_and_record_by_record():
    schema = pa.schema([pa.field("account", pa.string(), nullable=False), pa.field("amount", pa.int64())])
    good, lacking, null = b'{"account":"a","amount":1}', b'{"amount":2}', b'{"account":null}'
    # one line each: the bulk reader; a value with a newline: record by record
    for values in ([good, lacking, null, good], [good, lacking, null, b'{"account":\n"b"}']):
        decoded = decode(values, schema)
        assert decoded.index == [0, 3] and decoded.table.column("account").null_count == 0
        assert dict(decoded.rejected) == {
            1: "value lacks required field(s) 'account': missing or null, and the schema declares them not null",
            2: "value lacks required field(s) 'account': missing or null, and the schema declares them not null",
        }
    assert decode([good, lacking], SCHEMA).index == [0, 1]  # nullable fields: a missing one is null


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
    decoded = decode_records(_records(values, [True] * len(values)), INTERNAL)
    assert decoded.table.equals(table) and not decoded.rejected
    # every row knows the record it came from
    assert decoded.index[0] == 0 and decoded.index[-1] == len(values) - 1 and len(decoded.index) == 50_000


def test_json_and_arrow_records_decode_in_record_order_and_a_broken_batch_is_rejected():
    first = encode_batches(pa.table({"a": [1, 2]}))[0]
    last = encode_batches(pa.table({"a": [5]}))[0]
    records = _records([first, b'{"a": 3}', b'{"a": 4}', first[:20], last], [True, False, False, True, True])
    decoded = decode_records(records, INTERNAL)
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


def test_an_arrow_batch_on_an_ingress_channel_is_rejected_not_read():
    """A producer of an ingress topic cannot hand the stage rows past its
    schema by marking a record ``abs.fmt: arrow`` (before: the batch's rows,
    extra column and all, were the stage's)."""
    forged = encode_batches(pa.table({"account": ["mallory"], "amount": [10**12], "admin": [True]}))[0]
    records = _records([b'{"account":"a","amount":1}', forged, b'{"account":"b","amount":2}'], [False, True, False])
    decoded = decode_records(records, ChannelReading.ingress(SCHEMA))
    assert decoded.table.schema == SCHEMA
    assert decoded.table.to_pylist() == [{"account": "a", "amount": 1}, {"account": "b", "amount": 2}]
    assert decoded.index == [0, 2] and decoded.rejected == [(1, ARROW_ON_INGRESS)]
    # the same record on an internal channel is a batch like any other
    assert decode_records(records.slice(1, 1), INTERNAL).table.column("admin").to_pylist() == [True]


def _bomb(batches: int = 50, rows: int = 1_000_000) -> bytes:
    """A stream of ``batches`` zstd batches of ``rows`` zeros: 22 KB that read to 400 MB."""
    schema = pa.schema([("x", pa.int64())])
    batch = pa.record_batch([pa.array(np.zeros(rows, np.int64))], schema=schema)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        for _ in range(batches):
            writer.write_batch(batch)
    return sink.getvalue().to_pybytes()


def test_a_decompression_bomb_is_rejected_from_its_metadata_without_being_decompressed():
    """Before: the 22 KB record was decoded to 400 MB (the process's peak
    memory grew by over 1 GB)."""
    bomb = _bomb()
    assert len(bomb) < 64_000 and arrow_ipc.decoded_bytes(bomb, 1 << 40) == 400_000_000
    good = encode_batches(pa.table({"x": [1, 2]}))[0]
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB
    decoded = decode_records(_records([good, bomb, good], [True] * 3), INTERNAL)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak < 64 << 10  # under 64 MiB more
    assert decoded.table["x"].to_pylist() == [1, 2, 1, 2] and decoded.index == [0, 0, 2, 2]
    ((index, reason),) = decoded.rejected
    assert index == 1 and "over the cap on decompressed bytes (max_decoded_bytes)" in reason
    assert f"over the cap of {64 << 20}" in reason
    # under a cap it is read
    smaller = _bomb(batches=2, rows=100_000)
    assert decode_records(_records([smaller], [True]), ChannelReading.internal(2 << 20)).table.num_rows == 200_000


def test_what_the_stages_write_stays_below_the_smallest_cap():
    table = pa.table({"x": pa.array(np.zeros(3_000_000, np.int64)), "y": pa.array(np.ones(3_000_000, np.int64))})
    values = encode_batches(table)
    assert len(values) > 1 and all(arrow_ipc.decoded_bytes(v, 1 << 40) <= 16 << 20 for v in values)
    decoded = decode_records(_records(values, [True] * len(values)), ChannelReading.internal(16 << 20))
    assert decoded.table.equals(table) and not decoded.rejected


def test_a_batch_of_conflicting_columns_rejects_itself_alone_and_the_rest_keep_their_order():
    """Before: one batch whose column had another type sent every record of
    the segment to the dead letters."""
    good = [encode_batches(pa.table({"a": [i, i + 1]}))[0] for i in range(0, 6, 2)]
    bad = encode_batches(pa.table({"a": ["x"]}))[0]
    records = _records([good[0], b'{"a": 100}', bad, good[1], good[2]], [True, False, True, True, True])
    decoded = decode_records(records, INTERNAL)
    assert decoded.table["a"].to_pylist() == [0, 1, 100, 2, 3, 4, 5]
    assert decoded.index == [0, 0, 1, 3, 3, 4, 4]
    ((index, reason),) = decoded.rejected
    assert index == 2 and "do not fit the other records' columns (a int64)" in reason and "string" in reason


def test_json_without_a_schema_rejects_only_the_record_of_another_type():
    """Before: one value of another type rejected the whole batch."""
    decoded = decode([b'{"a":1}', b'{"a":"x"}', b'{"a":2}', b'{"a":3}'])
    assert decoded.table["a"].to_pylist() == [1, 2, 3] and decoded.index == [0, 2, 3]
    assert [i for i, _ in decoded.rejected] == [1] and "disagree" in decoded.rejected[0][1]


def test_json_nested_past_the_recursion_limit_is_rejected_not_raised():
    """Before: a RecursionError escaped the decoder and failed the task (and
    the task of every restore after it)."""
    decoded = decode([b'{"account":"a","amount":1}', b"[" * 100_000, b'{"a":' * 100_000], SCHEMA)
    assert decoded.index == [0] and [i for i, _ in decoded.rejected] == [1, 2]
    assert all("nested deeper" in reason for _, reason in decoded.rejected)


@pytest.mark.parametrize("seed", range(3))
def test_any_error_reading_a_damaged_batch_rejects_that_record(seed):
    """Bytes of a batch flipped at random raise all kinds of errors
    (ArrowNotImplementedError, ArrowMemoryError, OSError, ArrowInvalid;
    before, any but the last two escaped and failed the task): each is that
    record's reason, and the good records around it decode."""
    rng = np.random.default_rng(seed)
    good = encode_batches(pa.table({"a": list(range(100)), "s": [str(i) for i in range(100)]}))[0]
    damaged = []
    for _ in range(200):
        value = bytearray(good)
        for place in rng.integers(0, len(value), rng.integers(1, 5)):
            value[place] = int(rng.integers(0, 256))
        damaged.append(bytes(value))
    values = [good, *damaged, good]
    decoded = decode_records(_records(values, [True] * len(values)), INTERNAL)
    rejected = {i for i, _ in decoded.rejected}
    assert 0 not in rejected and len(values) - 1 not in rejected
    assert len(set(decoded.index)) + len(rejected) == len(values)
    # every accepted record is a row (records of no field at all make a table of no column, and no row)
    assert decoded.table.num_rows == len(decoded.index) or decoded.table.num_columns == 0


@pytest.mark.parametrize("schema", [None, pa.schema([("user", pa.string()), ("price", pa.int64())])])
def test_json_values_that_are_no_object_are_rejected_and_never_reach_the_bulk_reader(schema):
    # pyarrow 26's JSON reader ends the process (a segmentation fault) on a lone null document,
    # and reads one among objects as a row of nulls
    for values in ([b"null"], [b'{"user": "a"}', b"null", b'{"user": "b"}'], [b'{"user": "a"} null']):
        decoded = decode(values, schema)
        objects = [i for i, v in enumerate(values) if v.startswith(b"{") and v.endswith(b"}")]
        assert decoded.index == objects
        assert [i for i, _ in decoded.rejected] == [i for i in range(len(values)) if i not in objects]


def test_a_list_with_leading_nulls_is_read_right_without_a_schema_too():
    # pyarrow 26 infers [null, 1] as offsets past its values, a table that does not validate
    for values in ([b'{"a": [null, 1]}'], [b'{"a": [1]}', b'{"a": [null, null, 2]}']):
        decoded = decode(values)
        decoded.table.validate(full=True)
        assert decoded.table.to_pylist() == [json.loads(v) for v in values] and decoded.rejected == []


_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False), st.text(max_size=4)),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=3), inner, max_size=3)),
    max_leaves=10,
)


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.dictionaries(st.sampled_from("abc"), _JSON, max_size=3).map(lambda d: json.dumps(d).encode()), max_size=6
    )
)
def test_whatever_json_objects_come_the_table_read_without_a_schema_is_valid_and_holds_each_accepted_one(values):
    decoded = decode(values)
    decoded.table.validate(full=True)
    assert sorted(decoded.index + [i for i, _ in decoded.rejected]) == list(range(len(values)))
    # every accepted record is a row (records of no field at all make a table of no column, and no row)
    assert decoded.table.num_rows == len(decoded.index) or decoded.table.num_columns == 0


def test_without_a_schema_a_first_record_of_no_field_loses_no_other_records_fields():
    # read record by record (the list with leading nulls sends the batch there): pyarrow's from_pylist
    # names the columns after the first row alone, and a first {} made a table of no row
    decoded = decode([b"{}", b'{"a": [null, 1]}', b'{"b": "x"}'])
    assert decoded.table.to_pylist() == [
        {"a": None, "b": None},
        {"a": [None, 1], "b": None},
        {"a": None, "b": "x"},
    ]
    assert decoded.index == [0, 1, 2]
