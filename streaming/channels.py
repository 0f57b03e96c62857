"""Input channels of a stage task on Spark: a Structured Streaming query over
an explicit set of Kafka partitions (``assign``), started at explicit offsets,
whose ``foreachBatch`` hands each micro-batch to the task as one Arrow table
ordered by channel and offset.

Spark's own checkpoint location is a detail of one generation: every start
gets a fresh one, and the offsets the task's snapshot recorded are the only
source of truth for where each channel resumes.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from barriers.messages import ChannelId
from streaming.config import Connection
from streaming.errors import ConfigError, SparkAbsError

__all__ = ["BATCH_COLUMNS", "Channel", "ChannelQuery", "ChannelQueryError", "header_values"]

log = logging.getLogger(__name__)

# Columns of every batch handed to a task, in this order.
BATCH_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")

EARLIEST = -2


class ChannelQueryError(SparkAbsError):
    """The stage's streaming query failed or did not finish in time."""


# One Kafka (topic, partition), the protocol's channel.
Channel = ChannelId


BatchHandler = Callable[[pa.Table, int], None]


class ChannelQuery:
    """A Structured Streaming query reading ``channels`` from ``starting``
    offsets (missing ones start at the earliest), calling ``on_batch(table,
    batch_id)`` with each non-empty micro-batch."""

    def __init__(self, spark: SparkSession, connection: Connection, *, name: str,
                 channels: Iterable[Channel], starting: Mapping[Channel, int] | None = None,
                 max_records_per_batch: int = 10_000, on_batch: BatchHandler,
                 work_dir: Path | None = None):
        self.channels = tuple(sorted(set(channels)))
        if not self.channels:
            raise ConfigError(f"stage query {name!r} has no input channel")
        starting = dict(starting or {})
        unknown = sorted(str(c) for c in set(starting) - set(self.channels))
        if unknown:
            raise ConfigError(f"stage query {name!r}: starting offsets for channels it does not read: "
                              f"{', '.join(unknown)}")
        if max_records_per_batch < 1:
            raise ConfigError(f"max_records_per_batch must be >= 1, got {max_records_per_batch}")
        self.name = name
        self._spark = spark
        self._connection = connection
        self._starting = {c: starting.get(c, EARLIEST) for c in self.channels}
        self._limit = max_records_per_batch
        self._on_batch = on_batch
        self._work_dir = work_dir
        self._checkpoint_dir: str | None = None
        self._query: StreamingQuery | None = None

    def _options(self) -> dict[str, str]:
        assign: dict[str, list[int]] = {}
        offsets: dict[str, dict[str, int]] = {}
        for c in self.channels:
            assign.setdefault(c.topic, []).append(c.partition)
            offsets.setdefault(c.topic, {})[str(c.partition)] = self._starting[c]
        return {
            "kafka.bootstrap.servers": self._connection.kafka_bootstrap,
            "assign": json.dumps(assign),
            "startingOffsets": json.dumps(offsets),
            "includeHeaders": "true",
            "maxOffsetsPerTrigger": str(self._limit),
            "failOnDataLoss": "true",
        }

    def _handle(self, df: DataFrame, batch_id: int) -> None:
        table = df.select(*BATCH_COLUMNS).toArrow()
        if table.num_rows == 0:
            return
        table = table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])
        self._on_batch(table, batch_id)

    def start(self, *, available_now: bool = False, interval: str = "200 milliseconds") -> "ChannelQuery":
        """Start the query with a fresh Spark checkpoint location.  ``available_now``
        reads what the channels hold now and stops; otherwise it runs until ``stop``."""
        if self._query is not None:
            raise ChannelQueryError(f"stage query {self.name!r} is already started")
        self._checkpoint_dir = tempfile.mkdtemp(prefix=f"spark-abs-{self.name}-",
                                                dir=str(self._work_dir) if self._work_dir else None)
        reader = self._spark.readStream.format("kafka")
        for key, value in self._options().items():
            reader = reader.option(key, value)
        writer = (reader.load().writeStream.queryName(self.name).foreachBatch(self._handle)
                  .option("checkpointLocation", self._checkpoint_dir))
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=interval)
        self._query = writer.start()
        log.info("stage query %s started on %s", self.name,
                 ", ".join(f"{c}@{self._starting[c]}" for c in self.channels))
        return self

    def await_done(self, timeout_s: float) -> None:
        """Wait for an ``available_now`` query to finish; raise if it failed."""
        query = self._require()
        finished = query.awaitTermination(timeout_s)
        if query.exception() is not None:
            raise ChannelQueryError(f"stage query {self.name!r} failed: {query.exception()}")
        if not finished:
            self.stop()
            raise ChannelQueryError(f"stage query {self.name!r} did not finish within {timeout_s:.0f} s")

    def failure(self) -> str | None:
        """Why the query stopped, if it failed; None while it runs (or stopped cleanly)."""
        if self._query is None:
            return None
        error = self._query.exception()
        return None if error is None else str(error)

    def stop(self) -> None:
        if self._query is not None:
            self._query.stop()
            self._query = None
        if self._checkpoint_dir:
            shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
            self._checkpoint_dir = None

    def _require(self) -> StreamingQuery:
        if self._query is None:
            raise ChannelQueryError(f"stage query {self.name!r} is not started")
        return self._query


def header_values(table: pa.Table, name: str) -> pa.Array:
    """The value of header ``name`` in each row of a batch (null where absent;
    the first one where repeated), computed without a Python loop over rows."""
    headers = table["headers"].combine_chunks()
    flat = pc.list_flatten(headers)
    hit = pc.equal(flat.field("key"), name)
    rows = pc.filter(pc.list_parent_indices(headers), hit).to_numpy(zero_copy_only=False)
    values = pc.filter(flat.field("value"), hit)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    index = np.full(table.num_rows, -1, dtype=np.int64)
    index[rows[first]] = np.flatnonzero(first)
    return pc.take(values, pa.array(index, mask=index < 0)).cast(pa.binary())
