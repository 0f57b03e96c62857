"""The benchmark workloads: a keyed count (count and sum per key over
100,000 keys, JSON values, two partitions) as spark-abs pipelines, one stage
(its records decoded in Python, or by Spark) or a stateless stage in front
of it, and the records they read.

Worker processes load the pipelines by name (``benchmarks.workloads:one_stage``)
and find the input topic in ``SPARK_ABS_BENCH_TOPIC``, which the job runner
passes on to them with the rest of its environment."""

from __future__ import annotations

import json
import os
import zlib

import pyarrow as pa

from operators import KeyedAggregate, count, select, sum_
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

__all__ = [
    "TOPIC_ENV",
    "EVENTS",
    "KEYS",
    "PARTITIONS",
    "SCALING_PARTITIONS",
    "one_stage",
    "one_stage_spark",
    "two_stage",
    "two_stage_spark_after",
    "two_stage_spark_first",
    "scaling",
    "produce",
    "partition_of",
]

TOPIC_ENV = "SPARK_ABS_BENCH_TOPIC"
EVENTS = pa.schema([("k", pa.string()), ("v", pa.int64())])
KEYS = 100_000
PARTITIONS = 2
# the scaling runs' topic: enough partitions for their largest task count
SCALING_PARTITIONS = 4


def _topic() -> str:
    return os.environ[TOPIC_ENV]


def _count() -> KeyedAggregate:
    return KeyedAggregate("k", {"n": count(), "sum": sum_("v")})


def one_stage(job: str = "bench-one-stage") -> Pipeline:
    """The keyed count reading the input topic, one task per partition."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, PARTITIONS, EVENTS, key="k"),),  # the producer writes each key to one partition
        (Stage("count", (topic,), _count, parallelism=PARTITIONS, sink=Sink()),),
    )


def one_stage_spark(job: str = "bench-one-stage-spark") -> Pipeline:
    """``one_stage`` with Spark decoding the records on the executors (the
    stage's Spark code): only ``k`` and ``v`` cross to Python."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, PARTITIONS, EVENTS, key="k"),),
        (
            Stage(
                "count",
                (topic,),
                _count,
                parallelism=PARTITIONS,
                sink=Sink(),
                spark="SELECT _position, k, v FROM {input}",
            ),
        ),
    )


def two_stage(job: str = "bench-two-stage") -> Pipeline:
    """A stateless stage keyed by ``k`` in front of the same count: the
    records cross one internal topic."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, PARTITIONS, EVENTS),),
        (
            Stage("pass", (topic,), lambda: select("k", "v"), parallelism=PARTITIONS, key="k"),
            Stage("count", ("pass",), _count, parallelism=PARTITIONS, sink=Sink()),
        ),
    )


def two_stage_spark_after(job: str = "bench-two-stage-spark-after") -> Pipeline:
    """``two_stage`` with the count's stage given Spark code: Spark reads the
    Arrow batches the Python stage writes, and computes the partial counts."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, PARTITIONS, EVENTS),),
        (
            Stage("pass", (topic,), lambda: select("k", "v"), parallelism=PARTITIONS, key="k", schema=EVENTS),
            Stage(
                "count",
                ("pass",),
                _count,
                parallelism=PARTITIONS,
                sink=Sink(),
                spark="SELECT _position, k, v FROM {input}",
            ),
        ),
    )


def two_stage_spark_first(job: str = "bench-two-stage-spark-first") -> Pipeline:
    """``two_stage`` with its first stage Spark code (Spark decodes the
    records, Python routes its rows by ``k``), the count in Python."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, PARTITIONS, EVENTS),),
        (
            Stage("pass", (topic,), spark="SELECT _position, k, v FROM {input}", parallelism=PARTITIONS, key="k"),
            Stage("count", ("pass",), _count, parallelism=PARTITIONS, sink=Sink()),
        ),
    )


def scaling(job: str = "bench-scaling") -> Pipeline:
    """``two_stage`` over a topic of ``SCALING_PARTITIONS`` partitions, one
    task per stage as declared: the scaling runs give each stage 1, 2 or 4
    (``RunOptions(parallelism=...)``)."""
    topic = _topic()
    return Pipeline(
        job,
        (Ingress(topic, SCALING_PARTITIONS, EVENTS),),
        (
            Stage("pass", (topic,), lambda: select("k", "v"), key="k"),
            Stage("count", ("pass",), _count, sink=Sink()),
        ),
    )


def partition_of(key: str, partitions: int = PARTITIONS) -> int:
    """Every record of a key goes to one partition, so each task of a stage
    that reads the topic directly counts whole keys."""
    return zlib.crc32(key.encode()) % partitions


def produce(
    kafka: KafkaAccess, topic: str, records: int, *, keys: int = KEYS, partitions: int = PARTITIONS
) -> dict[str, int]:
    """``records`` JSON records ``{"k": "key-<i mod keys>", "v": i mod 100}``;
    returns the expected ``{"records", "keys", "sum"}``."""
    from streaming.adapters.kafka import clients as kafka_clients

    producer = kafka_clients.raw_producer(kafka, linger_ms=50, batch_size=1 << 20, acks=1)
    total = 0
    try:
        for i in range(records):
            key = f"key-{i % keys}"
            value = i % 100
            total += value
            # keyed by k too: Quix Streams keeps its state by the message key
            producer.send(
                topic,
                key=key.encode(),
                value=json.dumps({"k": key, "v": value}).encode(),
                partition=partition_of(key, partitions),
            )
        producer.flush(300)
    finally:
        producer.close()
    return {"records": records, "keys": min(records, keys), "sum": total}
