"""Avro ingress values: the schema checked and mapped to Arrow columns,
values decoded with every one that is not a record of the schema rejected
with its reason (plain and in Confluent's wire format)."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest

from streaming.adapters.serde import avro, codec
from streaming.api.pipeline import Ingress
from streaming.errors import ConfigError

SCHEMA = {
    "type": "record",
    "name": "Reading",
    "fields": [
        {"name": "id", "type": "string"},
        {"name": "n", "type": "int"},
        {"name": "kind", "type": {"type": "enum", "name": "Kind", "symbols": ["a", "b"]}},
        {"name": "at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        {"name": "note", "type": ["null", "string"], "default": None},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
    ],
}
ROWS = [
    {"id": "r1", "n": 1, "kind": "a", "at": dt.datetime(2026, 1, 1, tzinfo=dt.UTC), "note": None, "tags": ["x"]},
    {"id": "r2", "n": -7, "kind": "b", "at": dt.datetime(2026, 1, 2, tzinfo=dt.UTC), "note": "hi", "tags": []},
]


def test_the_schema_maps_to_nullable_arrow_columns():
    schema = avro.avro_schema(json.dumps(SCHEMA), what="readings")
    assert schema.arrow == pa.schema(
        [
            ("id", pa.string()),
            ("n", pa.int32()),
            ("kind", pa.string()),
            ("at", pa.timestamp("ms", tz="UTC")),
            ("note", pa.string()),
            ("tags", pa.list_(pa.field("element", pa.string(), False))),
        ]
    )
    assert json.loads(schema.json) == SCHEMA
    assert schema.required == ("id", "n", "kind", "at", "tags")


@pytest.mark.parametrize("wire", [False, True])
def test_values_decode_to_rows_and_every_bad_value_is_rejected_with_its_reason(wire):
    schema = avro.avro_schema(SCHEMA, confluent_wire=wire, what="readings")
    good = avro.encode(ROWS, schema)
    # a byte after a record is not read (as Spark's from_avro): the last value decodes
    values = [good[0], b"", good[1][:-1], b"\x01\x00\x00\x00\x07garbage", good[1] + b"\x00"]
    decoded = codec.decode(pa.array(values, pa.binary()), schema)
    assert decoded.index == [0, 4]
    assert decoded.table.to_pylist() == [ROWS[0], ROWS[1]]
    reasons = dict(decoded.rejected)
    assert sorted(reasons) == [1, 2, 3]
    assert reasons[1] == "record has no value"
    assert "not an Avro record of the ingress schema" in reasons[2]
    if wire:
        assert good[0][:5] == b"\x00\x00\x00\x00\x01"
        assert "Confluent's wire header" in reasons[3]


def test_an_ingress_takes_its_columns_from_the_avro_schema():
    ingress = Ingress("readings", 2, avro=SCHEMA, event_time="at")
    assert ingress.schema == avro.avro_schema(SCHEMA, what="x").arrow
    assert ingress.avro.confluent_wire is False


@pytest.mark.parametrize(
    ("kwargs", "says"),
    [
        ({"avro": {"type": "string"}}, "must be a record"),
        ({"avro": "{not json"}, "is not JSON"),
        ({"avro": {"type": "record", "name": "R", "fields": [{"name": "x", "type": "nope"}]}}, "does not parse"),
        (
            {"avro": {"type": "record", "name": "R", "fields": [{"name": "x", "type": ["int", "string"]}]}},
            'only ["null", T]',
        ),
        ({"avro": SCHEMA, "schema": pa.schema([("id", pa.string())])}, "leave schema= out"),
        ({"confluent_wire": True}, "give the Avro schema too"),
    ],
)
def test_a_broken_avro_ingress_is_refused_with_what_to_do(kwargs, says):
    with pytest.raises(ConfigError, match="ingress readings") as caught:
        Ingress("readings", 1, **kwargs)
    assert says in str(caught.value)
