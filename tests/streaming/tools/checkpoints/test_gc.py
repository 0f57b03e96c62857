"""`checkpoints gc` on a local store and on the real S3 server: the dry run
lists old checkpoints, orphaned parts, staged copies of committed output and
old retracted output; the collection removes exactly those files, and never
the checkpoint a restore would pick nor the one the job started from."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from streaming.adapters.objects import open_store
from streaming.adapters.sinks.factory import sink_location
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskParts
from streaming.api.settings import JobSettings
from streaming.tools.checkpoints.gc import GcPlan, apply_gc, plan_gc
from streaming.tools.views import render_gc

JOB = "ledger"


@pytest.fixture(params=["file", pytest.param("s3", marks=pytest.mark.integration)])  # s3: the real runtime
def uri(request, tmp_path, unique_name):
    if request.param == "file":
        return None, f"file://{tmp_path}/store"
    connection = request.getfixturevalue("connection")
    return connection, f"s3://{connection.s3_bucket}/tests/{unique_name}"


def _write(store: SnapshotStore, cid: int, *, complete: bool = True) -> None:
    generation = 1 if cid == 1 else 2  # generation 2 started from checkpoint 1 and took the later ones
    snap = store.write_task(
        cid, generation, "accounts-0", TaskParts(state={"balances": pa.table({"k": [cid]})}, positions={"legs:0": cid})
    )
    if complete:
        store.write_manifest(cid, generation, {"accounts-0": snap})


def _files(fs: pafs.FileSystem, root: str) -> set[str]:
    selector = pafs.FileSelector(root, recursive=True, allow_not_found=True)
    return {i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File}


def test_gc_removes_exactly_what_the_dry_run_listed(uri):
    connection, store_uri = uri
    location = open_store(store_uri, connection)
    store = SnapshotStore(location, JOB, key=UNSIGNED)
    store.next_generation(None)
    store.next_generation(1)  # the current generation started from checkpoint 1
    for cid in (1, 2, 4, 5):
        _write(store, cid)
    _write(store, 3, complete=False)  # abandoned
    _write(store, 6, complete=False)  # possibly in progress: newer than every complete one
    fs, layout = store.files.fs, store.layout
    orphan = layout.part(5, "ghost-0/state/balances.parquet")
    fs.create_dir(orphan.rsplit("/", 1)[0])
    with fs.open_output_stream(orphan) as out:
        out.write(b"never acknowledged")
    # checkpoint 5 is damaged: a restore would pick 4
    with fs.open_output_stream(layout.part(5, "accounts-0/state/balances.parquet")) as out:
        out.write(b"broken")

    sink_at = sink_location(JobSettings(store=store_uri), JOB, connection)
    sink = ObjectStoreSink(sink_at, "windows-0")
    sink.stage(4, pa.table({"x": [1]}))
    fs.create_dir(sink_at.path("output", "epoch-000000000004"))
    fs.copy_file(sink_at.path("staging", "epoch-000000000004", "windows-0.parquet"), sink.output_path(4))
    sink.stage(6, pa.table({"x": [2]}))  # waits for checkpoint 6
    fs.create_dir(sink_at.path("retracted", "epoch-000000000009"))
    with fs.open_output_stream(sink_at.path("retracted", "epoch-000000000009", "windows-0.parquet")) as out:
        out.write(b"taken back")

    assert not [g for g in plan_gc(store, sink_at, retain=1, grace_s=3600).garbage if "retracted" in g.reason]
    plan = plan_gc(store, sink_at, retain=1, grace_s=0, now=time.time() + 60)
    text = render_gc(plan, dry_run=True)
    listed = {g.path for g in plan.garbage}
    reasons = {g.reason for g in plan.garbage}
    assert reasons == {
        "retention (keep 1)",
        "incomplete, older than a complete one",
        "orphan: not in the manifest",
        "staged copy of committed sink output",
        "retracted sink output older than 0 s",
    }, reasons
    assert all(layout.checkpoint_dir(c) + "/" in "".join(listed) for c in (2, 3))
    assert not any(layout.checkpoint_dir(c) + "/" in p for p in listed for c in (1, 4, 6))
    assert orphan in listed and "would remove" in text
    assert any("kept: a restore would pick it" in k for k in plan.kept), plan.kept
    assert any("the current generation started from it" in k for k in plan.kept), plan.kept
    assert any("waiting for their checkpoint" in k for k in plan.kept), plan.kept

    before = _files(fs, layout.job_dir)
    removed = apply_gc(store, plan)
    after = _files(fs, layout.job_dir)
    assert {g.path for g in removed} == listed
    assert before - after == listed
    assert store.completed() == [1, 4, 5]
    assert store.checkpoints() == [1, 4, 5, 6]
    assert store.latest_verified()[0].checkpoint_id == 4
    assert sink.staged_epochs() == [6]
    assert not plan_gc(store, sink_at, retain=1, grace_s=0, now=time.time() + 60).garbage
    store.close()


def test_gc_keeps_every_checkpoint_a_kept_one_links_to(tmp_path) -> None:
    """Incremental checkpoints: 3 links to 1 (its base) and 2 (aborted, never
    complete); with one checkpoint kept, gc removes neither and says why."""
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), JOB, key=UNSIGNED)
    keys = {b"spark-abs.keys": b'["k"]'}
    base = store.write_task(
        1, 1, "a-0", TaskParts(chains={"t": [("base", pa.table({"k": [1], "n": [1]}).replace_schema_metadata(keys))]})
    )
    store.write_manifest(1, 1, {"a-0": base})
    aborted = store.write_task(
        2,
        1,
        "a-0",
        TaskParts(
            chains={
                "t": [
                    *base.state_chains["t"],
                    ("upserts", pa.table({"k": [2], "n": [1]}).replace_schema_metadata(keys)),
                ]
            }
        ),
    )
    third = store.write_task(
        3,
        1,
        "a-0",
        TaskParts(
            chains={
                "t": [
                    *aborted.state_chains["t"],
                    ("upserts", pa.table({"k": [3], "n": [1]}).replace_schema_metadata(keys)),
                ]
            }
        ),
    )
    store.write_manifest(3, 1, {"a-0": third})
    plan = plan_gc(store, None, retain=1, grace_s=0)
    assert plan.garbage == []
    assert [line for line in plan.kept if "links to its parts" in line] == [
        "chk-00000001: older than the newest 1, kept: checkpoint 3 links to its parts",
        "chk-00000002: older than the newest 1, kept: checkpoint 3 links to its parts",
    ]
    assert store.load_task(3, "a-0").state["t"]["k"].to_pylist() == [1, 2, 3]


def _retained_away(plan: GcPlan) -> set[int]:
    """The checkpoints a gc plan removes whole (retention, incomplete)."""
    whole = [g.path for g in plan.garbage if g.reason.startswith(("retention", "incomplete"))]
    return {int(match.group(1)) for match in map(re.compile(r"chk-(\d+)/").search, whole) if match}


@pytest.mark.parametrize(
    "damaged",
    [(), (5, 6, 7), (2, 6, 8), (1, 2, 3, 5, 6, 7, 8)],
    ids=["none", "the newest three", "some", "all"],
)
def test_gc_and_the_coordinator_give_up_the_same_checkpoints(tmp_path, damaged) -> None:
    """One rule: at every completion, the coordinator's retention (a store
    handle that remembers which checkpoint verifies) deletes exactly what
    ``gc`` (a handle of its own, verifying from the newest) would, and
    neither ever the newest checkpoint that verifies."""
    uri = f"file://{tmp_path}/store"
    running = SnapshotStore(open_store(uri), JOB, key=UNSIGNED)
    for cid in range(1, 9):
        _write(running, cid, complete=cid != 4)  # 4: abandoned, never complete
        if cid in damaged:
            (Path(running.layout.part(cid, "accounts-0/state/balances.parquet"))).unlink()
        with SnapshotStore(open_store(uri), JOB, key=UNSIGNED) as fresh:
            gc = plan_gc(fresh, None, retain=3, grace_s=0)
            picked, _ = fresh.latest_verified()
        assert set(running.apply_retention(3)) == _retained_away(gc), cid
        if picked is not None:
            assert picked.checkpoint_id in running.completed(), cid
    assert _retained_away(plan_gc(running, None, retain=3, grace_s=0)) == set()
    running.close()
