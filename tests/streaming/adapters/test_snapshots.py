"""The snapshot store: layout, round trips, manifest-last completion, checksums,
fall-back to an older checkpoint, retention and job generations; on a local
directory, and once against the runtime's S3 server."""

from __future__ import annotations

import datetime as dt
import json
import socket
from pathlib import Path

import pyarrow as pa
import pyarrow.fs as pafs
import pytest

from barriers.handler import CheckpointKind, Switch
from barriers.messages import CheckpointOptions, InFlightFormat
from streaming.adapters.objects import StoreLocation, ensure_bucket, open_store, s3_filesystem
from streaming.adapters.snapshots import (
    UNSIGNED,
    JobMeta,
    Manifest,
    SnapshotStore,
    TaskParts,
    TaskSnapshot,
)
from streaming.adapters.snapshots.format import (
    options_as_stored,
    options_from_json,
    options_to_json,
    parse_stored,
    stored_name,
    text_of,
)
from streaming.api.config import Connection, KafkaAccess
from streaming.errors import ConfigError, SnapshotCorruptError, SnapshotMissingError, StoreError

JOB = "money"


def _state() -> dict[str, pa.Table]:
    return {
        "balances": pa.table({"account": ["a", "b", None], "balance": pa.array([10, -3, 0], pa.int64())}),
        "windows:sum.v2": pa.table(
            {
                "key": pa.array([b"k1", b"k2"], pa.binary()),
                "start": pa.array([dt.datetime(2024, 1, 1), dt.datetime(2024, 1, 2)], pa.timestamp("us", "UTC")),
                "values": pa.array([[1.5, 2.0], []], pa.list_(pa.float64())),
                "meta": pa.array(
                    [{"n": 1, "tag": "x"}, {"n": None, "tag": None}],
                    pa.struct([("n", pa.int32()), ("tag", pa.string())]),
                ),
            }
        ),
        "empty": pa.table({"id": pa.array([], pa.int64()), "name": pa.array([], pa.string())}),
        "no-columns": pa.table({}),
    }


def _records(*offsets: int) -> pa.Table:
    return pa.table({"offset": pa.array(offsets, pa.int64()), "value": [f"t{o}".encode() for o in offsets]})


def _chk_dir(store: SnapshotStore, cid: int) -> Path:
    return Path(store.location.root) / JOB / "checkpoints" / f"chk-{cid:08d}"


def _complete(store: SnapshotStore, cid: int, generation: int = 1, tasks=("A", "B")) -> Manifest:
    snaps = {
        t: store.write_task(
            cid,
            generation,
            t,
            TaskParts(
                state={"counts": pa.table({"n": [cid, len(t)]})}, positions={f"in:{i}": cid * 10 + i for i in range(2)}
            ),
        )
        for t in tasks
    }
    return store.write_manifest(cid, generation, snaps)


def _flip_byte(path: Path, at: int = 20) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 0xFF
    path.write_bytes(bytes(data))


def test_task_state_and_channel_records_round_trip(store):
    state = _state()
    in_flight = {"transfers:0": (5, 7), "transfers:1": (3, 3)}
    written = store.write_task(
        3,
        1,
        "stage-a/0",
        TaskParts(
            state=state,
            positions={"transfers:0": 5, "transfers:1": 3},
            in_flight=in_flight,
            channel_records={"transfers:0": _records(5, 6)},
            metadata={"alignment": "unaligned", "sync_ms": 4},
        ),
    )

    loaded = store.load_task(3, "stage-a/0")
    assert loaded.snapshot == written
    assert set(loaded.state) == set(state)
    for name, table in state.items():
        assert loaded.state[name].equals(table), name
        assert loaded.state[name].schema == table.schema, name
    assert loaded.channel_records["transfers:0"].equals(_records(5, 6))
    assert loaded.snapshot.in_flight == in_flight
    assert loaded.snapshot.metadata == {"alignment": "unaligned", "sync_ms": 4}
    assert [p.rows for p in written.state_parts] == [3, 2, 0, 0]
    assert all(p.bytes > 0 and len(p.sha256) == 64 for p in written.parts)


def test_layout_escapes_names_and_keeps_the_originals_in_json(store):
    store.write_task(
        12,
        1,
        "stage-a/0",
        TaskParts(
            state={"windows:sum.v2": pa.table({"x": [1]})},
            positions={"t:0": 1},
            in_flight={"t.x:0": (1, 2)},
            channel_records={"t.x:0": _records(1)},
        ),
    )
    task_dir = _chk_dir(store, 12) / "stage-a%2F0"
    assert (task_dir / "state" / "windows%3Asum.v2.parquet").is_file()
    assert (task_dir / "channels" / "t.x%3A0.parquet").is_file()
    written = json.loads((task_dir / "_TASK.json").read_text())
    assert written["task"] == "stage-a/0"
    assert written["state_parts"][0]["name"] == "windows:sum.v2"
    assert written["state_parts"][0]["path"] == "stage-a%2F0/state/windows%3Asum.v2.parquet"
    assert written["format_version"] == 1  # a full snapshot is written as version 1 wrote it


def test_rewriting_a_task_replaces_it(store):
    store.write_task(1, 1, "A", TaskParts(state={"a": pa.table({"x": [1]}), "b": pa.table({"y": [2]})}))
    store.write_task(1, 1, "A", TaskParts(state={"a": pa.table({"x": [9]})}, positions={"t:0": 4}))
    loaded = store.load_task(1, "A")
    assert list(loaded.state) == ["a"] and loaded.state["a"]["x"].to_pylist() == [9]
    assert not (_chk_dir(store, 1) / "A" / "state" / "b.parquet").exists()


def test_write_task_rejects_bad_input(store):
    with pytest.raises(ValueError, match="ends before it starts"):
        store.write_task(1, 1, "A", TaskParts(in_flight={"t:0": (5, 4)}))
    with pytest.raises(ValueError, match="no in-flight range"):
        store.write_task(1, 1, "A", TaskParts(channel_records={"t:0": _records(1)}))
    with pytest.raises(TypeError, match="pyarrow.Table"):
        store.write_task(1, 1, "A", TaskParts(state={"a": [1, 2]}))
    with pytest.raises(ValueError, match="file name"):
        store.write_task(1, 1, "..", TaskParts())
    with pytest.raises(ConfigError):
        SnapshotStore(store.location, "", key=UNSIGNED)
    assert store.checkpoints() == []


def test_only_a_checkpoint_with_a_manifest_is_complete(store):
    manifest = _complete(store, 1)
    store.write_task(2, 1, "A", TaskParts(state={"counts": pa.table({"n": [1]})}))
    assert store.checkpoints() == [1, 2]
    assert store.completed() == [1]
    assert store.read_manifest(1) == manifest
    with pytest.raises(SnapshotMissingError, match="chk-00000002/_MANIFEST.json does not exist"):
        store.read_manifest(2)
    with pytest.raises(SnapshotMissingError, match="chk-00000099 does not exist"):
        store.read_manifest(99)
    with pytest.raises(SnapshotMissingError, match="no snapshot of task B"):
        store.load_task(2, "B")


def test_manifest_round_trips_and_rejects_mismatched_snapshots(store):
    a = store.write_task(4, 2, "A", TaskParts(state=_state(), positions={"t:0": 1}, in_flight={"t:0": (1, 3)}))
    manifest = store.write_manifest(4, 2, {"A": a}, options={"alignment": "aligned"}, metrics={"duration_ms": 12})
    assert Manifest.from_json(manifest.to_json()) == manifest
    assert TaskSnapshot.from_json(a.to_json()) == a
    assert manifest.tasks["A"].in_flight == {"t:0": (1, 3)}
    assert manifest.format_version == 1
    with pytest.raises(ValueError, match="entry 'B'"):
        store.write_manifest(4, 2, {"B": a})
    with pytest.raises(ValueError, match="generation 2"):
        store.write_manifest(4, 3, {"A": a})


def test_corrupt_json_is_reported_as_corrupt(store):
    _complete(store, 1)
    (_chk_dir(store, 1) / "_MANIFEST.json").write_text('{"job": "money", "checkpoint_id": 1, ')
    with pytest.raises(SnapshotCorruptError, match="checkpoint 1: manifest .* is unreadable"):
        store.read_manifest(1)
    assert "unreadable" in store.verify(1)[0]
    (_chk_dir(store, 1) / "A" / "_TASK.json").write_text("[]")
    with pytest.raises(SnapshotCorruptError, match="checkpoint 1 task A"):
        store.load_task(1, "A")
    with pytest.raises(ValueError, match="format_version 99"):
        Manifest.from_json(json.dumps({"format_version": 99}))


def test_verify_finds_missing_parts_flipped_bytes_and_missing_task_files(store):
    _complete(store, 1, tasks=("A", "B", "C"))
    assert store.verify(1) == []
    _flip_byte(_chk_dir(store, 1) / "A" / "state" / "counts.parquet")
    (_chk_dir(store, 1) / "B" / "state" / "counts.parquet").unlink()
    (_chk_dir(store, 1) / "C" / "_TASK.json").unlink()

    problems = store.verify(1)
    assert len(problems) == 3
    assert "chk-00000001 task A: part 'counts'" in problems[0] and "checksum mismatch" in problems[0]
    assert problems[1] == "chk-00000001 task B: part 'counts' (B/state/counts.parquet) is missing"
    assert problems[2] == "chk-00000001 task C: _TASK.json is missing"
    assert len(store.verify(1, checksums=False)) == 2  # sizes alone miss the flipped byte
    with pytest.raises(SnapshotMissingError):
        store.verify(7)


def test_load_task_checks_every_part(store):
    _complete(store, 1)
    _flip_byte(_chk_dir(store, 1) / "A" / "state" / "counts.parquet")
    with pytest.raises(SnapshotCorruptError, match="checkpoint 1 task A part 'counts' .* checksum mismatch"):
        store.load_task(1, "A")
    (_chk_dir(store, 1) / "B" / "state" / "counts.parquet").write_bytes(b"short")
    with pytest.raises(SnapshotCorruptError, match="task B part 'counts' .* has 5 bytes"):
        store.load_task(1, "B")


def test_latest_verified_falls_back_and_says_why(store):
    for cid in (1, 2, 3):
        _complete(store, cid)
    store.write_task(4, 1, "A", TaskParts())  # in progress: not a candidate
    assert store.latest_verified()[0].checkpoint_id == 3

    _flip_byte(_chk_dir(store, 3) / "B" / "state" / "counts.parquet")
    (_chk_dir(store, 2) / "_MANIFEST.json").write_text("not json")
    manifest, skipped = store.latest_verified()
    assert manifest.checkpoint_id == 1
    assert [cid for cid, _ in skipped] == [3, 2]
    assert "task B: part 'counts'" in skipped[0][1][0] and "checksum mismatch" in skipped[0][1][0]
    assert "manifest" in skipped[1][1][0]

    assert store.latest_verified(exclude=[1, 3]) == (None, [(2, skipped[1][1])])


def test_a_checkpoint_a_later_generation_left_behind_is_never_picked(store):
    """Generation 1 rolled back to checkpoint 2: checkpoint 3 of generation 0
    holds a history the job left (its output discarded, its input read again),
    so a restore before generation 1's first checkpoint takes 2 again, not 3."""
    store.first_generation()
    for cid in (1, 2, 3):
        _complete(store, cid, generation=0)
    assert store.latest_verified()[0].checkpoint_id == 3
    assert store.next_generation(2) == 1
    manifest, skipped = store.latest_verified()
    assert manifest.checkpoint_id == 2
    assert skipped == [(3, ["abandoned: generation 1 started from checkpoint 2, before it"])]
    _complete(store, 4, generation=1)  # generation 1's own: on the line
    assert store.latest_verified() == (store.read_manifest(4), [])
    assert store.next_generation(None) == 2  # from the beginning: every older checkpoint is left
    assert store.latest_verified()[0] is None


def test_retention_keeps_the_newest_and_pinned_and_removes_orphans(store):
    for cid in (1, 2, 4, 5, 6):
        _complete(store, cid)
    store.write_task(3, 1, "A", TaskParts())  # abandoned
    store.write_task(7, 1, "A", TaskParts())  # in progress
    with pytest.raises(ConfigError, match="keep"):
        store.apply_retention(0)

    assert store.apply_retention(keep=2, pinned=[1]) == [2, 3, 4]
    assert store.checkpoints() == [1, 5, 6, 7]
    assert store.completed() == [1, 5, 6]
    assert not _chk_dir(store, 2).exists()
    assert store.apply_retention(keep=2, pinned=[1]) == []
    assert store.apply_retention(keep=1) == [1, 5]
    assert store.checkpoints() == [6, 7]

    store.delete(6)
    store.delete(6)  # already gone
    assert store.checkpoints() == [7] and store.completed() == []
    assert store.apply_retention(keep=1) == []  # nothing completed: 7 may be in progress


def test_async_write_gives_the_same_snapshot(store):
    state = _state()
    future = store.write_task_async(
        5,
        1,
        "A",
        TaskParts(state=state, positions={"t:0": 8}, in_flight={"t:0": (8, 9)}, channel_records={"t:0": _records(8)}),
    )
    state.clear()  # the caller may reuse its dict at once
    async_snapshot = future.result(timeout=10)
    sync_snapshot = store.write_task(
        6,
        1,
        "A",
        TaskParts(
            state=_state(), positions={"t:0": 8}, in_flight={"t:0": (8, 9)}, channel_records={"t:0": _records(8)}
        ),
    )
    assert async_snapshot.parts == sync_snapshot.parts
    assert async_snapshot.checkpoint_id == 5
    assert store.load_task(5, "A").state["balances"].equals(_state()["balances"])

    failing = store.write_task_async(5, 1, "A", TaskParts(state={"bad": "not a table"}))
    with pytest.raises(TypeError):
        failing.result(timeout=10)
    store.close()
    with pytest.raises(RuntimeError, match="closed"):
        store.write_task_async(7, 1, "A", TaskParts())


def test_job_generations_are_recorded(store):
    assert store.read_job() is None
    assert store.next_generation(None) == 1
    assert store.next_generation(12) == 2
    meta = store.read_job()
    assert (meta.job, meta.generation) == (JOB, 2)
    assert [(r.generation, r.from_checkpoint) for r in meta.restores] == [(1, None), (2, 12)]
    assert JobMeta.from_json(meta.to_json()) == meta
    with pytest.raises(ValueError, match="other"):
        store.write_job(JobMeta("other"))
    (Path(store.location.root) / JOB / "_JOB.json").write_text("{}")
    with pytest.raises(SnapshotCorruptError, match="_JOB.json is unreadable"):
        store.read_job()


def test_a_fresh_start_is_recorded_as_generation_0_and_only_once(store):
    store.first_generation(scale={"legs": 3})
    meta = store.read_job()
    assert meta.generation == 0 and [(r.generation, r.from_checkpoint, r.scale) for r in meta.restores] == [
        (0, None, {"legs": 3})
    ]
    store.first_generation(scale={"legs": 1})  # tried again: recorded already
    assert store.read_job() == meta
    assert store.next_generation(None) == 1 and store.read_job().restores[0].generation == 0
    with pytest.raises(ValueError, match="is in generation 1: it cannot start afresh"):
        store.first_generation()


def test_unreachable_s3_endpoint_is_a_store_error():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    connection = Connection(
        kafka=KafkaAccess("127.0.0.1:9"),
        s3_endpoint=f"http://127.0.0.1:{port}",
        s3_access_key="k",
        s3_secret_key="s",
        s3_bucket="nowhere",
    )
    location = StoreLocation(s3_filesystem(connection, max_attempts=1), "nowhere/snapshots", "s3://nowhere/snapshots")
    store = SnapshotStore(location, JOB, key=UNSIGNED)
    with pytest.raises(StoreError, match=r"s3://nowhere/snapshots: listing checkpoints failed"):
        store.completed()
    with pytest.raises(StoreError, match=r"s3://nowhere/snapshots: writing checkpoint 1 task A failed"):
        store.write_task(1, 1, "A", TaskParts(state={"a": pa.table({"x": [1]})}))
    with pytest.raises(StoreError, match=r"s3://nowhere/snapshots: reading the manifest of checkpoint 1"):
        store.read_manifest(1)


@pytest.mark.integration
def test_snapshots_on_the_s3_server(connection, unique_name):
    ensure_bucket(connection)
    location = open_store(f"s3://{connection.s3_bucket}/tests/{unique_name}", connection)
    with SnapshotStore(location, JOB, key=UNSIGNED) as store:
        assert store.checkpoints() == [] and store.read_job() is None
        state = _state()
        futures = {
            t: store.write_task_async(
                1,
                1,
                t,
                TaskParts(
                    state=state, positions={"t:0": 3}, in_flight={"t:0": (3, 4)}, channel_records={"t:0": _records(3)}
                ),
            )
            for t in ("A", "B")
        }
        store.write_manifest(1, 1, {t: f.result(timeout=30) for t, f in futures.items()})
        _complete(store, 2)
        store.write_task(3, 1, "A", TaskParts(state={"old": pa.table({"x": [1]})}))
        store.write_task(3, 1, "A", TaskParts(state={"new": pa.table({"x": [2]})}))  # replaces it
        assert list(store.load_task(3, "A").state) == ["new"]
        stale = f"{location.root}/{JOB}/checkpoints/chk-00000003/A/state/old.parquet"
        assert location.filesystem.get_file_info(stale).type == pafs.FileType.NotFound
        assert store.checkpoints() == [1, 2, 3] and store.completed() == [1, 2]
        with pytest.raises(SnapshotMissingError):
            store.read_manifest(3)

        loaded = store.load_task(1, "B")
        assert all(loaded.state[n].equals(t) for n, t in state.items())
        assert loaded.channel_records["t:0"].equals(_records(3))

        # Damage chk-2 in place: the restore falls back to chk-1.
        part = f"{location.root}/{JOB}/checkpoints/chk-00000002/A/state/counts.parquet"
        with location.filesystem.open_output_stream(part) as out:
            out.write(b"not parquet")
        manifest, skipped = store.latest_verified()
        assert manifest.checkpoint_id == 1
        assert skipped[0][0] == 2 and "task A: part 'counts'" in skipped[0][1][0]

        assert store.apply_retention(keep=2) == []
        store.delete(2)
        assert store.checkpoints() == [1, 3] and store.completed() == [1]
        assert store.next_generation(1) == 1 and store.read_job().restores[0].from_checkpoint == 1


# ---- names, as the documents store them


@pytest.mark.parametrize(
    "options",
    [
        CheckpointOptions.aligned(),
        CheckpointOptions.unaligned(InFlightFormat.RECORDS),
        CheckpointOptions.at_least_once(),
        CheckpointOptions.aligned_with_timeout(200),
        CheckpointOptions.aligned_with_timeout(held_bytes_budget=4096),
        CheckpointOptions.aligned_with_timeout(200, 4096, InFlightFormat.RECORDS),
    ],
    ids=lambda o: o.describe(),
)
def test_options_are_stored_as_names_and_numbers_and_older_text_reads_back(options):
    stored = options_to_json(options)
    assert options_from_json(json.loads(json.dumps(stored))) == options
    assert all(" " not in str(v) for v in stored.values())  # names and numbers, no sentence
    # what versions before stored: describe()'s text, the format's value and a guarantee
    older = {"alignment": options.describe(), "in_flight": options.in_flight.value, "guarantee": "exactly-once"}
    assert options_from_json(older) == options
    assert options_as_stored(older) == stored


@pytest.mark.parametrize(
    "stored",
    [{}, {"alignment": "sideways"}, {"alignment": "aligned (unaligned after soon)"}, {"alignment": "aligned (x"}],
)
def test_options_that_read_as_none_are_a_value_error_and_copied_as_they_are(stored):
    with pytest.raises(ValueError):
        options_from_json(stored)
    assert options_as_stored(stored) == stored


def test_a_member_is_stored_by_its_name_and_read_from_its_name_or_older_value():
    kind = CheckpointKind.TIMED_OUT_TO_UNALIGNED
    assert stored_name(kind) == "timed_out_to_unaligned" and stored_name(Switch.LATE_BARRIER) == "late_barrier"
    for text in ("timed_out_to_unaligned", "TIMED_OUT_TO_UNALIGNED", "aligned, unaligned after the alignment timeout"):
        assert parse_stored(CheckpointKind, text) is kind
    assert parse_stored(CheckpointKind, "at-least-once") is parse_stored(CheckpointKind, "at_least_once")
    assert all(parse_stored(CheckpointKind, stored_name(k)) is k for k in CheckpointKind)
    assert all(parse_stored(Switch, s.value) is s for s in Switch)
    with pytest.raises(ValueError, match="'sideways' is not a CheckpointKind .*rescaled"):
        parse_stored(CheckpointKind, "sideways")
    assert text_of(CheckpointKind, "timed_out_to_unaligned") == kind.value
    assert text_of(CheckpointKind, "rescaled") == "rescaled" and text_of(CheckpointKind, "") == ""


def _point_part_at(store: SnapshotStore, cid: int, task: str, path: str, data: bytes) -> None:
    """Rewrite ``task``'s first state part in checkpoint ``cid``'s manifest
    and ``_TASK.json`` to ``path``, sized and checksummed as ``data``."""
    import hashlib

    for file in (_chk_dir(store, cid) / "_MANIFEST.json", _chk_dir(store, cid) / task / "_TASK.json"):
        doc = json.loads(file.read_text())
        snapshot = doc["tasks"][task] if "tasks" in doc else doc
        snapshot["state_parts"][0].update(path=path, bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
        file.write_text(json.dumps(doc))


def test_a_part_path_that_leaves_the_checkpoint_is_corrupt_and_a_restore_takes_an_older_one(store, tmp_path):
    """Before: a manifest whose part path climbed out with ``../`` (size
    and checksum of a file put there) verified, and a restore read the
    planted state."""
    import pyarrow.parquet as pq

    _complete(store, 1)
    _complete(store, 2)
    planted = tmp_path / "planted.parquet"
    pq.write_table(pa.table({"n": [666, 666]}), planted)
    climb = "../../../../planted.parquet"
    assert (_chk_dir(store, 2) / climb).resolve() == planted.resolve()
    _point_part_at(store, 2, "A", climb, planted.read_bytes())

    with pytest.raises(SnapshotCorruptError, match=r"checkpoint 2: manifest .* part path '\.\./\.\./\.\./\.\./planted"):
        store.read_manifest(2)
    with pytest.raises(SnapshotCorruptError, match=r"checkpoint 2 task A: .* part path '\.\./"):
        store.load_task(2, "A")
    (problem,) = store.verify(2)
    assert "is not one the layout writes (A/state/<file>.parquet" in problem
    manifest, skipped = store.latest_verified()
    assert manifest.checkpoint_id == 1 and [cid for cid, _ in skipped] == [2]
    assert store.load_task(1, "A").state["counts"]["n"].to_pylist() == [1, 1]


@pytest.mark.parametrize(
    "path",
    [
        "../planted.parquet",
        "A/state/../../B/state/counts.parquet",
        "/etc/passwd",
        "s3://elsewhere/A/state/counts.parquet",
        "file:///tmp/counts.parquet",
        "B/state/counts.parquet",  # another task's
        "A/channels/counts.parquet",  # a state part among channel parts
        "A/state/sub/counts.parquet",
        "A//state/counts.parquet",
        "A/state/..",
        "A/state/..\\..\\counts.parquet",
        "./A/state/counts.parquet",
        "A/state/counts.json",
    ],
)
def test_only_the_layouts_own_part_paths_are_read(path):
    snapshot = {
        "task": "A",
        "checkpoint_id": 1,
        "generation": 0,
        "state_parts": [{"name": "counts", "path": path, "rows": 1, "bytes": 1, "sha256": "x"}],
    }
    with pytest.raises(ValueError, match="is not one the layout writes"):
        TaskSnapshot.from_json(json.dumps(snapshot))
    link = {"checkpoint_id": 1, "kind": "base", "part": snapshot.pop("state_parts")[0]}
    with pytest.raises(ValueError, match="is not one the layout writes"):
        TaskSnapshot.from_json(json.dumps({**snapshot, "state_chains": {"counts": [link]}}))
    good = {**link["part"], "path": "A/state/counts%3Av2.parquet"}
    assert TaskSnapshot.from_json(json.dumps({**snapshot, "state_parts": [good]})).state_parts[0].path == good["path"]
