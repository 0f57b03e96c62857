"""What carrying each row's origin (``operators.dead_letters.ORIGIN``, so a
dead letter names its ingress record) costs the Python side of a task,
side by side in one run: a two-stage pipeline (a filter, then a keyed
count) whose operators take origins, against the same pipeline whose
operators are of one's own and take none.  Both tasks run in this process
on records made here (no Kafka, no Spark): what is timed is the tasks'
own work, decoding, operators, routing and the Arrow records between the
stages, and the bytes of those records are counted.

    python -m benchmarks.origins [--records 300000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import pyarrow as pa
import pyarrow.compute as pc
from rich.console import Console
from rich.table import Table

from operators import KeyedAggregate, count, filter_rows, sum_
from operators.stateless import FilterRows
from streaming.adapters.serde.records import RECORD_SCHEMA
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.task.stage_task import StageTask, TaskIO

SCHEMA = pa.schema([("k", pa.int64()), ("v", pa.int64())])
BATCH = 5_000


class PlainFilter(FilterRows):
    """The built-in filter as an operator of one's own: it takes no origins."""

    keeps_origin = False


class PlainCount(KeyedAggregate):
    keeps_origin = False


def _pipeline(origins: bool) -> Pipeline:
    keep = filter_rows(pc.field("v") >= 0) if origins else PlainFilter(pc.field("v") >= 0)
    aggregations = {"n": count(), "s": sum_("v")}
    return Pipeline(
        "bench",
        (Ingress("in", 1, SCHEMA),),
        (
            Stage("pass", ("in",), lambda: keep, key="k"),
            Stage(
                "count",
                ("pass",),
                (lambda: KeyedAggregate("k", aggregations)) if origins else (lambda: PlainCount("k", aggregations)),
                sink=Sink(),
            ),
        ),
    )


def _records(topic: str, offsets: range, values: list[bytes], headers: list | None = None) -> pa.Table:
    n = len(values)
    return pa.table(
        {
            "topic": [topic] * n,
            "partition": pa.array([0] * n, pa.int32()),
            "offset": pa.array(list(offsets), pa.int64()),
            "key": pa.nulls(n, pa.binary()),
            "value": pa.array(values, pa.binary()),
            "headers": [headers or []] * n,
            "timestamp": pa.nulls(n, pa.timestamp("ms")),
        },
        schema=RECORD_SCHEMA,
    )


def _task(pipeline: Pipeline, name: str, sent: list) -> StageTask:
    io = TaskIO(
        send=lambda channel, key, value, headers: sent.append((value, headers)),
        append_barrier=lambda markers: {c: 0 for c in markers},
        publish=lambda event: None,
        dead_letter=lambda *letter: None,
        write_snapshot=lambda *args, **kwargs: None,
        stage_epoch=lambda epoch, table: None,
    )
    task = StageTask(pipeline, pipeline.task(name), io)
    task.recover()
    return task


def run(batches: list[pa.Table], origins: bool) -> tuple[float, float, int]:
    """Seconds of the first stage, of the second, and the bytes between them."""
    pipeline = _pipeline(origins)
    sent: list = []
    first = _task(pipeline, "pass-0", sent)
    began = time.perf_counter()
    for records in batches:
        first.process_batch(records)
    first_s = time.perf_counter() - began
    topic = pipeline.topic_of("pass")
    internal = [
        _records(topic, range(n, n + 1), [value], [{"key": k, "value": v} for k, v in headers])
        for n, (value, headers) in enumerate(sent)
    ]
    second = _task(pipeline, "count-0", [])
    began = time.perf_counter()
    for records in internal:
        second.process_batch(records)
    return first_s, time.perf_counter() - began, sum(len(value) for value, _ in sent)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.origins", description=__doc__)
    parser.add_argument("--records", type=int, default=300_000, help="records per run (default 300,000)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each side in turn (default 5)")
    args = parser.parse_args(argv)
    values = [json.dumps({"k": n % 100_000, "v": n % 7}).encode() for n in range(args.records)]
    batches = [
        _records("in", range(start, start + BATCH), values[start : start + BATCH])
        for start in range(0, args.records, BATCH)
    ]
    run(batches, True), run(batches, False)  # warm
    results: dict[bool, list[tuple[float, float, int]]] = {True: [], False: []}
    for _ in range(args.rounds):
        for origins in (True, False):
            results[origins].append(run(batches, origins))
    table = Table(title=f"{args.records:,} records, {args.rounds} rounds, medians")
    for column in ("operators", "stage 1 records/s", "stage 2 records/s", "bytes between the stages"):
        table.add_column(column, justify="right")
    medians = {}
    for origins, runs in results.items():
        first, second = (statistics.median(r[i] for r in runs) for i in (0, 1))
        medians[origins] = (first, second)
        table.add_row(
            "take origins" if origins else "take none",
            f"{args.records / first:,.0f}",
            f"{args.records / second:,.0f}",
            f"{runs[0][2]:,}",
        )
    console = Console()
    console.print(table)
    with_, without = medians[True], medians[False]
    console.print(
        f"origins / none, throughput: stage 1 {without[0] / with_[0]:.3f}, stage 2 {without[1] / with_[1]:.3f}; "
        f"bytes {results[True][0][2] / results[False][0][2]:.2f}x"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
