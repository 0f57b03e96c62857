"""Keyed state at 100 thousand, 1 million and 10 million keys, in one process:
what a batch costs, what a checkpoint stores, and what a restore reads.

    python -m benchmarks.state              # 100k, 1M and 10M keys (about 3 minutes, 4 GB)
    python -m benchmarks.state --keys 100000,1000000
    python -m benchmarks.state --keys 10000000 --memory 268435456   # rows past 256 MB spilled

For each key count the benchmark's keyed count (``KeyedAggregate``, count
and sum per key) is loaded with every key once, then fed batches of
``--batch`` records over keys drawn uniformly; every ``--checkpoint-every``
batches a checkpoint is taken both ways: the whole state (``snapshot()``,
what a full checkpoint stores) and what changed since the previous one
(``changes()``, what an incremental checkpoint stores), each written as the
snapshot store writes a part (Parquet, zstd).  Of a full checkpoint's time,
the part a task spends on its processing thread (``snapshot_later``: the
rest, gathering the rows, runs on its upload thread) is given apart.  A
restore is timed from the last full snapshot, and from the first one plus
the changes of every checkpoint after it (a chain, as
``SnapshotReader.chain`` applies it).

Reported per key count: the median time of a batch, the time and bytes of
each kind of checkpoint (median), and both restores.  The whole state's
cost grows with the keys held; a batch's and the changes' should not.
With ``--memory``, the state runs under that budget (``StateMemory``: rows
past it spill to memory-mapped files).  After the batches and checkpoints
the table says how many bytes of rows the state holds and how many of them
are in memory, and the process's anonymous resident memory (``RssAnon``:
what spilling bounds; mapped pages are not in it; the benchmark's own 10 M
key names are).  Run one key count per process to compare that figure with
and without a budget.
A table goes to stdout and, with ``--out``, ``state.md`` and ``state.json``."""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["main", "measure"]

KEY_COUNTS = (100_000, 1_000_000, 10_000_000)


def _parquet(table: pa.Table) -> bytes:
    from streaming.adapters.snapshots.writing import part_bytes

    return part_bytes(table).to_pybytes()


def _read(data: bytes) -> pa.Table:
    with pq.ParquetFile(pa.BufferReader(data)) as parquet:
        return parquet.read()


def _rss_anon_mb() -> float | None:
    """This process's anonymous resident memory (Linux), MB."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("RssAnon:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def measure(
    keys: int, *, batches: int, batch: int, checkpoint_every: int, seed: int = 1, memory_bytes: int | None = None
) -> dict[str, float]:
    """One key count's figures (see the module docstring), under a memory
    budget of ``memory_bytes`` when given."""
    from operators.state import StateMemory, use_memory

    with tempfile.TemporaryDirectory(prefix="spill-") as spill:
        memory = StateMemory(spill, memory_bytes) if memory_bytes is not None else None
        previous = use_memory(memory)
        try:
            figures = _measure(keys, batches=batches, batch=batch, checkpoint_every=checkpoint_every, seed=seed)
            figures["memory_bytes"] = memory_bytes
            figures["spilled_mb"] = memory.spilled_bytes / 1e6 if memory else None
            return figures
        finally:
            use_memory(previous)


def _measure(keys: int, *, batches: int, batch: int, checkpoint_every: int, seed: int) -> dict[str, float]:
    from operators import KeyedAggregate, count, sum_
    from operators.base import gathered, snapshot_later_of
    from operators.state import apply_changes, current_memory

    rng = np.random.default_rng(seed)
    names = pa.array([f"key-{i}" for i in range(keys)])
    operator = KeyedAggregate("k", {"n": count(), "sum": sum_("v")})
    loaded = time.perf_counter()
    for start in range(0, keys, 1_000_000):
        chunk = names.slice(start, 1_000_000)
        operator.process(pa.table({"k": chunk, "v": pa.array(np.ones(len(chunk), np.int64))}))
    load_s = time.perf_counter() - loaded
    base = _parquet(operator.snapshot()["state"])
    operator.changes()  # changes are counted from the base
    chain: list[tuple[bytes, bytes]] = []
    batch_s, full_s, full_sync_s, full_bytes, changes_s, changes_bytes, changed_keys = [], [], [], [], [], [], []
    for n in range(1, batches + 1):
        records = pa.table(
            {"k": names.take(pa.array(rng.integers(0, keys, batch))), "v": pa.array(np.ones(batch, np.int64))}
        )
        began = time.perf_counter()
        operator.process(records)
        batch_s.append(time.perf_counter() - began)
        if n % checkpoint_every:
            continue
        began = time.perf_counter()
        changes = operator.changes()["state"]
        upserts, removed = _parquet(changes.upserts), _parquet(changes.removed)
        changes_s.append(time.perf_counter() - began)
        changes_bytes.append(len(upserts) + len(removed))
        changed_keys.append(changes.upserts.num_rows)
        chain.append((removed, upserts))
        began = time.perf_counter()
        later = snapshot_later_of(operator)  # what the task thread does; the upload thread does the rest
        full_sync_s.append(time.perf_counter() - began)
        full = _parquet(gathered(later)["state"])
        full_s.append(time.perf_counter() - began)
        full_bytes.append(len(full))
    pa.default_memory_pool().release_unused()  # what Arrow's allocator keeps for reuse is not the state's
    rss_mb = _rss_anon_mb()
    memory = current_memory()
    in_memory_mb = memory.in_memory() / 1e6 if memory else None
    began = time.perf_counter()
    KeyedAggregate("k", {"n": count(), "sum": sum_("v")}).restore({"state": _read(full)})
    restore_full_s = time.perf_counter() - began
    began = time.perf_counter()
    table = _read(base)
    for removed, upserts in chain:
        table = apply_changes(table, _read(removed), _read(upserts), ["k"])
    KeyedAggregate("k", {"n": count(), "sum": sum_("v")}).restore({"state": table})
    restore_chain_s = time.perf_counter() - began
    assert table.select(["k", "n", "sum"]).equals(operator.state.select(["k", "n", "sum"])), "chain != state"
    return {
        "keys": keys,
        "rows_mb": operator.state.nbytes / 1e6,
        # after the batches and checkpoints (the restores below read whole tables into memory)
        "rss_anon_mb": rss_mb,
        "rows_in_memory_mb": in_memory_mb,
        "load_s": load_s,
        "batch_ms": statistics.median(batch_s) * 1000,
        "full_ms": statistics.median(full_s) * 1000,
        "full_sync_ms": statistics.median(full_sync_s) * 1000,
        "full_bytes": statistics.median(full_bytes),
        "changes_ms": statistics.median(changes_s) * 1000,
        "changes_bytes": statistics.median(changes_bytes),
        "changed_keys": statistics.median(changed_keys),
        "restore_full_s": restore_full_s,
        "restore_chain_s": restore_chain_s,
        "chain_links": len(chain),
    }


def _markdown(rows: list[dict[str, float]], batch: int, checkpoint_every: int) -> str:
    lines = [
        f"Keyed count, batches of {batch:,} records over uniform keys, a checkpoint every {checkpoint_every} "
        "batches (medians).",
        "",
        "| keys | batch ms | full checkpoint ms (on the task thread) | full MB | incremental ms | incremental MB | keys changed "
        "| restore full s | restore base + changes s |",
        "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in rows:
        lines.append(
            f"| {r['keys']:,} | {r['batch_ms']:.1f} | {r['full_ms']:.0f} ({r['full_sync_ms']:.0f}) "
            f"| {r['full_bytes'] / 1e6:.2f} "
            f"| {r['changes_ms']:.1f} | {r['changes_bytes'] / 1e6:.3f} | {r['changed_keys']:,.0f} "
            f"| {r['restore_full_s']:.2f} | {r['restore_chain_s']:.2f} ({r['chain_links']} links) |"
        )
    if rows and rows[0]["memory_bytes"] is not None:
        lines += [
            "",
            f"Under a budget of {rows[0]['memory_bytes'] / 1e6:.0f} MB of rows in memory:",
            "",
            "| keys | rows held MB | rows in memory MB | spilled MB (written, all told) | process RssAnon MB |",
            "| ---: | ---: | ---: | ---: | ---: |",
        ]
    else:
        lines += ["", "| keys | rows held MB | process RssAnon MB |", "| ---: | ---: | ---: |"]
    for r in rows:
        rss = f"{r['rss_anon_mb']:.0f}" if r["rss_anon_mb"] is not None else "-"
        if r["memory_bytes"] is not None:
            lines.append(
                f"| {r['keys']:,} | {r['rows_mb']:.0f} | {r['rows_in_memory_mb']:.0f} | {r['spilled_mb']:.0f} | {rss} |"
            )
        else:
            lines.append(f"| {r['keys']:,} | {r['rows_mb']:.0f} | {rss} |")
    if len(rows) > 1:
        first, last = rows[0], rows[-1]
        lines += [
            "",
            f"batch time at {last['keys']:,} keys / at {first['keys']:,}: {last['batch_ms'] / first['batch_ms']:.2f}; "
            f"incremental bytes: {last['changes_bytes'] / first['changes_bytes']:.2f}; "
            f"full bytes: {last['full_bytes'] / first['full_bytes']:.1f}",
        ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.state", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--keys", default=",".join(map(str, KEY_COUNTS)), help="comma-separated key counts (default 100k, 1M, 10M)"
    )
    parser.add_argument("--batches", type=int, default=40, help="batches per key count (default 40)")
    parser.add_argument("--batch", type=int, default=20_000, help="records per batch (default 20000)")
    parser.add_argument("--checkpoint-every", type=int, default=5, help="batches between checkpoints (default 5)")
    parser.add_argument(
        "--memory", type=int, help="bytes of state rows kept in memory; past them rows spill (default: no limit)"
    )
    parser.add_argument("--out", help="directory for state.md and state.json")
    args = parser.parse_args(argv)
    rows = []
    for keys in (int(k) for k in args.keys.split(",")):
        print(f"{keys:,} keys ...", flush=True)
        rows.append(
            measure(
                keys,
                batches=args.batches,
                batch=args.batch,
                checkpoint_every=args.checkpoint_every,
                memory_bytes=args.memory,
            )
        )
    table = _markdown(rows, args.batch, args.checkpoint_every)
    print()
    print(table)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "state.md").write_text(table)
        (out / "state.json").write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
