"""The pipeline of ``spark-abs compare``'s workloads: a deliberately slow
stage, so that a backlog in front of a barrier takes it a while."""

from __future__ import annotations

import time

import pyarrow as pa

from operators import Chain, KeyedAggregate, count, map_batches
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

__all__ = ["EVENTS", "SECONDS_PER_RECORD", "slow_pipeline"]

EVENTS = pa.schema([("id", pa.int64()), ("key", pa.string())])
SECONDS_PER_RECORD = 0.002


class _Slowly:
    """Sleeps ``seconds`` per record (a picklable callable: a stage's operator
    factory may be sent to Spark's executors)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.seconds * batch.num_rows)
        return batch


def slow_pipeline(job: str = "slow", ms_per_record: float = SECONDS_PER_RECORD * 1000):
    """A deliberately slow stage over a two-partition topic ``<job>.events``
    (``ms_per_record`` per record, 2 by default), counting events per key into
    an object-store sink: a backlog in front of a barrier takes it a while.
    ``streaming.tools.compare.slow:slow_pipeline?ms_per_record=10`` picks the cost."""
    if isinstance(ms_per_record, bool) or not isinstance(ms_per_record, int | float) or not ms_per_record >= 0:
        raise ValueError(f"ms_per_record must be a non-negative number, got {ms_per_record!r}")
    slowly = _Slowly(ms_per_record / 1000)
    return Pipeline(
        job,
        (Ingress(f"{job}.events", 2, EVENTS),),
        (
            Stage(
                "slow",
                (f"{job}.events",),
                lambda: Chain(map_batches(slowly, name="slowly"), KeyedAggregate("key", {"n": count()})),
                sink=Sink(),
            ),
        ),
    )


def bad_spark_pipeline(job: str = "bad-spark"):
    """A stage whose Spark SQL reads a column its input does not have: the
    pipeline passes its checks, and its workers stop on the error when they
    start (it is the pipeline's, so no restore can fix it)."""
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

    events = f"{job}.events"
    return Pipeline(
        job,
        (Ingress(events, 1, EVENTS),),
        (Stage("clean", (events,), spark="SELECT _position, nope FROM {input}", sink=Sink()),),
    )
