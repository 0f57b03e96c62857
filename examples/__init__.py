"""Pipelines written the way users write them, installed as the package
``spark_abs_examples`` (this directory is ``examples/``) and known by name
(``spark-abs run orders``: the ``spark_abs.pipelines`` entry points).

- ``money``: money in transit, the canonical example (``spark-abs demo``):
  transfers split into legs, balances per account, windows of the legs; every
  consistent snapshot conserves money.
- ``orders``: orders enriched from a customer table, summed per
  country in 10-second tumbling windows (a stream-table join, a table input
  without event time, a Kafka sink).
- ``clickstream``: each user's clicks in 30-second session
  windows, keyed state read straight from an ingress topic its producers
  partition by user.
- ``payments``: payments joined with their card authorisation
  within five minutes (an interval join, left outer), two ingress topics
  co-partitioned by the join key.
- ``devices``: device events deduplicated within a minute (resent
  events counted once) and counted per device in one-minute windows
  sliding by 20 seconds.
- ``carts``: abandoned shopping carts, keyed state with event-time
  timers written by hand (``KeyedProcess``).
- ``changing``: one job's pipeline in four versions, to restore a
  checkpoint into a changed pipeline.
- ``broken_money``: the money pipeline with a bug a drill must catch.
- ``check``: the references, computed independently in batch by Spark SQL
  from the ingress topics, and the drill workloads built on them.

Each of the five after ``money`` has ``pipeline(job)``, ``records(job,
round=0)`` (its input, in the order it is produced; later rounds follow on
in event time), ``REFERENCE`` (the Spark SQL), ``KEYS`` (the output columns
that name a row) and ``drill_workload()``, which makes it drillable
(``spark-abs drill --pipeline orders``: endless rounds of its input, checked
against its reference).  ``combined(job)`` is these five in one job (one
Spark application runs them all), which is how the test suite runs them, in
aligned and unaligned mode with a worker killed."""

from __future__ import annotations

import importlib
from types import ModuleType

from streaming.api.pipeline import Pipeline

__all__ = ["NAMES", "example", "combined", "combined_records"]

NAMES = ("orders", "clickstream", "payments", "devices", "carts")


def example(name: str) -> ModuleType:
    return importlib.import_module(f"spark_abs_examples.{name}")


def combined(job: str = "examples") -> Pipeline:
    """Every example's pipeline in one job: their ingress topics and stages
    side by side (stage names are distinct across the examples)."""
    pipelines = [example(name).pipeline(job) for name in NAMES]
    return Pipeline(
        job,
        tuple(i for p in pipelines for i in p.ingress),
        tuple(s for p in pipelines for s in p.stages),
    )


def combined_records(job: str = "examples") -> list[tuple[str, int, bytes]]:
    """Every example's input, interleaved so that each is at the same share
    of its input at every point (each example's own order kept)."""
    inputs = [example(name).records(job) for name in NAMES]
    ranked = (((i + 1) / len(rows), k, row) for k, rows in enumerate(inputs) for i, row in enumerate(rows))
    return [row for _, _, row in sorted(ranked, key=lambda r: (r[0], r[1]))]
