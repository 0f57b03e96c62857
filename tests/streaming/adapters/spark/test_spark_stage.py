"""A stage's Spark code on a real Spark session: what each micro-batch
becomes before it reaches Python (rows that keep the record they came
from, undecodable records with their reason, control records as they came,
one marker per run), and code that cannot keep positions refused at start."""

from __future__ import annotations

import datetime as dt
import json

import pyarrow as pa
import pytest
from pyspark.sql import functions as F

from barriers.headers import FORMAT_HEADER, GENERATION_HEADER
from barriers.lineage import Lineage
from barriers.messages import UNSIGNED, Barrier, ChannelId, encode
from operators import KeyedAggregate, count, max_, sum_
from streaming.adapters.serde import avro
from streaming.adapters.serde.codec import ARROW_FORMAT
from streaming.adapters.serde.records import (
    EVENT_TIME,
    PARTIAL,
    REASON,
    RECORD_SCHEMA,
    RECORDS,
    ROW,
    Part,
    part_of,
    records_in,
)
from streaming.adapters.spark.decoding import StageRows
from streaming.adapters.spark.stage import POSITION, SparkStage, spark_stages
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.errors import ChannelQueryError, ConfigError

pytestmark = pytest.mark.integration

SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("ts", pa.int64()), ("tags", pa.list_(pa.string()))])
INGRESS = Ingress("clicks", 2, SCHEMA, event_time="ts", max_out_of_orderness=1_000)


def _stage(code) -> Stage:
    return Stage("clean", ("clicks",), spark=code)


def _records(*rows) -> pa.Table:
    """(partition, offset, value: dict (JSON) | bytes | None | Barrier)."""
    out = []
    for partition, offset, value in rows:
        headers = []
        if isinstance(value, Barrier):
            headers, value = encode(value, key=UNSIGNED), b""
        elif isinstance(value, dict):
            value = json.dumps(value).encode()
        out.append(
            {
                "topic": "clicks",
                "partition": partition,
                "offset": offset,
                "key": None,
                "value": value,
                "headers": [{"key": k, "value": v} for k, v in headers],
                "timestamp": None,
            }
        )
    return pa.Table.from_pylist(out, schema=RECORD_SCHEMA)


def _markers(prepared: pa.Table) -> list[tuple]:
    """Each marker of a prepared micro-batch: (partition, offset, records, highest event time)."""
    markers = part_of(prepared, Part.MARKER)
    columns = ("partition", "offset", RECORDS, EVENT_TIME)
    return list(zip(*(markers[name].to_pylist() for name in columns)))


def _sorted(table: pa.Table) -> pa.Table:
    return table.sort_by([("partition", "ascending"), ("offset", "ascending"), ("_abs_part", "ascending")])


def test_a_record_without_a_field_declared_not_null_is_rejected_naming_it_as_python_does(spark):
    from streaming.adapters.serde import codec

    required = pa.schema([pa.field("user", pa.string(), nullable=False), ("amount", pa.int64()), ("ts", pa.int64())])
    stage = SparkStage(spark, _stage("SELECT _position, user, amount FROM {input}"), Ingress("clicks", 2, required))
    values = [{"user": "a", "amount": 1, "ts": 1}, {"amount": 2, "ts": 2}, {"user": None, "ts": 3}, {"user": "d"}]
    prepared = _sorted(stage.records(_records(*((0, i, v) for i, v in enumerate(values)))))
    rows = part_of(prepared, Part.ROW)
    assert list(zip(rows["offset"].to_pylist(), rows[ROW].to_pylist())) == [
        (0, {"user": "a", "amount": 1}),
        (3, {"user": "d", "amount": None}),  # only user is required
    ]
    rejected = part_of(prepared, Part.REJECTED)
    reasons = dict(zip(rejected["offset"].to_pylist(), rejected[REASON].to_pylist()))
    assert reasons == {
        1: "value lacks required field(s) 'user': missing or null, and the schema declares them not null",
        2: "value lacks required field(s) 'user': missing or null, and the schema declares them not null",
    }
    # the same records decoded in Python: the same rows and reasons
    python = codec.decode([json.dumps(v).encode() for v in values], required)
    assert python.index == [0, 3] and dict(python.rejected) == reasons


def test_spark_decodes_runs_the_code_and_keeps_the_record_of_every_row(spark):
    def code(df):
        return df.filter(F.col("amount") > 0).select(
            POSITION, "user", F.explode("tags").alias("tag"), (F.col("amount") * 2).alias("doubled")
        )

    stage = SparkStage(spark, _stage(code), INGRESS)
    assert stage.columns == ["user", "tag", "doubled"]
    prepared = _sorted(
        stage.records(
            _records(
                (0, 0, {"user": "a", "amount": 5, "ts": 1_000, "tags": ["x", "y"]}),
                (0, 1, b"not json"),
                (0, 2, {"user": "b", "amount": -1, "ts": 9_000, "tags": ["z"]}),  # filtered out
                (0, 3, {"user": "c", "amount": "lots", "ts": 2_000, "tags": []}),
                (0, 4, Barrier(1, job="job")),
                (0, 5, {"user": "d", "amount": 3, "ts": 3_000, "tags": ["q"]}),
                (1, 0, None),
                (1, 1, {"user": "b", "amount": -4, "ts": 4_000, "tags": ["q"]}),  # filtered out
            )
        )
    )
    rows = part_of(prepared, Part.ROW)
    assert list(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows[ROW].to_pylist())) == [
        (0, 0, {"user": "a", "tag": "x", "doubled": 10}),
        (0, 0, {"user": "a", "tag": "y", "doubled": 10}),
        (0, 5, {"user": "d", "tag": "q", "doubled": 6}),
    ]
    rejected = part_of(prepared, Part.REJECTED)
    reasons = dict(
        zip(zip(rejected["partition"].to_pylist(), rejected["offset"].to_pylist()), rejected[REASON].to_pylist())
    )
    assert set(reasons) == {(0, 1), (0, 3), (1, 0)}
    assert reasons[(0, 1)].startswith("value is not JSON")
    assert reasons[(0, 3)].startswith("value does not fit the schema")
    assert reasons[(1, 0)] == "record has no value"
    assert rejected["value"].to_pylist()[0] == b"not json"  # the raw record, for the dead letters
    control = part_of(prepared, Part.CONTROL)
    assert control["offset"].to_pylist() == [4] and control["headers"][0].as_py()
    # a run per channel and barrier: its last offset, its records (filtered and undecodable
    # ones too) and its highest event time (of records the code filtered out too)
    assert _markers(prepared) == [(0, 3, 4, 9_000), (0, 5, 1, 3_000), (1, 1, 2, 4_000)]


def test_sql_over_the_input_view(spark):
    stage = SparkStage(spark, _stage("SELECT _position, upper(user) AS who FROM {input} WHERE amount > 2"), INGRESS)
    prepared = stage.records(
        _records((0, 7, {"user": "a", "amount": 5, "ts": 1}), (0, 8, {"user": "b", "amount": 1, "ts": 2}))
    )
    rows = part_of(prepared, Part.ROW)
    assert rows["offset"].to_pylist() == [7] and rows[ROW].to_pylist() == [{"who": "A"}]
    # no control record, none undecodable: the record columns are there all the same
    assert set(RECORD_SCHEMA.names) <= set(prepared.column_names)


@pytest.mark.parametrize("wire", [False, True])
def test_avro_values_are_decoded_by_spark_and_bad_ones_rejected_with_the_reason(spark, wire):
    schema = {
        "type": "record",
        "name": "Click",
        "fields": [
            {"name": "user", "type": "string"},
            {"name": "amount", "type": ["null", "long"]},
            {"name": "ts", "type": {"type": "long", "logicalType": "timestamp-millis"}},
        ],
    }
    ingress = Ingress("clicks", 2, avro=schema, confluent_wire=wire, event_time="ts")
    good = avro.encode(
        [
            {"user": "a", "amount": 5, "ts": dt.datetime(2026, 1, 1, 0, 0, 1, tzinfo=dt.UTC)},
            {"user": "b", "amount": None, "ts": dt.datetime(2026, 1, 1, 0, 0, 2, tzinfo=dt.UTC)},
        ],
        ingress.avro,
    )
    stage = SparkStage(spark, _stage("SELECT _position, user, amount FROM {input}"), ingress)
    prepared = _sorted(stage.records(_records((0, 0, good[0]), (0, 1, b"\x00\x01"), (1, 0, good[1]))))
    rows = part_of(prepared, Part.ROW)
    assert list(zip(rows["partition"].to_pylist(), rows[ROW].to_pylist())) == [
        (0, {"user": "a", "amount": 5}),
        (1, {"user": "b", "amount": None}),
    ]
    rejected = part_of(prepared, Part.REJECTED)
    assert rejected["offset"].to_pylist() == [1] and rejected["value"].to_pylist() == [b"\x00\x01"]
    said = rejected[REASON][0].as_py()
    assert ("Confluent's wire header" if wire else "not an Avro record of the ingress schema") in said
    markers = part_of(prepared, Part.MARKER)
    # the event time of the records Spark decoded, in milliseconds
    assert markers[EVENT_TIME].to_pylist() == [1_767_225_601_000, 1_767_225_602_000]


@pytest.mark.parametrize(
    ("code", "says"),
    [
        (lambda df: df.groupBy("user").count(), "must keep _position"),
        (lambda df: df.select("user"), "must keep _position"),
        (lambda df: df.groupBy(POSITION, "user").count(), "Aggregate: an aggregation combines records"),
        (lambda df: df.dropDuplicates(["user"]), "Deduplicate"),
        ("SELECT _position, user FROM {input} LIMIT 3", "a limit depends on how records fall into micro-batches"),
        ("SELECT _position, row_number() OVER (PARTITION BY user ORDER BY ts) AS n FROM {input}", "Window"),
        ("SELECT _position, nope FROM {input}", "failed on its input"),
        (lambda df: 5, "returned int, not a DataFrame"),
    ],
)
def test_code_that_cannot_keep_positions_is_refused_at_start_with_the_reason(spark, code, says):
    with pytest.raises(ConfigError, match="stage clean") as refused:
        SparkStage(spark, _stage(code), INGRESS)
    assert says in str(refused.value)


def test_an_event_time_column_spark_cannot_read_as_time_is_refused(spark):
    ingress = Ingress("clicks", 1, pa.schema([("user", pa.string()), ("ts", pa.string())]), event_time="ts")
    with pytest.raises(ConfigError, match="timestamp or whole milliseconds"):
        SparkStage(spark, _stage(lambda df: df), ingress)


def test_a_keyed_aggregate_after_the_code_gets_partials_per_key_and_run_at_the_run_end(spark):
    stage = Stage(
        "totals",
        ("clicks",),
        lambda: KeyedAggregate("user", {"n": count(), "total": sum_("amount"), "top": max_("amount")}),
        spark="SELECT _position, user, amount FROM {input} WHERE amount > 0",
    )
    code = SparkStage(spark, stage, INGRESS)
    prepared = _sorted(
        code.records(
            _records(
                (0, 0, {"user": "a", "amount": 5, "ts": 1}),
                (0, 1, {"user": "b", "amount": 1, "ts": 2}),
                (0, 2, {"user": "a", "amount": 7, "ts": 3}),
                (0, 3, {"user": None, "amount": 2, "ts": 4}),  # a null key: a row, for the dead letters
                (0, 4, {"user": "b", "amount": -1, "ts": 5}),  # filtered out: the run ends here all the same
                (0, 5, Barrier(1, job="job")),
                (0, 6, {"user": "a", "amount": 1, "ts": 6}),
            )
        )
    )
    partials = part_of(prepared, Part.PARTIAL)
    got = sorted(zip(partials["offset"].to_pylist(), partials[PARTIAL].to_pylist()), key=lambda r: (r[0], r[1]["user"]))
    assert got == [
        (4, {"user": "a", "n": 2, "total": 12, "top": 7}),
        (4, {"user": "b", "n": 1, "total": 1, "top": 1}),
        (6, {"user": "a", "n": 1, "total": 1, "top": 1}),
    ]
    rows = part_of(prepared, Part.ROW)
    # every row of a run at its end: the task takes the run whole
    assert rows["offset"].to_pylist() == [4] and rows[ROW].to_pylist() == [{"user": None, "amount": 2}]
    # what crosses to Python: one row per key and run, not one per record
    assert prepared.num_rows == 3 + 1 + 2 + 1  # partials, the null key's row, a marker per run, the barrier


def test_runs_are_numbered_per_channel_and_a_run_without_data_records_has_no_marker(spark):
    code = SparkStage(spark, _stage("SELECT _position, user FROM {input}"), INGRESS)
    prepared = _sorted(
        code.records(
            _records(
                (0, 0, {"user": "a", "amount": 1, "ts": 10}),
                (0, 1, Barrier(1, job="job")),
                (0, 2, Barrier(2, job="job")),  # two control records in a row: no run between them
                (0, 3, {"user": "b", "amount": 1, "ts": 30}),
                (1, 7, {"user": "c", "amount": 1, "ts": 20}),
                (1, 8, {"user": "d", "amount": 1, "ts": 5}),
            )
        )
    )
    assert _markers(prepared) == [(0, 0, 1, 10), (0, 3, 1, 30), (1, 8, 2, 20)]
    assert part_of(prepared, Part.CONTROL)["offset"].to_pylist() == [1, 2]


def test_records_the_code_raises_on_are_set_aside_and_the_rest_is_prepared_without_them(spark):
    assert spark.conf.get("spark.sql.ansi.enabled") == "true"  # Spark's default: 100 DIV 0 raises
    stage = SparkStage(spark, _stage("SELECT _position, user, 100 DIV amount AS share FROM {input}"), INGRESS)
    records = _records(
        (0, 0, {"user": "a", "amount": 5, "ts": 1}),
        (0, 1, {"user": "b", "amount": 0, "ts": 2}),
        (0, 2, {"user": "c", "amount": 2, "ts": 3}),
        (0, 3, Barrier(1, job="job")),
        (0, 4, {"user": "d", "amount": 4, "ts": 4}),
        (0, 5, {"user": "e", "amount": 0, "ts": 5}),
        (1, 0, {"user": "f", "amount": 50, "ts": 6}),
    )
    prepared = _sorted(stage(spark.createDataFrame(records).coalesce(1)))
    raised = part_of(prepared, Part.RAISED)
    assert list(zip(raised["partition"].to_pylist(), raised["offset"].to_pylist())) == [(0, 1), (0, 5)]
    assert all(
        r.startswith("stage clean's Spark code raised") and "DIVIDE_BY_ZERO" in r for r in raised[REASON].to_pylist()
    )
    assert json.loads(raised["value"][0].as_py()) == {"user": "b", "amount": 0, "ts": 2}  # the record as it came
    rows = part_of(prepared, Part.ROW)
    assert [(row["user"], row["share"]) for row in rows[ROW].to_pylist()] == [("a", 20), ("c", 50), ("d", 25), ("f", 2)]
    assert part_of(prepared, Part.CONTROL)["offset"].to_pylist() == [3]
    # every data record counted once: in a marker's run, or set aside
    assert sum(records for _, _, records, _ in _markers(prepared)) + raised.num_rows == 6
    assert records_in(prepared) == 7


def test_an_ingress_record_whose_abs_wm_or_abs_gen_is_no_whole_number_is_rejected_by_spark_as_by_python(spark):
    stage = SparkStage(spark, _stage("SELECT _position, user FROM {input} WHERE amount > 0"), INGRESS)
    good = json.dumps({"user": "a", "amount": 5, "ts": 1}).encode()
    records = _records((0, 0, good), (0, 1, good), (0, 2, good), (0, 3, good)).to_pylist()
    records[1]["headers"] = [{"key": "abs.wm", "value": b"zz"}]
    records[2]["headers"] = [{"key": "abs.gen", "value": b"9" * 30}]
    records[3]["headers"] = [{"key": "abs.wm", "value": b"-42"}]  # a whole number: read
    prepared = _sorted(stage.records(pa.Table.from_pylist(records, schema=RECORD_SCHEMA)))
    rejected = part_of(prepared, Part.REJECTED)
    assert dict(zip(rejected["offset"].to_pylist(), rejected[REASON].to_pylist())) == {
        1: "header abs.wm is b'zz', not a whole number (decimal digits of a signed 64-bit integer)",
        2: f"header abs.gen is {b'9' * 30!r}, not a whole number (decimal digits of a signed 64-bit integer)",
    }
    assert part_of(prepared, Part.ROW)["offset"].to_pylist() == [0, 3]


def test_a_channel_read_out_of_offset_order_fails_the_micro_batch_with_the_reason(spark):
    code = SparkStage(spark, _stage("SELECT _position, user FROM {input}"), INGRESS)
    records = _records((0, 5, {"user": "a", "amount": 1, "ts": 1}), (0, 4, {"user": "b", "amount": 1, "ts": 1}))
    with pytest.raises(Exception, match="clicks/0 came out of offset order"):
        code(spark.createDataFrame(records).coalesce(1))


def test_a_channel_read_in_two_partitions_fails_the_micro_batch_with_the_reason(spark):
    code = SparkStage(spark, _stage("SELECT _position, user FROM {input}"), INGRESS)
    records = _records(*((0, offset, {"user": "a", "amount": 1, "ts": 1}) for offset in range(4, 8)))
    # round robin: offsets 4 and 6 in one partition, 5 and 7 in the other, each in order
    with pytest.raises(ChannelQueryError, match="read a channel in more than one partition"):
        code(spark.createDataFrame(records).coalesce(1).repartition(2))


ROWS_SCHEMA = pa.schema([("user", pa.string()), ("amount", pa.int64()), ("at", pa.timestamp("us", tz="UTC"))])


def _arrow_records(*rows) -> pa.Table:
    """(partition, offset, value: a table | bytes | Barrier[, the generation that wrote it]) on a
    stage's output topic."""
    out = []
    for partition, offset, value, *written in rows:
        headers = [{"key": FORMAT_HEADER, "value": ARROW_FORMAT}]
        headers += [{"key": GENERATION_HEADER, "value": str(g).encode()} for g in written]
        if isinstance(value, Barrier):
            headers, value = [{"key": k, "value": v} for k, v in encode(value, key=UNSIGNED)], b""
        elif isinstance(value, pa.Table):
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, value.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
                writer.write_table(value)  # as a stage writes its rows (codec.encode_batches)
            value = sink.getvalue().to_pybytes()
        out.append(
            {
                "topic": "job.clean",
                "partition": partition,
                "offset": offset,
                "key": None,
                "value": value,
                "headers": headers,
                "timestamp": None,
            }
        )
    return pa.Table.from_pylist(out, schema=RECORD_SCHEMA)


def test_rows_of_another_stages_batch_the_code_raises_on_are_set_aside_alone_and_the_rest_go_on(spark):
    after = Stage("after", ("clean",), spark="SELECT _position, user, 100 DIV amount AS share FROM {input}")
    code = SparkStage(spark, after, StageRows(("clean",), ROWS_SCHEMA, 1 << 20))
    three = pa.table({"user": ["a", "b", "c"], "amount": [5, 0, 4], "at": [None] * 3}, schema=ROWS_SCHEMA)
    one = pa.table({"user": ["d"], "amount": [50], "at": [None]}, schema=ROWS_SCHEMA)
    records = _arrow_records((0, 0, three), (0, 1, one))
    prepared = _sorted(code(spark.createDataFrame(records).coalesce(1)))
    rows = part_of(prepared, Part.ROW)
    assert list(zip(rows["offset"].to_pylist(), rows[ROW].to_pylist())) == [
        (0, {"user": "a", "share": 20}),
        (0, {"user": "c", "share": 25}),
        (1, {"user": "d", "share": 2}),
    ]
    [raised] = part_of(prepared, Part.RAISED).to_pylist()
    assert raised["offset"] == 0 and "DIVIDE_BY_ZERO" in raised[REASON]
    # the row alone, as an Arrow batch of its own: the task sends it as the ingress record it names
    assert pa.ipc.open_stream(raised["value"]).read_all().to_pylist() == [{"user": "b", "amount": 0, "at": None}]


def test_spark_code_after_a_stage_reads_its_arrow_batches_and_names_those_it_cannot_read(spark):
    after = Stage("after", ("clean",), spark="SELECT _position, user, amount * 2 AS doubled, at FROM {input}")
    code = SparkStage(spark, after, StageRows(("clean",), ROWS_SCHEMA, 1 << 20))
    when = dt.datetime(2026, 1, 1, 12, tzinfo=dt.UTC)
    two = pa.table({"user": ["a", "b"], "amount": [1, 2], "at": [when, None]}, schema=ROWS_SCHEMA)
    in_millis = pa.table(
        {"amount": pa.array([5], pa.int64()), "user": ["c"], "at": pa.array([when], pa.timestamp("ms"))}
    )  # columns in another order, time in another unit
    no_amount = pa.table({"user": ["d"], "at": pa.array([when], pa.timestamp("us", tz="UTC"))})
    prepared = _sorted(
        code.records(
            _arrow_records(
                (0, 0, two),
                (0, 1, Barrier(1, job="job")),
                (0, 2, b"not an arrow stream"),
                (0, 3, in_millis),
                (0, 4, no_amount),
                (0, 5, two.slice(0, 0)),  # a batch of no rows: a record all the same
            )
        )
    )
    rows = part_of(prepared, Part.ROW)
    assert list(zip(rows["offset"].to_pylist(), rows[ROW].to_pylist())) == [
        (0, {"user": "a", "doubled": 2, "at": when}),
        (0, {"user": "b", "doubled": 4, "at": None}),
        (3, {"user": "c", "doubled": 10, "at": when}),
    ]
    rejected = part_of(prepared, Part.REJECTED)
    reasons = dict(zip(rejected["offset"].to_pylist(), rejected[REASON].to_pylist()))
    assert set(reasons) == {2, 4}
    assert "not a readable Arrow IPC stream" in reasons[2]
    assert "no column amount int64" in reasons[4]
    assert part_of(prepared, Part.CONTROL)["offset"].to_pylist() == [1]
    markers = part_of(prepared, Part.MARKER)
    assert list(zip(markers["offset"].to_pylist(), markers[RECORDS].to_pylist())) == [(0, 1), (5, 4)]


def test_what_a_failed_generation_wrote_after_the_restored_barrier_counts_and_gives_no_rows(spark):
    after = Stage("after", ("clean",), spark="SELECT _position, user FROM {input}")
    code = SparkStage(spark, after, StageRows(("clean",), ROWS_SCHEMA, 1 << 20))
    one = lambda user: pa.table({"user": [user], "amount": [1], "at": [None]}, schema=ROWS_SCHEMA)  # noqa: E731
    # generation 1 restored partition 0 at offset 2 and partition 1 not at all (from its start)
    restored = Lineage().after_restore(1, {ChannelId("job.clean", 0): 2})
    code.skip_stale({ChannelId("job.clean", p): restored for p in (0, 1)})
    prepared = _sorted(
        code.records(
            _arrow_records(
                (0, 0, one("kept: before the barrier"), 0),
                (0, 1, one("kept: before the barrier"), 0),
                (0, 2, one("stale"), 0),
                (0, 3, one("kept: written again"), 1),
                (0, 4, one("stale"), 0),  # a failed generation's record may come after the new one's
                (1, 0, one("stale"), 0),
                (1, 1, one("kept: no header")),
            )
        )
    )
    rows = part_of(prepared, Part.ROW)
    users = list(zip(rows["partition"].to_pylist(), rows["offset"].to_pylist(), rows[ROW].to_pylist()))
    assert [(p, o) for p, o, _ in users] == [(0, 0), (0, 1), (0, 3), (1, 1)]
    assert all(row["user"].startswith("kept") for _, _, row in users)
    # every record counts: positions move past the stale ones
    assert _markers(prepared) == [(0, 4, 5, None), (1, 1, 2, None)]


def test_a_value_over_the_cap_on_arrow_memory_is_refused_while_it_is_read(spark):
    after = Stage("after", ("clean",), spark="SELECT _position, user FROM {input}")
    code = SparkStage(spark, after, StageRows(("clean",), ROWS_SCHEMA, 64 << 10))
    big = pa.table(
        {"user": ["x" * 1000] * 500, "amount": list(range(500)), "at": [None] * 500}, schema=ROWS_SCHEMA
    )  # half a megabyte of rows, compressed to a few kilobytes
    prepared = code.records(_arrow_records((0, 0, big)))
    rejected = part_of(prepared, Part.REJECTED)
    assert rejected["offset"].to_pylist() == [0]
    assert "over the cap" in rejected[REASON][0].as_py()
    assert part_of(prepared, Part.ROW).num_rows == 0


def test_spark_code_after_spark_code_without_an_operator_reads_the_rows_its_code_gives(spark):
    pipeline = Pipeline(
        "job",
        (INGRESS,),
        (
            Stage("clean", ("clicks",), spark="SELECT _position, user, amount FROM {input} WHERE amount > 0"),
            Stage("doubled", ("clean",), spark="SELECT _position, user, amount * 2 AS twice FROM {input}", sink=Sink()),
        ),
    )
    made = spark_stages(spark, pipeline, ["doubled"], 1 << 20)
    assert list(made) == ["doubled"]  # the stage it reads was checked for its schema, not run here
    rows = pa.table({"user": ["a"], "amount": [4]})
    prepared = made["doubled"].records(_arrow_records((0, 0, rows)))
    assert part_of(prepared, Part.ROW)[ROW].to_pylist() == [{"user": "a", "twice": 8}]


def test_partials_with_a_timestamp_among_the_codes_columns_and_no_null_key(spark):
    stage = Stage(
        "totals",
        ("clicks",),
        lambda: KeyedAggregate("user", {"n": count()}),
        spark="SELECT _position, user, timestamp_millis(ts) AS at FROM {input}",
    )
    code = SparkStage(spark, stage, INGRESS)
    prepared = code.records(_records((0, 0, {"user": "a", "amount": 5, "ts": 1}), (0, 1, {"user": "a", "ts": 2})))
    assert part_of(prepared, Part.PARTIAL)[PARTIAL].to_pylist() == [{"user": "a", "n": 2}]
    assert part_of(prepared, Part.ROW).num_rows == 0


def test_only_errors_spark_raised_running_the_code_are_searched_not_a_job_stopped_or_python_s_own(spark):
    from pyspark.errors.exceptions.captured import ArithmeticException, CapturedException

    from streaming.adapters.spark.stage import _the_codes

    assert _the_codes(ArithmeticException(desc="[DIVIDE_BY_ZERO] Division by zero.", stackTrace="at x"))
    # a worker that stops interrupts or cancels its job: no record's doing (before, good records were set aside)
    assert not _the_codes(CapturedException(desc="Job 3 cancelled because SparkContext was shut down", stackTrace="x"))
    assert not _the_codes(ValueError("Null bitmap with offsets slice not supported"))
    assert not _the_codes(ChannelQueryError("a micro-batch read a channel in more than one partition"))
