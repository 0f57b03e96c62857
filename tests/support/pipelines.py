"""Pipelines only the tests run, loaded by reference (``support.pipelines:...``)
in the worker processes the tests start."""

from __future__ import annotations

from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.tools.compare.slow import EVENTS

__all__ = ["bad_spark_pipeline"]


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
