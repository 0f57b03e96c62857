"""The keyed count as plain Structured Streaming, run in a process of its
own (its own Spark application, as a spark-abs job's workers are):
``groupBy(k).agg(count, sum)`` in update mode, Spark's own checkpoint, the
HDFS-backed or RocksDB state store, each micro-batch's updates written as
Parquet.  It reads what the topic holds (``availableNow``) and prints one
JSON line: start-up seconds, then seconds from the query's start to the end
(everything read, aggregated, written and checkpointed).  By default it
reads it all in one micro-batch; ``--max-offsets-per-trigger`` bounds its
batches as a spark-abs job's ``max_records_per_batch`` bounds its own.

    python -m benchmarks.native --topic T --state-store hdfs --out DIR"""

from __future__ import annotations

import argparse
import json
import os
import time

STATE_STORES = {
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.native", description=__doc__)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--state-store", choices=sorted(STATE_STORES), default="hdfs")
    parser.add_argument("--out", required=True, help="a directory for Spark's checkpoint and the output")
    parser.add_argument(
        "--max-offsets-per-trigger",
        type=int,
        help="Spark's maxOffsetsPerTrigger: micro-batches of at most this many records (default: one batch of all)",
    )
    args = parser.parse_args(argv)
    began = time.monotonic()

    from pyspark.sql import functions as F

    from streaming.adapters.spark.session import spark_session
    from streaming.api.config import Connection

    connection = Connection.load()
    spark = spark_session(
        connection.spark_settings(
            app_name="bench-native",
            extra_conf=(
                ("spark.sql.streaming.stateStore.providerClass", STATE_STORES[args.state_store]),
                # Spark's own local file system (checksums) for its checkpoint and state store
                ("spark.hadoop.fs.AbstractFileSystem.file.impl", "org.apache.hadoop.fs.local.LocalFs"),
            ),
        )
    )

    def write(batch, batch_id: int) -> None:
        batch.write.mode("append").parquet(os.path.join(args.out, "output", f"batch-{batch_id:06d}"))

    source = (
        spark.readStream.format("kafka")
        .options(**connection.kafka.spark_options())
        .option("subscribe", args.topic)
        .option("startingOffsets", "earliest")
        .options(
            **({"maxOffsetsPerTrigger": str(args.max_offsets_per_trigger)} if args.max_offsets_per_trigger else {})
        )
        .load()
    )
    # spark-abs runs of the same invocation append their barriers (header-only
    # records with an empty value) to this topic: a plain query sharing it skips them
    rows = (
        source.where(F.length("value") > 0)
        .select(F.from_json(F.col("value").cast("string"), "k STRING, v LONG").alias("r"))
        .select("r.*")
    )
    counts = rows.groupBy("k").agg(F.count(F.lit(1)).alias("n"), F.sum("v").alias("sum"))
    query = (
        counts.writeStream.outputMode("update")
        .foreachBatch(write)
        .option("checkpointLocation", os.path.join(args.out, "checkpoint"))
        .trigger(availableNow=True)
        .start()
    )
    # the clock starts once the query has started, as a spark-abs job's once its tasks' queries
    # have: the first micro-batch's offsets and planning count, as they do there
    started = time.monotonic()
    query.awaitTermination()
    ended = time.monotonic()
    if query.exception() is not None:
        raise SystemExit(f"native query failed: {query.exception()}")
    output = spark.read.option("recursiveFileLookup", "true").parquet(os.path.join(args.out, "output"))
    final = (
        output.groupBy("k")
        .agg(F.max("n").alias("n"), F.max("sum").alias("sum"))
        .agg(F.sum("n").alias("records"), F.count(F.lit(1)).alias("keys"), F.sum("sum").alias("sum"))
    )
    totals = final.collect()[0].asDict()
    spark.stop()
    print(
        json.dumps(
            {"startup_s": started - began, "seconds": ended - started, **{k: int(v or 0) for k, v in totals.items()}}
        )
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
