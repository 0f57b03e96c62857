"""An example run against its reference: its input produced (and ended),
its committed output read back, and the same output computed independently
in batch by Spark SQL from the same ingress topics, compared row by row.

The reference never uses the pipeline's operators: each ingress topic is
read with Spark's Kafka source, its JSON (or Avro) decoded with the ingress schema,
and registered as a view named after the topic's last part (``orders`` for
``<job>.orders``); the example's SQL does the rest."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Iterable, Sequence
from typing import cast

import pandas as pd
import pyarrow as pa

from streaming.api.avro_schema import AvroSchema
from streaming.api.config import Connection, KafkaAccess
from streaming.api.pipeline import Ingress, Pipeline
from streaming.api.producing import end_input
from streaming.tools.drill.workload import POISON_FILTER

__all__ = [
    "produce",
    "reference",
    "committed",
    "committed_delta",
    "output",
    "differences",
    "drill_workload",
    "spark_ddl",
]

_SPARK_TYPES = {
    pa.int64(): "BIGINT",
    pa.int32(): "INT",
    pa.string(): "STRING",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
}


def spark_ddl(schema: pa.Schema) -> str:
    """``schema`` as Spark's DDL (``id BIGINT, name STRING``)."""
    return ", ".join(f"`{f.name}` {_SPARK_TYPES[f.type]}" for f in schema)


def produce(kafka: KafkaAccess, records: Iterable[tuple[str, int, bytes]], *, end: Pipeline | None = None) -> int:
    """Send ``records`` (topic, partition, value) in order; with ``end``, then
    end the input of every partition of that pipeline's ingress topics."""
    from streaming.adapters.kafka import clients as kafka_clients

    producer = kafka_clients.raw_producer(kafka, acks="all", linger_ms=20)
    sent = 0
    try:
        for topic, partition, value in records:
            producer.send(topic, value=value, partition=partition)
            sent += 1
        if end is not None:
            for ingress in end.ingress:
                end_input(producer, ingress.topic, ingress.partitions)
        producer.flush(60)
    finally:
        producer.close()
    return sent


def reference(spark, pipeline: Pipeline, sql: str, kafka: KafkaAccess) -> pd.DataFrame:
    """The example's ``sql`` over views of its ingress topics, read in batch."""
    from pyspark.sql import functions as F

    for ingress in pipeline.ingress:
        raw = (
            spark.read.format("kafka")
            .options(**kafka.spark_options())
            .option("subscribe", ingress.topic)
            .option("startingOffsets", "earliest")
            .option("endingOffsets", "latest")
            .option("includeHeaders", "true")
            .load()
        )
        # barriers and watermark records are header-only records with an empty value; records a drill
        # sent to be dead letters (its poison kind) are no input of the reference
        decoded = raw.where((F.length("value") > 0) & F.expr(POISON_FILTER)).select(_decoded(ingress).alias("r"))
        view = ingress.topic.removeprefix(f"{pipeline.job}.")
        decoded.select("r.*").createOrReplaceTempView(f"`{view}`")
    return spark.sql(sql).toPandas()


def _decoded(ingress: Ingress):
    """An ingress record's value as a struct of its columns."""
    from pyspark.sql import functions as F
    from pyspark.sql.avro.functions import from_avro

    if ingress.avro is None:
        return F.from_json(F.col("value").cast("string"), spark_ddl(ingress.schema))
    avro = cast(AvroSchema, ingress.avro)  # Ingress parsed avro= into an AvroSchema when it was made
    # Confluent's serializers put five bytes first: a zero and the schema id
    value = F.expr("substring(value, 6)") if avro.confluent_wire else F.col("value")
    if not avro.registry:
        return from_avro(value, avro.json)
    # each value read with the schema its id names in the registry, resolved to the ingress's
    from streaming.adapters.serde.schema_registry import current_registry, subject_of

    registry = current_registry(f"the reference of {ingress.topic}")
    schema_id = F.conv(F.hex(F.expr("substring(value, 2, 4)")), 16, 10).cast("long")
    decoded = None
    for number in registry.ids(subject_of(ingress.topic)):
        read = from_avro(value, registry.schema(number), {"avroSchema": avro.json})
        decoded = F.when(schema_id == number, read) if decoded is None else decoded.when(schema_id == number, read)
    if decoded is None:
        raise ValueError(f"the registry has no schema of {subject_of(ingress.topic)}: nothing was produced")
    return decoded


def drill_workload(
    records: Callable[..., list[tuple[str, int, bytes]]],
    sql: str,
    keys: Sequence[str],
    poisoned: Callable | None = None,
):
    """An example's workload for ``spark-abs drill`` (the protocol of
    ``streaming.tools.drill.workload``: each example's ``drill_workload()``
    returns this): its input without end, ``records(job, seed=..., round=n)``
    for n = 0, 1, 2, ... (each round's event time and ids after the round
    before), with a seed the drill draws; the input closed on every ingress
    partition; its reference ``sql`` over the ingress topics (``reference``),
    keyed by ``keys``, every other column compared."""
    from streaming.tools.drill.workload import DrillWorkload, InputRecord

    def endless(pipeline: Pipeline, rng):
        seed = rng.randrange(1 << 30)
        for round_ in itertools.count():
            for topic, partition, value in records(pipeline.job, seed=seed, round=round_):
                yield InputRecord(topic, partition, value)

    def expected(spark, pipeline: Pipeline, kafka: KafkaAccess) -> pd.DataFrame:
        return reference(spark, pipeline, sql, kafka)

    return DrillWorkload(endless, expected, tuple(keys), sums=(), poison_ready=True, poisoned=poisoned)


def committed(connection: Connection, job: str, topic: str) -> pd.DataFrame:
    """The rows job ``job``'s Kafka sink committed to ``topic`` (read_committed), without
    the epochs it marked superseded after a restore to an older checkpoint (marks the
    job's key vouches for)."""
    from streaming.adapters.kafka.admin import job_key
    from streaming.adapters.sinks.kafka import read_kafka_output

    output = read_kafka_output(connection.kafka, topic, timeout_ms=1500, key=job_key(connection, job))
    return pd.DataFrame([json.loads(v) for v in output.values])


def committed_delta(spark, table_uri: str, connection: Connection) -> pd.DataFrame:
    """The rows a Delta sink committed to ``table_uri``, read by Spark's Delta
    reader (a session with ``SparkSettings(delta=True)``), without the sink's
    own columns.  A table on S3 is copied object by object to a local
    directory first: the session reads ``s3://`` without hadoop-aws."""
    import tempfile
    from urllib.parse import urlparse

    import pyarrow.fs as pafs

    from streaming.adapters.objects import s3_filesystem
    from streaming.adapters.sinks.delta import DELTA_COLUMNS

    with tempfile.TemporaryDirectory(prefix="delta-read-") as local:
        path = table_uri
        if table_uri.startswith("s3://"):
            parsed = urlparse(table_uri)
            path = f"{local}/table"
            pafs.copy_files(
                f"{parsed.netloc}{parsed.path}",
                path,
                source_filesystem=s3_filesystem(connection),
                destination_filesystem=pafs.LocalFileSystem(),
            )
        frame = spark.read.format("delta").load(path).drop(*DELTA_COLUMNS).toPandas()
    return frame


def output(spark, pipeline: Pipeline, store: str, connection: Connection) -> pd.DataFrame:
    """What the pipeline's sink committed, each result once: a Kafka sink's
    topic (``committed``) or a Delta sink's table (``committed_delta``)."""
    from streaming.adapters.sinks.delta import delta_table_uri
    from streaming.adapters.sinks.factory import sink_location
    from streaming.api.pipeline import SinkKind
    from streaming.api.settings import JobSettings

    sink = next(s.sink for s in pipeline.stages if s.sink is not None)
    if sink.kind is SinkKind.DELTA:
        location = sink_location(JobSettings(store=store), pipeline.job, connection)
        return committed_delta(spark, delta_table_uri(sink, location), connection)
    if sink.topic is None:
        raise ValueError(f"{pipeline.job}: output() reads a Kafka or Delta sink, not {sink.kind}")
    return committed(connection, pipeline.job, sink.topic)


def differences(output: pd.DataFrame, expected: pd.DataFrame, keys: Sequence[str], *, limit: int = 10) -> list[str]:
    """Where ``output`` and ``expected`` differ, by key: a row missing, one
    too many, a value unlike the reference's, a key written twice."""
    keys = list(keys)
    found: list[str] = []
    if output.empty:
        return [f"no output at all; the reference has {len(expected)} rows"] if len(expected) else []
    twice = output[output.duplicated(keys, keep=False)]
    found += [
        f"written more than once: {dict(zip(keys, k))}" for k in twice[keys].drop_duplicates().itertuples(index=False)
    ]
    columns = [c for c in expected.columns if c not in keys]
    merged = output.drop_duplicates(keys).merge(expected, on=keys, how="outer", suffixes=("", "_ref"), indicator=True)
    for row in merged.to_dict("records"):
        where = {k: row[k] for k in keys}
        if row["_merge"] == "right_only":
            found.append(f"missing: {where} (reference: { ({c: row[c + '_ref'] for c in columns}) })")
        elif row["_merge"] == "left_only":
            found.append(f"not in the reference: {where} { ({c: row[c] for c in columns}) }")
        else:
            unlike = {c: (row[c], row[c + "_ref"]) for c in columns if not _same(row[c], row[c + "_ref"])}
            if unlike:
                found.append(f"differs at {where}: " + ", ".join(f"{c} {a} != {b}" for c, (a, b) in unlike.items()))
    return found[:limit] + ([f"... and {len(found) - limit} more"] if len(found) > limit else [])


def _same(a, b) -> bool:
    """Equal, or both null (a JSON null and Spark's null both read as NaN or None)."""
    if pd.isna(a) or pd.isna(b):
        return bool(pd.isna(a) and pd.isna(b))
    return a == b
