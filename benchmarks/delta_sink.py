"""What one epoch's commit costs a Delta sink, by writer, side by side in
one run: delta-rs (``deltalake``, what ``DeltaSink`` uses: the epoch's Arrow
table committed from the task's process) against delta-spark (the same rows
through a Spark session's Delta writer, ``txnAppId``/``txnVersion``).  Each
writes ``--epochs`` epochs of ``--rows`` rows to its own local table, two
rounds in turn; the first commit of each round (the table's creation, and
Spark's first job) is shown apart.

    python -m benchmarks.delta_sink [--epochs 30] [--rows 2000]
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
from rich.console import Console
from rich.table import Table


def _rows(n: int) -> pa.Table:
    return pa.table(
        {
            "user": [f"u{i % 40:03d}" for i in range(n)],
            "session_start": list(range(n)),
            "clicks": [3] * n,
            "spent": [10] * n,
        }
    )


def _delta_rs(path: Path, rows: pa.Table) -> Callable[[int], None]:
    from deltalake import CommitProperties, Transaction, write_deltalake

    def commit(epoch: int) -> None:
        properties = CommitProperties(app_transactions=[Transaction("bench/t0", epoch)])
        write_deltalake(str(path), rows, mode="append", commit_properties=properties)

    return commit


def _delta_spark(path: Path, rows: pa.Table) -> Callable[[int], None]:
    from streaming.adapters.spark.session import spark_session
    from streaming.api.config import SparkSettings

    spark = spark_session(SparkSettings(delta=True, app_name="delta-sink-bench"))

    def commit(epoch: int) -> None:
        frame = spark.createDataFrame(rows.to_pandas())
        writer = frame.write.format("delta").mode("append").option("txnAppId", "bench/t0")
        writer.option("txnVersion", epoch).save(str(path))

    return commit


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=30, help="epochs per writer and round (default 30)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per epoch (default 2000)")
    args = parser.parse_args(argv)
    rows = _rows(args.rows)
    writers = {"delta-rs": _delta_rs, "delta-spark": _delta_spark}
    times: dict[str, list[float]] = {name: [] for name in writers}
    first: dict[str, list[float]] = {name: [] for name in writers}
    with tempfile.TemporaryDirectory(prefix="delta-bench-") as tmp:
        for round_ in range(2):
            for name, make in writers.items():
                path = Path(tmp) / f"{name}-{round_}"
                shutil.rmtree(path, ignore_errors=True)
                commit = make(path, rows)
                for epoch in range(1, args.epochs + 1):
                    start = time.perf_counter()
                    commit(epoch)
                    (first if epoch == 1 else times)[name].append(time.perf_counter() - start)
    table = Table(title=f"one epoch's commit, {args.rows} rows, {args.epochs} epochs x 2 rounds per writer")
    for column in ("writer", "first commit ms", "median ms", "p90 ms", "÷ delta-rs (median)"):
        table.add_column(column, justify="right" if column != "writer" else "left")
    base = statistics.median(times["delta-rs"])
    for name in writers:
        ts = sorted(times[name])
        table.add_row(
            name,
            " / ".join(f"{t * 1000:.0f}" for t in first[name]),
            f"{statistics.median(ts) * 1000:.1f}",
            f"{ts[int(0.9 * (len(ts) - 1))] * 1000:.1f}",
            f"{statistics.median(ts) / base:.1f}",
        )
    Console().print(table)


if __name__ == "__main__":
    main()
