"""The smoke pipeline: one pass through every real part the engine stands on.

kafka-python produces records with headers to a topic; a Structured Streaming
query reads the topic's channels (``assign`` + explicit ``startingOffsets``,
``includeHeaders``) in bounded micro-batches; ``foreachBatch`` turns each batch
into Arrow and writes it as Parquet through ``pyarrow.fs`` to the S3 server;
the Parquet is read back and checked against what was produced."""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from pyspark.sql import SparkSession

from barriers.messages import ChannelId
from streaming.adapters.kafka import clients as kafka_clients
from streaming.adapters.kafka.admin import create_topic
from streaming.adapters.objects import open_store
from streaming.adapters.serde.records import header_values
from streaming.adapters.spark.query import ChannelQuery, QuerySpec
from streaming.api.config import Connection, KafkaAccess
from streaming.errors import ChannelQueryError, SmokeFailure
from streaming.tools.smoke.report import SmokeReport

__all__ = ["SEQ_HEADER", "SmokeRun", "check_round_trip", "produce_records", "run_smoke"]

log = logging.getLogger(__name__)

SEQ_HEADER = "spark-abs-seq"


def produce_records(kafka: KafkaAccess, topic: str, count: int, partitions: int) -> None:
    """``count`` JSON records round-robin over the partitions, each carrying its
    sequence number in a header."""
    producer = kafka_clients.raw_producer(kafka, acks="all", linger_ms=5)
    try:
        for i in range(count):
            producer.send(
                topic,
                key=f"k{i}".encode(),
                value=json.dumps({"seq": i}).encode(),
                headers=[(SEQ_HEADER, str(i).encode()), ("spark-abs-kind", b"data")],
                partition=i % partitions,
            )
        producer.flush(timeout=60)
    finally:
        producer.close()


@dataclass(frozen=True, slots=True)
class SmokeRun:
    """One pass of the smoke pipeline: the topic it makes and fills, where
    its Parquet goes, how many records go through and in what batches."""

    # the topic made, produced to and read back (a new one each run)
    topic: str
    # where the batches are written as Parquet: a prefix in the connection's S3 bucket
    prefix: str
    # records produced, round-robin over the partitions
    records: int = 1000
    # partitions of the topic, each an input channel of the query
    partitions: int = 2
    # records per micro-batch at most
    batch_limit: int = 300
    # how long the query may take to read every record
    timeout_s: float = 180.0


def run_smoke(
    spark: SparkSession, connection: Connection, run: SmokeRun, *, progress: Callable[[str], None] = log.info
) -> SmokeReport:
    """Produce, stream through foreachBatch to Parquet on S3, read back, compare."""
    started = time.monotonic()
    create_topic(connection.kafka, run.topic, run.partitions)
    produce_records(connection.kafka, run.topic, run.records, run.partitions)
    progress(f"produced {run.records} records with headers to {run.topic}")
    store = open_store(f"s3://{connection.s3_bucket}/{run.prefix.strip('/')}", connection)
    batches = _ParquetBatches(store, progress)
    _stream(spark, connection, run, batches.write)
    back = pq.read_table(store.root, filesystem=store.filesystem)
    check_round_trip(back, run.records, run.partitions)
    files = store.filesystem.get_file_info(pafs.FileSelector(store.root))
    parquet_files = sum(1 for f in files if f.path.endswith(".parquet"))
    return SmokeReport(
        run.topic,
        run.partitions,
        run.records,
        len(batches.ids),
        batches.rows,
        store.uri,
        parquet_files,
        back.num_rows,
        time.monotonic() - started,
    )


class _ParquetBatches:
    """``on_batch``: each micro-batch (as Arrow) written as a Parquet file to ``store``."""

    def __init__(self, store, progress: Callable[[str], None]):
        self.store = store
        self.progress = progress
        self.ids: list[int] = []
        self.rows = 0

    def write(self, batch: pa.Table, batch_id: int) -> None:
        store = self.store
        table = pa.table(
            {
                "partition": batch["partition"],
                "offset": batch["offset"],
                "key": batch["key"].cast(pa.string()),
                "value": batch["value"].cast(pa.string()),
                "seq_header": header_values(batch, SEQ_HEADER).cast(pa.string()),
            }
        )
        pq.write_table(table, store.path(f"batch-{batch_id:06d}.parquet"), filesystem=store.filesystem)
        self.ids.append(batch_id)
        self.rows += table.num_rows
        self.progress(f"batch {batch_id}: {table.num_rows} rows -> {store.uri}/batch-{batch_id:06d}.parquet")


def _stream(
    spark: SparkSession, connection: Connection, run: SmokeRun, on_batch: Callable[[pa.Table, int], None]
) -> None:
    """The topic's channels through a Structured Streaming query, until every record available is read."""
    spec = QuerySpec(
        name=f"smoke-{run.topic}",
        channels=tuple(ChannelId(run.topic, p) for p in range(run.partitions)),
        max_records_per_batch=run.batch_limit,
    )
    query = ChannelQuery(spark, connection, spec, on_batch=on_batch)
    try:
        query.start(available_now=True).await_done(run.timeout_s)
    except ChannelQueryError as exc:
        raise SmokeFailure(str(exc)) from exc
    finally:
        query.stop()


def check_round_trip(table: pa.Table, records: int, partitions: int) -> None:
    """Raise SmokeFailure unless ``table`` holds each produced record exactly once,
    on the partition it was sent to, in FIFO order, with matching key and value."""
    if table.num_rows != records:
        raise SmokeFailure(f"read back {table.num_rows} rows, produced {records}")
    seq = pc.cast(table["seq_header"], pa.int64())
    if pc.count_distinct(seq).as_py() != records or pc.min(seq).as_py() != 0 or pc.max(seq).as_py() != records - 1:
        raise SmokeFailure("sequence headers are not exactly 0..N-1 once each")
    expected_keys = pc.binary_join_element_wise("k", pc.cast(seq, pa.string()), "")
    if not pc.all(pc.equal(table["key"], expected_keys)).as_py():
        raise SmokeFailure("a record's key does not match its sequence header")
    values = [json.loads(v)["seq"] for v in table["value"].to_pylist()]
    if values != seq.to_pylist():
        raise SmokeFailure("a record's value does not match its sequence header")
    for p in range(partitions):
        rows = table.filter(pc.equal(table["partition"], p)).sort_by("offset")
        if rows["offset"].to_pylist() != list(range(rows.num_rows)):
            raise SmokeFailure(f"partition {p}: offsets are not 0..{rows.num_rows - 1} once each")
        channel_seq = pc.cast(rows["seq_header"], pa.int64()).to_pylist()
        if channel_seq != sorted(channel_seq):
            raise SmokeFailure(f"partition {p}: records came back out of their FIFO order")
    expected_partition = pc.cast(pc.remainder(seq, partitions), pa.int32())
    if not pc.all(pc.equal(pc.cast(table["partition"], pa.int32()), expected_partition)).as_py():
        raise SmokeFailure("a record landed on another partition than it was sent to")
