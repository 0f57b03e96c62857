"""The money pipeline (``spark_abs_examples.money``) with a bug in its first
stage, for a drill to catch: it loses (``broken=lose``) or writes twice
(``broken=duplicate``) one transfer in ``every``::

    spark-abs drill --pipeline 'broken-money?broken=duplicate'

must fail, naming the expectation the output misses.  Its drill workload is
the money pipeline's, whose reference it misses."""

from __future__ import annotations

import dataclasses

import pyarrow as pa
import pyarrow.compute as pc

from operators import Chain, map_batches
from spark_abs_examples import money
from streaming.api.pipeline import Pipeline

__all__ = ["pipeline", "drill_workload"]


class _Break:
    """Loses (``lose``) or doubles (``duplicate``) every transfer whose id is
    ``every - 1`` modulo ``every``: the deliberate bug a drill must catch."""

    def __init__(self, broken: str, every: int):
        if broken not in ("lose", "duplicate"):
            raise ValueError(f"broken must be 'lose' or 'duplicate', got {broken!r}")
        self.broken = broken
        self.every = every

    def __call__(self, batch: pa.Table) -> pa.Table:
        hit = pa.array(batch["id"].to_numpy(zero_copy_only=False) % self.every == self.every - 1)
        if self.broken == "lose":
            return batch.filter(pc.invert(hit))
        return pa.concat_tables([batch, batch.filter(hit)])


def pipeline(job: str = "broken-money", broken: str = "lose", every: int = 500):
    """The money pipeline whose ``legs`` stage loses (``broken=lose``) or
    writes twice (``broken=duplicate``) one transfer in ``every``."""
    bug = _Break(broken, every)
    good = money.pipeline(job)
    legs = dataclasses.replace(
        good.stages[0], operator=lambda: Chain(map_batches(bug, name=f"{broken}-bug"), money.transfer_legs())
    )
    return Pipeline(good.job, good.ingress, (legs, *good.stages[1:]))


def drill_workload():
    """The money pipeline's drill workload (``spark_abs_examples.money.drill_workload``)."""
    return money.drill_workload()
