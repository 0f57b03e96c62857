"""What a restore drill feeds a pipeline and how it checks the output
(``streaming.tools.drill``): ``DrillWorkload``, the money pipeline's
(``money_workload``) and a user's, named ``module:function``
(``load_workload``)."""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from streaming.adapters.snapshots import SnapshotStore
from streaming.api.pipeline import Pipeline
from streaming.errors import ConfigError

__all__ = ["DrillWorkload", "InputRecord", "demo_output", "load_workload", "money_reference", "money_workload"]


@dataclass(frozen=True)
class InputRecord:
    topic: str
    partition: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    key: bytes | None = None
    malformed: bool = False  # the pipeline must turn it into a dead letter


@dataclass(frozen=True)
class DrillWorkload:
    """What a drill feeds a pipeline and how it checks the output.

    ``records(pipeline, rng)`` yields input records without end (the drill
    sends them at its rate while failures go on); ``end(pipeline)`` the
    records that close the input; ``reference(spark, pipeline, bootstrap)``
    the expected output, computed in batch by Spark from the ingress topics,
    as a pandas frame with the ``keys`` and ``sums`` columns; and, when the
    pipeline conserves something, ``conserved(store, checkpoint_id,
    read_range)`` its total in a checkpoint (zero when conserved)."""

    records: Callable[[Pipeline, random.Random], Iterator[InputRecord]]
    end: Callable[[Pipeline], list[InputRecord]]
    reference: Callable[[Any, Pipeline, str], pd.DataFrame]
    keys: tuple[str, ...]
    sums: tuple[str, ...]
    conserved: Callable[[SnapshotStore, int, Callable], int] | None = None
    output: Callable[[Any], pd.DataFrame] | None = None  # committed output table -> frame (default: to_pandas)


def money_workload(*, accounts: int = 10, malformed_every: int = 997) -> DrillWorkload:
    """The money pipeline's workload: transfers between ``accounts`` accounts
    (event time 10 ms apart), one record in ``malformed_every`` not JSON."""
    from streaming.api.producing import MAX_WATERMARK, watermark_record_headers
    from streaming.tools import demo

    def records(pipeline: Pipeline, rng: random.Random) -> Iterator[InputRecord]:
        ingress = pipeline.ingress[0]
        names = [f"acct-{i:02d}" for i in range(accounts)]
        i = 0
        while True:
            partition = i % ingress.partitions
            if rng.randrange(malformed_every) == 0:
                yield InputRecord(ingress.topic, partition, b"{not json: %d" % i, malformed=True)
            source, target = rng.sample(names, 2)
            transfer = {"id": i, "source": source, "target": target, "amount": rng.randint(1, 500), "ts": i * 10}
            yield InputRecord(ingress.topic, partition, json.dumps(transfer).encode(), key=source.encode())
            i += 1

    def end(pipeline: Pipeline) -> list[InputRecord]:
        ingress = pipeline.ingress[0]
        headers = tuple(watermark_record_headers(MAX_WATERMARK))  # the end of the input (streaming.end_input)
        return [InputRecord(ingress.topic, p, b"", headers) for p in range(ingress.partitions)]

    def conserved(store: SnapshotStore, checkpoint_id: int, read_range: Callable) -> int:
        return demo.money_in_checkpoint(store, checkpoint_id, read_range).total

    return DrillWorkload(
        records, end, money_reference, ("account", "window_start"), ("net", "legs"), conserved, demo_output
    )


def demo_output(table) -> pd.DataFrame:
    from streaming.tools import demo

    return pd.DataFrame(demo.normalise(table), columns=["account", "window_start", "window_end", "net", "legs"])


def money_reference(spark, pipeline: Pipeline, bootstrap: str) -> pd.DataFrame:
    """The money pipeline's windows, computed in batch by Spark from the
    transfers topic: every JSON transfer's two legs, summed per account and
    one-second window (records that are not transfers are left out, as the
    pipeline sends them to the dead letters)."""
    from pyspark.sql import functions as F

    from streaming.tools import demo

    topic = pipeline.ingress[0].topic
    raw = (
        spark.read.format("kafka")
        .option("kafka.bootstrap.servers", bootstrap)
        .option("subscribe", topic)
        .option("startingOffsets", "earliest")
        .option("endingOffsets", "latest")
        .load()
    )
    schema = "id BIGINT, source STRING, target STRING, amount BIGINT, ts BIGINT"
    transfers = (
        raw.select(F.from_json(F.col("value").cast("string"), schema).alias("t"))
        .select("t.*")
        .where("id IS NOT NULL AND source IS NOT NULL AND target IS NOT NULL AND amount IS NOT NULL AND ts IS NOT NULL")
    )
    legs = transfers.select(F.col("source").alias("account"), (-F.col("amount")).alias("amount"), "ts").unionByName(
        transfers.select(F.col("target").alias("account"), "amount", "ts")
    )
    start = (F.floor(F.col("ts") / demo.WINDOW_MS) * demo.WINDOW_MS).cast("long")
    windows = (
        legs.groupBy("account", start.alias("window_start"))
        .agg(F.sum("amount").alias("net"), F.count("*").alias("legs"))
        .withColumn("window_end", F.col("window_start") + demo.WINDOW_MS)
        .select("account", "window_start", "window_end", "net", "legs")
    )
    return windows.toPandas()


def load_workload(ref: str | None) -> DrillWorkload:
    """``module:function`` returning a ``DrillWorkload``; None: the money workload."""
    if not ref:
        return money_workload()
    import importlib

    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"workload {ref!r}: expected module:function")
    try:
        made = getattr(importlib.import_module(module_name), attribute)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"workload {ref!r} cannot be loaded: {exc}") from exc
    if not isinstance(made, DrillWorkload):
        raise ConfigError(f"workload {ref!r} returned {type(made).__name__}, not a DrillWorkload")
    return made
