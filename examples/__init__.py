"""Pipelines written the way users write them, each with its input and a
reference computed independently in batch by Spark SQL (``examples.check``):

- ``examples.orders``: orders enriched from a customer table, summed per
  country in 10-second tumbling windows (a stream-table join, a table input
  without event time, a Kafka sink).
- ``examples.clickstream``: each user's clicks in 30-second session
  windows, keyed state read straight from an ingress topic its producers
  partition by user.
- ``examples.payments``: payments joined with their card authorisation
  within five minutes (an interval join, left outer), two ingress topics
  co-partitioned by the join key.
- ``examples.devices``: device events deduplicated within a minute (resent
  events counted once) and counted per device in one-minute windows
  sliding by 20 seconds.
- ``examples.carts``: abandoned shopping carts, keyed state with event-time
  timers written by hand (``KeyedProcess``).

Each module has ``pipeline(job)``, ``records(job, round=0)`` (its input,
in the order it is produced; later rounds follow on in event time),
``REFERENCE`` (the Spark SQL), ``KEYS`` (the output columns that name a
row) and ``drill_workload()``, which makes it drillable (``spark-abs drill
--pipeline orders``: endless rounds of its input, checked against its
reference).  ``combined(job)`` is every example in one
job (one Spark application runs them all), which is how the test suite runs
them, in aligned and unaligned mode with a worker killed."""

from __future__ import annotations

import importlib
from types import ModuleType

from streaming.api.pipeline import Pipeline

__all__ = ["NAMES", "example", "combined", "combined_records"]

NAMES = ("orders", "clickstream", "payments", "devices", "carts")


def example(name: str) -> ModuleType:
    return importlib.import_module(f"examples.{name}")


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
