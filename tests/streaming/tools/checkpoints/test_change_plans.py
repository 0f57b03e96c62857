"""``spark-abs restore --dry-run --pipeline``: what a restore into the
pipeline as its code now declares it would do, on a store in a directory."""

from __future__ import annotations

import subprocess
import sys

import pyarrow as pa

from operators import KeyedAggregate, count
from spark_abs_examples.changing import pipeline as changing_pipeline
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from support.checkpoints import write_checkpoint

JOB = "j"


def _dry_run(tmp_path, shape: str, *more: str) -> subprocess.CompletedProcess:
    reference = f"spark_abs_examples.changing:pipeline?shape={shape}"
    where = ("--store", f"file://{tmp_path}/store", "--job", JOB, "--pipeline", reference)
    command = [sys.executable, "-m", "streaming.tools.cli", "restore", "--dry-run", *where, *more]
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_each_stage_said_and_nothing_changed(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), JOB, key=UNSIGNED)
    operator = KeyedAggregate("key", {"n": count()})
    operator.process(pa.table({"key": ["a", "a", "b"]}))
    write_checkpoint(store, changing_pipeline(JOB, "base"), 3, 0, {"counts-0": operator.snapshot()}, position=7)

    added = _dry_run(tmp_path, "added")
    assert added.returncode == 0, added.stderr
    rows = {line.split()[0]: " ".join(line.split()[1:]) for line in added.stdout.splitlines() if line.strip()}
    assert rows["seen"] == "added 1 starts with empty state; reads clean where counts stood, with its channel state"
    assert (
        rows["counts"]
        == f"inputs changed 1 reads seen from the beginning of spark-abs.{JOB}.seen.g1; no longer reads clean"
    )
    assert rows["clean"] == "kept 1 restores its snapshots"
    assert f"new topic spark-abs.{JOB}.seen.g1 (1 partition(s)) for the output of seen" in added.stdout
    assert "nothing is refused" in added.stdout

    schema = _dry_run(tmp_path, "schema")
    assert schema.returncode == 2, schema.stdout
    assert "REFUSED" in schema.stdout and "the restore would be refused (1 stage(s))" in schema.stdout
    assert "checkpoint 3 stored state(key: string, n: int64)" in schema.stderr
    assert "snapshots state(key, n, top)" in schema.stderr and "--allow-dropped-state counts" in schema.stderr
    allowed = _dry_run(tmp_path, "schema", "--allow-dropped-state", "counts")
    assert allowed.returncode == 0 and "starts with empty state (its state dropped, as allowed)" in allowed.stdout

    same = _dry_run(tmp_path, "base")
    assert same.returncode == 0, same.stderr
    assert "has the checkpoint's stages, inputs and state schemas" in same.stdout
    assert "a restore picks checkpoint 3 and starts generation 1" in same.stdout
    assert store.checkpoints() == [3] and store.read_job() is None
    store.close()
