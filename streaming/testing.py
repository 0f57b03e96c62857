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


class _Slowly:
    """Sleeps ``seconds`` per record (a picklable callable: a stage's operator
    factory may be sent to Spark's executors)."""

    def __init__(self, seconds: float):
        self.seconds = seconds

    def __call__(self, batch: pa.Table) -> pa.Table:
        time.sleep(self.seconds * batch.num_rows)
        return batch


def slow_pipeline(job: str = "slow", ms_per_record: float = SLOW_SECONDS_PER_RECORD * 1000):
    """A deliberately slow stage over a two-partition topic ``<job>.events``
    (``ms_per_record`` per record, 2 by default), counting events per key into
    an object-store sink: a backlog in front of a barrier takes it a while.
    ``streaming.testing:slow_pipeline?ms_per_record=10`` picks the cost."""
    from operators import Chain, KeyedAggregate, count, map_batches
    from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage

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
