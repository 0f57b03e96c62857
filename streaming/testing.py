"""Helpers for tests of pipelines built with spark-abs (and for its own tests)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

import pyarrow as pa

__all__ = ["assert_eventually", "slow_pipeline", "EVENTS", "SLOW_SECONDS_PER_RECORD"]

T = TypeVar("T")


def assert_eventually(fn: Callable[[], T], expected: T, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll ``fn`` until it returns ``expected``; after ``timeout`` seconds fail
    with the last value seen (or the last exception raised)."""
    deadline = time.monotonic() + timeout
    last: object = "<not called>"
    while True:
        try:
            last = fn()
            if last == expected:
                return last
        except Exception as exc:  # keep polling; report it if it is the last thing seen
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"expected {expected!r} within {timeout:.1f} s; last seen: {last!r}")
        time.sleep(interval)


EVENTS = pa.schema([("id", pa.int64()), ("key", pa.string())])
SLOW_SECONDS_PER_RECORD = 0.002


def _slowly(batch: pa.Table) -> pa.Table:
    time.sleep(SLOW_SECONDS_PER_RECORD * batch.num_rows)
    return batch


def slow_pipeline(job: str = "slow"):
    """A deliberately slow stage over a two-partition topic ``<job>.events``
    (``SLOW_SECONDS_PER_RECORD`` per record), counting events per key into
    an object-store sink: a backlog in front of a barrier takes it a while."""
    from operators import Chain, KeyedAggregate, count, map_batches
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

    return Pipeline(
        job,
        (Ingress(f"{job}.events", 2, EVENTS),),
        (
            Stage(
                "slow",
                (f"{job}.events",),
                lambda: Chain(map_batches(_slowly, name="slowly"), KeyedAggregate("key", {"n": count()})),
                sink=Sink(),
            ),
        ),
    )
