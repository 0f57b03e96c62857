"""A stage task's input channels as a Structured Streaming query.

A ``ChannelQuery`` reads an explicit set of Kafka partitions (``assign``),
started at explicit offsets, and its ``foreachBatch`` hands each micro-batch
to the task as one Arrow table ordered by channel and offset.  Spark's own
checkpoint location is a detail of one generation: every start gets a fresh
one, and the offsets the task's snapshot recorded are the only source of
truth for where each channel resumes."""

from __future__ import annotations

import collections
import functools
import json
import logging
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc
from pyspark.sql import DataFrame, SparkSession
from pyspark.sql.streaming import StreamingQuery

from barriers.messages import ChannelId
from streaming.adapters.serde.records import BATCH_BEGAN, BATCH_COLUMNS, records_in, stamped
from streaming.api.config import Connection
from streaming.errors import PIPELINE_ERRORS, ChannelQueryError, ConfigError, SparkAbsError
from streaming.waits import Deadline

__all__ = ["in_channel_order", "QuerySpec", "ChannelQuery"]

log = logging.getLogger(__name__)


# how long the broker may hold a fetch of a stage query's consumer for data to come
FETCH_MAX_WAIT_MS = 20


# how long stopping a stage query waits for its micro-batch, Spark's thread and the batch in hand
# each (a batch waits on Kafka for at most the delivery timeout, then fails)
STOP_BOUND_S = 150.0


def _as_it_is(table: pa.Table) -> pa.Table:
    return table


def in_channel_order(table: pa.Table) -> pa.Table:
    """``table`` ordered by topic, partition and offset (a stable sort: rows
    of one offset keep their order), left as it is when it already is, as
    a micro-batch read channel after channel usually is."""
    if table.num_rows < 2:
        return table
    ahead, behind = table.slice(1), table.slice(0, table.num_rows - 1)
    same_topic = pc.equal(ahead["topic"], behind["topic"])
    same_channel = pc.and_(same_topic, pc.equal(ahead["partition"], behind["partition"]))
    channel_ahead = pc.or_(
        pc.greater(ahead["topic"], behind["topic"]),
        pc.and_(same_topic, pc.greater(ahead["partition"], behind["partition"])),
    )
    in_order = pc.or_(channel_ahead, pc.and_(same_channel, pc.greater_equal(ahead["offset"], behind["offset"])))
    if pc.all(in_order).as_py():
        return table
    return table.sort_by([("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending")])


EARLIEST = -2


BatchHandler = Callable[[pa.Table, int], None]


# what a stage query does with a micro-batch before Python: Spark's part, returning Python's part
Prepare = Callable[[DataFrame], Callable[[], pa.Table]]


@dataclass(frozen=True, slots=True)
class QuerySpec:
    """What a stage query reads: its name, the channels (Kafka partitions) it
    reads, the offset each starts at and the most records a micro-batch
    holds.  Validated when built: a query of no channel, or given a starting
    offset for a channel it does not read, is refused."""

    # the query's name in Spark (and the prefix of its Spark checkpoint directory)
    name: str
    # the channels read, each once (kept sorted)
    channels: tuple[ChannelId, ...]
    # channel -> the offset it starts at; a channel not given starts at the earliest
    starting: Mapping[ChannelId, int] = field(default_factory=dict)
    # records per micro-batch at most (Spark's maxOffsetsPerTrigger)
    max_records_per_batch: int = 10_000

    def __post_init__(self) -> None:
        object.__setattr__(self, "channels", tuple(sorted(set(self.channels))))
        object.__setattr__(self, "starting", dict(self.starting))
        if not self.channels:
            raise ConfigError(f"stage query {self.name!r} has no input channel")
        unknown = sorted(str(c) for c in set(self.starting) - set(self.channels))
        if unknown:
            raise ConfigError(
                f"stage query {self.name!r}: starting offsets for channels it does not read: {', '.join(unknown)}"
            )
        if self.max_records_per_batch < 1:
            raise ConfigError(f"max_records_per_batch must be >= 1, got {self.max_records_per_batch}")


class ChannelQuery:
    """A Structured Streaming query reading what ``spec`` says (a
    ``QuerySpec``: the channels, from their starting offsets), calling
    ``on_batch(table, batch_id)`` with each non-empty micro-batch.  Its Spark
    checkpoint location is made under ``work_dir`` (None: the system's
    temporary directory).

    With ``prepare`` (a stage's Spark code, ``streaming.adapters.spark.stage``)
    each micro-batch is prepared by Spark first and ``on_batch`` gets what
    that gives: ``prepare(df)`` runs Spark's jobs on the micro-batch's thread
    and returns the rest of the work, Python's, which runs on the query's
    processing thread before ``on_batch``.

    ``on_batch`` runs on a thread of the query's own, one batch at a time and in
    order, while Spark reads the next micro-batch: the JVM's Kafka read and
    Arrow hand-over overlap the Python work instead of waiting for it.  At
    most one batch is in hand and one being read; a batch that failed fails
    the next micro-batch (and ``failure`` says so at once)."""

    def __init__(
        self,
        spark: SparkSession,
        connection: Connection,
        spec: QuerySpec,
        *,
        on_batch: BatchHandler,
        prepare: Prepare | None = None,
        work_dir: Path | None = None,
    ):
        self.spec = spec
        self.channels = spec.channels
        self.name = spec.name
        self._spark = spark
        self._connection = connection
        self._starting = {c: spec.starting.get(c, EARLIEST) for c in self.channels}
        self._limit = spec.max_records_per_batch
        self._on_batch = on_batch
        self._prepare = prepare
        self._work_dir = work_dir
        self._checkpoint_dir: str | None = None
        self._query: StreamingQuery | None = None
        self._processing: ThreadPoolExecutor | None = None
        self._in_hand: Future | None = None
        # what crossed from Spark to Python: the Kafka records read and the bytes of the tables handed over
        self.handed: collections.Counter[str] = collections.Counter()
        # an error in the pipeline a micro-batch met (the stage's Spark code failed on it, records its
        # code raises on stop the job): no restore fixes it
        self.pipeline_error: SparkAbsError | None = None

    def _options(self) -> dict[str, str]:
        assign: dict[str, list[int]] = {}
        offsets: dict[str, dict[str, int]] = {}
        for c in self.channels:
            assign.setdefault(c.topic, []).append(c.partition)
            offsets.setdefault(c.topic, {})[str(c.partition)] = self._starting[c]
        options = {
            **self._connection.kafka.spark_options(),
            "assign": json.dumps(assign),
            "startingOffsets": json.dumps(offsets),
            "includeHeaders": "true",
            "maxOffsetsPerTrigger": str(self._limit),
            "failOnDataLoss": "true",
            # a cached consumer leaves a fetch waiting on the broker after each micro-batch; the next
            # batch's fetch waits behind it up to this long when no data came (Kafka's default 500 ms
            # was most of a barrier's time through an idle stage)
            "kafka.fetch.max.wait.ms": str(FETCH_MAX_WAIT_MS),
        }
        if self._connection.kafka.is_cluster:
            # with replicas, a lost broker's partitions get new leaders within seconds: give up on
            # the old one sooner than Kafka's 60 s and let Spark ask again (fetchOffset.numRetries).
            # One broker alone is waited for (an outage passes; nothing else could answer).
            options |= {"kafka.default.api.timeout.ms": "15000", "kafka.request.timeout.ms": "10000"}
        return options

    def _handle(self, df: DataFrame, batch_id: int) -> None:
        began = time.time()
        try:
            if self._prepare is not None:
                finish = self._prepare(df)
            else:
                finish = functools.partial(_as_it_is, df.select(*BATCH_COLUMNS).toArrow())
        except PIPELINE_ERRORS as exc:
            self.pipeline_error = exc
            raise
        self._finish_in_hand()
        self._in_hand = self._require_processing().submit(self._process, finish, began, batch_id)

    def _process(self, finish: Callable[[], pa.Table], began: float, batch_id: int) -> None:
        try:
            table = stamped(finish(), BATCH_BEGAN, began)
            self.handed["records"] += records_in(table)
            self.handed["bytes"] += table.nbytes
            if table.num_rows:
                self._on_batch(in_channel_order(table), batch_id)
        except PIPELINE_ERRORS as exc:
            self.pipeline_error = exc
            raise

    def _finish_in_hand(self, timeout_s: float | None = None) -> None:
        """Wait for the batch in hand; raise what it raised."""
        if self._in_hand is not None:
            in_hand, self._in_hand = self._in_hand, None
            in_hand.result(timeout_s)

    def start(self, *, available_now: bool = False, interval: str = "200 milliseconds") -> ChannelQuery:
        """Start the query with a fresh Spark checkpoint location.  ``available_now``
        reads what the channels hold now and stops; otherwise it runs until ``stop``."""
        if self._query is not None:
            raise ChannelQueryError(f"stage query {self.name!r} is already started")
        self._checkpoint_dir = tempfile.mkdtemp(
            prefix=f"spark-abs-{self.name}-", dir=str(self._work_dir) if self._work_dir else None
        )
        self._processing = ThreadPoolExecutor(1, thread_name_prefix=f"batches-{self.name}")
        reader = self._spark.readStream.format("kafka")
        for key, value in self._options().items():
            reader = reader.option(key, value)
        writer = (
            reader.load()
            .writeStream.queryName(self.name)
            .foreachBatch(self._handle)
            .option("checkpointLocation", self._checkpoint_dir)
        )
        writer = writer.trigger(availableNow=True) if available_now else writer.trigger(processingTime=interval)
        self._query = writer.start()
        log.debug(
            "stage query %s started on %s", self.name, ", ".join(f"{c}@{self._starting[c]}" for c in self.channels)
        )
        return self

    def await_done(self, timeout_s: float) -> None:
        """Wait for an ``available_now`` query to finish; raise if it failed."""
        query = self._require()
        deadline = Deadline(timeout_s)
        # seconds, any number (pyspark's annotation says int; it multiplies by 1000 for the JVM)
        finished = query.awaitTermination(timeout_s)  # type: ignore[arg-type]
        if query.exception() is not None:
            raise ChannelQueryError(f"stage query {self.name!r} failed: {query.exception()}")
        if not finished:
            self.stop()
            raise ChannelQueryError(f"stage query {self.name!r} did not finish within {timeout_s:.0f} s")
        try:
            self._finish_in_hand(deadline.left())
        except FuturesTimeout as exc:
            raise ChannelQueryError(
                f"stage query {self.name!r}: its last batch took longer than {timeout_s:.0f} s"
            ) from exc
        except Exception as exc:
            raise ChannelQueryError(f"stage query {self.name!r} failed: {exc}") from exc

    def failure(self) -> str | None:
        """Why the query stopped, if it failed; None while it runs (or stopped cleanly)."""
        in_hand = self._in_hand
        if in_hand is not None and in_hand.done() and in_hand.exception() is not None:
            return f"{type(in_hand.exception()).__name__}: {in_hand.exception()}"
        if self._query is None:
            return None
        error = self._query.exception()
        return None if error is None else str(error)

    def latest_offsets(self) -> dict[ChannelId, int]:
        """Kafka's latest offset on each channel as the query last saw it
        (its last progress report; empty before the first)."""
        progress = self._query.lastProgress if self._query is not None else None
        latest: dict[ChannelId, int] = {}
        for source in progress.sources if progress is not None else ():
            try:
                offsets = json.loads(source.latestOffset or "null") or {}
                for topic, partitions in offsets.items():
                    for partition, offset in partitions.items():
                        latest[ChannelId(topic, int(partition))] = int(offset)
            except (AttributeError, TypeError, ValueError):  # not a Kafka source's offsets
                continue
        return latest

    def stop(self) -> None:
        """Stop reading; the batch in hand is finished (a failure of it is logged:
        the query is going away either way)."""
        if self._query is not None:
            self._query.stop()
            self._query = None
        finished = True
        try:
            self._finish_in_hand(STOP_BOUND_S)
        except FuturesTimeout:
            finished = False
            log.warning(
                "stage query %s: the batch in hand did not finish within %.0f s; stopping without it",
                self.name,
                STOP_BOUND_S,
            )
        except Exception as exc:
            log.warning("stage query %s: the last batch failed: %s", self.name, exc)
        if self._processing is not None:
            self._processing.shutdown(wait=finished, cancel_futures=True)
            self._processing = None
        if self._checkpoint_dir:
            shutil.rmtree(self._checkpoint_dir, ignore_errors=True)
            self._checkpoint_dir = None

    def _require_processing(self) -> ThreadPoolExecutor:
        if self._processing is None:
            raise ChannelQueryError(f"stage query {self.name!r} is stopped")
        return self._processing

    def _require(self) -> StreamingQuery:
        if self._query is None:
            raise ChannelQueryError(f"stage query {self.name!r} is not started")
        return self._query
