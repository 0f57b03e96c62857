"""One job's pipeline as its code changes (docs/operations/changing-a-pipeline.md),
in four versions (``shape``) over a one-partition topic ``<job>.events``:

- ``base``: ``clean`` (rows as they are), then ``counts`` (events per key,
  into an object-store sink);
- ``added``: ``seen`` between them (rows as they are, counted per key in its state);
- ``replaced``: ``audit`` (the same operator) there instead;
- ``schema``: ``counts`` with another state schema (a maximum too).

Run a version, then restore its checkpoint into another::

    spark-abs run 'changing?shape=base' --store file:///tmp/changing-store
    spark-abs restore --pipeline 'changing?shape=added' --store file:///tmp/changing-store --dry-run"""

from __future__ import annotations

import pyarrow as pa

from operators import KeyedAggregate, count, max_
from operators.stateless import Passthrough
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

__all__ = ["EVENTS", "SHAPES", "pipeline"]

EVENTS = pa.schema([("id", pa.int64()), ("key", pa.string())])


class _Seen:
    """Passes its rows on unchanged and counts them per ``key`` (its state,
    table ``state``: key, seen)."""

    def __init__(self) -> None:
        self._counts = KeyedAggregate("key", {"seen": count()})

    def process(self, batch: pa.Table) -> pa.Table:
        self._counts.process(batch)
        return batch

    def snapshot(self) -> dict[str, pa.Table]:
        return self._counts.snapshot()

    def restore(self, state) -> None:
        self._counts.restore(state)


SHAPES = ("base", "added", "replaced", "schema")


def pipeline(job: str = "changing", shape: str = "base"):
    """The pipeline of job ``job`` in version ``shape`` (see the module docstring)."""
    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    events = f"{job}.events"
    aggregations = {"n": count(), "top": max_("id")} if shape == "schema" else {"n": count()}
    clean = Stage("clean", (events,), Passthrough, key="key")
    middle = {"added": "seen", "replaced": "audit"}.get(shape)
    counts = Stage("counts", (middle or "clean",), lambda: KeyedAggregate("key", aggregations), sink=Sink())
    stages = (clean, Stage(middle, ("clean",), _Seen, key="key"), counts) if middle else (clean, counts)
    return Pipeline(job, (Ingress(events, 1, EVENTS),), stages)
