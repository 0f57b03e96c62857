"""Pipelines only the tests run, loaded by reference (``support.pipelines:...``)
in the worker processes the tests start."""

from __future__ import annotations

import pyarrow as pa

from operators import map_batches
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.tools.compare.slow import EVENTS

__all__ = ["bad_spark_pipeline", "padding_pipeline"]


def bad_spark_pipeline(job: str = "bad-spark"):
    """A stage whose Spark SQL reads a column its input does not have: the
    pipeline passes its checks, and its workers stop on the error when they
    start (it is the pipeline's, so no restore can fix it)."""
    events = f"{job}.events"
    return Pipeline(
        job,
        (Ingress(events, 1, EVENTS),),
        (Stage("clean", (events,), spark="SELECT _position, nope FROM {input}", sink=Sink()),),
    )


def _padded(batch: pa.Table) -> pa.Table:
    """Each key padded to its id's width, then cut to 12 characters: an id
    of 2^62 asks for more memory than there is (a ``MemoryError``, which no
    record is taken to cause: the task fails, it does not set the record aside)."""
    keys = [key.ljust(width, ".")[:12] for key, width in zip(batch["key"].to_pylist(), batch["id"].to_pylist())]
    return batch.set_column(batch.schema.get_field_index("key"), "key", pa.array(keys, pa.string()))


def padding_pipeline(job: str = "padding"):
    """One stage of Python code that fails on one record at every restore (``_padded``)."""
    events = f"{job}.events"
    return Pipeline(
        job,
        (Ingress(events, 1, EVENTS),),
        (Stage("pad", (events,), lambda: map_batches(_padded), sink=Sink()),),
    )
