"""Writing checkpoints (``streaming.adapters.snapshots.writing``) with a
``SnapshotWriter`` of its own on a local directory: what each part holds
(Parquet, sized and checksummed over exactly the bytes stored), the parts
of a chain, what is refused before anything is written, the manifest in one
atomic step, the upload threads and errors of the store as ``StoreError``."""

from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from streaming.adapters.objects import ObjectFiles, open_store
from streaming.adapters.snapshots.format import Manifest, StateLink, TaskSnapshot
from streaming.adapters.snapshots.layout import Layout
from streaming.adapters.snapshots.signing import UNSIGNED, StoreSigner
from streaming.adapters.snapshots.writing import SnapshotWriter, TaskParts, part_bytes
from streaming.errors import StoreError

JOB = "money"


@pytest.fixture
def writer(tmp_path: Path):
    location = open_store(f"file://{tmp_path}/store")
    files, layout = ObjectFiles(location, "snapshot store"), Layout(location, JOB)
    writer = SnapshotWriter(
        files, layout, JOB, StoreSigner(JOB, UNSIGNED, "file:///stores/a"), upload_threads=2, name="the test's store"
    )
    yield writer
    writer.close()


def _checkpoint_dir(writer: SnapshotWriter, checkpoint_id: int) -> Path:
    return Path(writer.layout.checkpoint_dir(checkpoint_id))


def _files(directory: Path) -> list[str]:
    return sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())


def _counts(*keys: str) -> pa.Table:
    return pa.table({"k": list(keys), "n": pa.array(range(len(keys)), pa.int64())})


def test_a_task_snapshot_stores_each_table_and_channel_and_its_json_says_where(writer):
    state = {"counts": _counts("a", "b", "c"), "windows:sum": pa.table({"w": [1.5]})}
    records = pa.table({"offset": pa.array([5, 6], pa.int64()), "value": [b"x", b"y"]})
    snapshot = writer.write_task(
        3,
        2,
        "count/0",
        TaskParts(
            state=state,
            positions={"in:0": 7, "in:1": 4},
            in_flight={"in:0": (5, 7)},
            channel_records={"in:0": records},
            metadata={"alignment": "unaligned"},
        ),
    )
    directory = _checkpoint_dir(writer, 3)
    assert _files(directory) == [
        "count%2F0/_TASK.json",
        "count%2F0/channels/in%3A0.parquet",
        "count%2F0/state/counts.parquet",
        "count%2F0/state/windows%3Asum.parquet",
    ]
    for part, table in zip(snapshot.parts, [*state.values(), records]):
        stored = (directory / part.path).read_bytes()
        assert part.bytes == len(stored) and part.sha256 == hashlib.sha256(stored).hexdigest()
        assert part.rows == table.num_rows and pq.read_table(directory / part.path).equals(table)
    assert [p.name for p in snapshot.state_parts] == ["counts", "windows:sum"]
    assert [p.name for p in snapshot.channel_parts] == ["in:0"]
    assert (snapshot.task, snapshot.checkpoint_id, snapshot.generation) == ("count/0", 3, 2)
    assert snapshot.positions == {"in:0": 7, "in:1": 4} and snapshot.in_flight == {"in:0": (5, 7)}
    assert TaskSnapshot.from_json((directory / "count%2F0" / "_TASK.json").read_bytes()) == snapshot


def test_part_bytes_are_zstd_parquet_that_read_back_as_the_table():
    table = pa.table({"k": [f"key-{i}" for i in range(1000)], "n": pa.array(range(1000), pa.int64())})
    data = part_bytes(table)
    reader = pq.ParquetFile(pa.BufferReader(data))
    assert reader.read().equals(table)
    column = reader.metadata.row_group(0).column(0)
    assert column.compression == "ZSTD" and not column.is_stats_set
    assert "RLE_DICTIONARY" not in column.encodings and "PLAIN_DICTIONARY" not in column.encodings


def test_the_parts_mappings_are_the_parts_own():
    state, positions, steps = {"a": _counts("a")}, {"in:0": 1}, [("base", _counts("a"))]
    parts = TaskParts(state=state, positions=positions, chains={"b": steps})
    state["z"], positions["in:0"] = _counts("z"), 99
    steps.append(("upserts", _counts("b")))
    assert list(parts.state) == ["a"] and parts.positions == {"in:0": 1} and len(parts.chains["b"]) == 1


def test_a_chain_keeps_the_links_stored_before_and_stores_this_checkpoints_steps_in_order(writer):
    base = writer.write_task(1, 1, "A", TaskParts(chains={"counts": [("base", _counts("a", "b"))]}))
    (link,) = base.state_chains["counts"]
    assert (link.checkpoint_id, link.kind, link.part.path) == (1, "base", "A/state/counts.base-0.parquet")
    removed, upserts = pa.table({"k": ["a"]}), _counts("c", "d", "e")
    later = writer.write_task(
        2, 1, "A", TaskParts(chains={"counts": [link, ("removed", removed), ("upserts", upserts)]})
    )
    chain = later.state_chains["counts"]
    assert chain[0] == link  # kept as it is: a part of checkpoint 1
    assert [(s.checkpoint_id, s.kind, s.part.path, s.part.rows) for s in chain[1:]] == [
        (2, "removed", "A/state/counts.removed-1.parquet", 1),
        (2, "upserts", "A/state/counts.upserts-2.parquet", 3),
    ]
    assert _files(_checkpoint_dir(writer, 2)) == [
        "A/_TASK.json",
        "A/state/counts.removed-1.parquet",
        "A/state/counts.upserts-2.parquet",
    ]
    stored = _checkpoint_dir(writer, 2) / chain[2].part.path
    assert pq.read_table(stored).equals(upserts)
    assert chain[2].part.sha256 == hashlib.sha256(stored.read_bytes()).hexdigest()
    assert later.needs() == {1} and later.state_parts == ()


@pytest.mark.parametrize(
    ("parts", "error", "match"),
    [
        (TaskParts(in_flight={"in:0": (5, 4)}), ValueError, "ends before it starts"),
        (TaskParts(channel_records={"in:0": _counts("a")}), ValueError, "no in-flight range"),
        (TaskParts(state={"a": [1, 2]}), TypeError, "table 'a' of task A must be a pyarrow.Table, got list"),
        (
            TaskParts(in_flight={"in:0": (1, 2)}, channel_records={"in:0": "x"}),
            TypeError,
            "channel 'in:0' .* got str",
        ),
        (TaskParts(state={"..": _counts("a")}), ValueError, "table name '..' cannot be used"),
        (TaskParts(chains={"c": []}), ValueError, "must start with its one base"),
        (TaskParts(chains={"c": [("base", _counts("a")), ("base", _counts("b"))]}), ValueError, "one base"),
        (TaskParts(chains={"c": [("base", _counts("a")), ("moved", _counts("b"))]}), ValueError, "'moved'"),
        (TaskParts(chains={"c": [("base", "not a table")]}), ValueError, "no \\(kind, table\\) pair"),
        (TaskParts(state={"c": _counts("a")}, chains={"c": [("base", _counts("a"))]}), ValueError, "whole and as"),
    ],
)
def test_what_is_refused_leaves_the_tasks_earlier_snapshot_as_it_was(writer, parts, error, match):
    earlier = writer.write_task(1, 1, "A", TaskParts(state={"counts": _counts("a")}, positions={"in:0": 3}))
    before = {name: (_checkpoint_dir(writer, 1) / name).read_bytes() for name in _files(_checkpoint_dir(writer, 1))}
    with pytest.raises(error, match=match):
        writer.write_task(1, 1, "A", parts)
    assert {name: (_checkpoint_dir(writer, 1) / name).read_bytes() for name in before} == before
    assert _files(_checkpoint_dir(writer, 1)) == sorted(before)
    assert TaskSnapshot.from_json(before["A/_TASK.json"]) == earlier


def test_a_task_name_that_cannot_be_a_file_name_is_refused(writer, tmp_path):
    for task in ("", ".", ".."):
        with pytest.raises(ValueError, match="task name .* cannot be used as a file name"):
            writer.write_task(1, 1, task, TaskParts())
    assert not (tmp_path / "store").exists() or not list((tmp_path / "store").rglob("*.json"))


def test_a_chain_whose_name_cannot_be_a_file_name_leaves_the_earlier_snapshot(writer):
    writer.write_task(1, 1, "A", TaskParts(state={"counts": _counts("a")}))
    with pytest.raises(ValueError, match="cannot be used as a file name"):
        writer.write_task(1, 1, "A", TaskParts(chains={"..": [("base", _counts("a"))]}))
    assert (_checkpoint_dir(writer, 1) / "A" / "_TASK.json").is_file()


def test_a_chain_step_that_is_no_pair_is_refused_and_leaves_the_earlier_snapshot(writer):
    writer.write_task(1, 1, "A", TaskParts(state={"counts": _counts("a")}))
    with pytest.raises(ValueError, match="is no \\(kind, table\\) pair"):
        writer.write_task(1, 1, "A", TaskParts(chains={"counts": [("base",)]}))
    assert (_checkpoint_dir(writer, 1) / "A" / "_TASK.json").is_file()


def test_the_manifest_is_written_in_one_step_with_every_tasks_snapshot(writer):
    snapshots = {t: writer.write_task(4, 2, t, TaskParts(state={"counts": _counts(t)})) for t in ("A", "B")}
    manifest = writer.write_manifest(4, 2, snapshots, options={"alignment": "aligned"}, metrics={"ms": 3})
    directory = _checkpoint_dir(writer, 4)
    assert _files(directory) == [
        "A/_TASK.json",
        "A/state/counts.parquet",
        "B/_TASK.json",
        "B/state/counts.parquet",
        "_MANIFEST.json",
    ]  # no temporary file left behind
    assert Manifest.from_json((directory / "_MANIFEST.json").read_bytes()) == manifest
    assert (manifest.job, manifest.checkpoint_id, manifest.generation) == (JOB, 4, 2)
    assert (
        manifest.tasks == snapshots and manifest.options == {"alignment": "aligned"} and manifest.metrics == {"ms": 3}
    )
    again = writer.write_manifest(4, 2, snapshots)
    assert (again.options, again.metrics) == ({}, {})
    assert json.loads((directory / "_MANIFEST.json").read_text())["options"] == {}


@pytest.mark.parametrize(
    ("checkpoint_id", "generation", "name", "match"),
    [
        (4, 2, "B", "entry 'B' is task 'A' of checkpoint 4"),
        (5, 2, "A", "manifest of checkpoint 5 .* of checkpoint 4"),
        (4, 3, "A", r"\(generation 3\).* \(generation 2\)"),
    ],
)
def test_a_manifest_of_snapshots_of_another_task_checkpoint_or_generation_is_refused(
    writer, checkpoint_id, generation, name, match
):
    snapshot = writer.write_task(4, 2, "A", TaskParts())
    with pytest.raises(ValueError, match=match):
        writer.write_manifest(checkpoint_id, generation, {name: snapshot})
    assert not (_checkpoint_dir(writer, checkpoint_id) / "_MANIFEST.json").exists()


def test_asynchronous_writes_run_on_the_upload_threads_and_close_waits_for_them(writer):
    caller = threading.current_thread()
    seen: set[threading.Thread] = set()
    real = writer.write_task

    def write_task(*args):
        seen.add(threading.current_thread())
        return real(*args)

    writer.write_task = write_task  # type: ignore[method-assign]
    futures = [writer.write_task_async(7, 1, f"T{i}", TaskParts(state={"n": _counts(str(i))})) for i in range(6)]
    writer.close()
    assert all(f.done() for f in futures)
    assert [f.result().task for f in futures] == [f"T{i}" for i in range(6)]
    assert caller not in seen and 1 <= len(seen) <= 2
    assert len(list(_checkpoint_dir(writer, 7).glob("*/_TASK.json"))) == 6
    with pytest.raises(RuntimeError, match="the test's store is closed"):
        writer.write_task_async(8, 1, "A", TaskParts())
    writer.close()  # again: nothing left to wait for


def test_an_asynchronous_write_raises_what_write_task_would(writer):
    failing = writer.write_task_async(1, 1, "A", TaskParts(in_flight={"in:0": (2, 1)}))
    with pytest.raises(ValueError, match="ends before it starts"):
        failing.result(timeout=10)


def test_a_store_that_cannot_be_written_is_a_store_error_naming_what_was_written(writer):
    checkpoints = Path(writer.layout.checkpoints_dir)
    checkpoints.parent.mkdir(parents=True)
    checkpoints.write_bytes(b"not a directory")  # where the checkpoints go, a file
    with pytest.raises(StoreError, match=r"snapshot store file://.*: writing checkpoint 1 task A failed"):
        writer.write_task(1, 1, "A", TaskParts(state={"counts": _counts("a")}))
    snapshot = TaskSnapshot("A", 1, 1)
    with pytest.raises(StoreError, match="writing the manifest of checkpoint 1 failed"):
        writer.write_manifest(1, 1, {"A": snapshot})


def test_a_link_stored_before_is_not_written_again(writer):
    link = writer.write_task(1, 1, "A", TaskParts(chains={"t": [("base", _counts("a"))]})).state_chains["t"][0]
    assert isinstance(link, StateLink)
    later = writer.write_task(2, 1, "A", TaskParts(chains={"t": [link]}))
    assert later.state_chains["t"] == (link,) and later.parts == ()
    assert _files(_checkpoint_dir(writer, 2)) == ["A/_TASK.json"]
