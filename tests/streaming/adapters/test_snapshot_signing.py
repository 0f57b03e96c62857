"""The store's job files signed with the job's store key
(``streaming.adapters.snapshots.signing``), on a store in a directory: what a
writer of the store without the key can no longer make a restore read: an
edited manifest or ``_TASK.json`` (its checkpoint is corrupt, a restore
falls back past it), a manifest copied to another checkpoint, an unsigned
one, an edited ``_JOB.json`` (the job stops with the reason), and a
``_JOB.json`` put back to an older signed copy (a restore refuses to reuse
a generation the control topic already names)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from operators import KeyedAggregate, count
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore, TaskParts
from streaming.adapters.snapshots.signing import UNSIGNED, StoreSigner, Unsigned
from streaming.api.config import Connection, KafkaAccess
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.api.settings import JobSettings
from streaming.engine.restore import service as recovery
from streaming.engine.restore.service import RestoreService
from streaming.errors import JobFailed, SnapshotCorruptError

JOB = "ledger"
KEY = b"k" * 32


def _store(root: Path, key: bytes | Unsigned = KEY, name: str = "store") -> SnapshotStore:
    return SnapshotStore(open_store(f"file://{root}/{name}"), JOB, key=key)


def _checkpoint(store: SnapshotStore, checkpoint_id: int) -> None:
    snapshot = store.write_task(
        checkpoint_id,
        0,
        "count-0",
        TaskParts(state={"counts": pa.table({"k": ["a"], "n": [checkpoint_id]})}, positions={"in:0": checkpoint_id}),
    )
    store.write_manifest(checkpoint_id, 0, {"count-0": snapshot})


def _chk(root: Path, checkpoint_id: int) -> Path:
    return root / "store" / JOB / "checkpoints" / f"chk-{checkpoint_id:08d}"


def test_a_signed_file_is_still_json_and_verifies_only_as_written_and_where_written():
    signer = StoreSigner(JOB, KEY, "file:///stores/a")
    body = json.dumps({"format_version": 2, "job": JOB}, indent=2).encode()
    signed = signer.sign(body, "manifest", "5")
    assert json.loads(signed)["job"] == JOB  # any JSON reader still reads it
    assert signer.body(signed, "the manifest", "manifest", "5") == body
    with pytest.raises(SnapshotCorruptError, match="its signature does not match job ledger's key"):
        signer.body(signed.replace(b"ledger", b"ledgeR"), "the manifest", "manifest", "5")
    with pytest.raises(SnapshotCorruptError, match="copied from another place"):
        signer.body(signed, "the manifest", "manifest", "6")
    with pytest.raises(SnapshotCorruptError, match="signature does not match"):
        StoreSigner("another-job", KEY, "file:///stores/a").body(signed, "the manifest", "manifest", "5")
    with pytest.raises(SnapshotCorruptError, match="is not signed with job ledger's key"):
        signer.body(body, "the manifest", "manifest", "5")
    with pytest.raises(SnapshotCorruptError, match="or another store"):
        StoreSigner(JOB, KEY, "s3://staging/stores/a").body(signed, "the manifest", "manifest", "5")
    with pytest.raises(TypeError, match="UNSIGNED said explicitly"):
        StoreSigner(JOB, None, "file:///stores/a")  # type: ignore[arg-type]
    # UNSIGNED, said explicitly (unit tests, tools without the secret): nothing signed, a signed file still reads
    assert StoreSigner(JOB, UNSIGNED, "file:///stores/a").sign(body, "job") == body
    assert (
        json.loads(StoreSigner(JOB, UNSIGNED, "file:///stores/a").body(signed, "the manifest", "manifest", "5"))["job"]
        == JOB
    )


def test_an_edited_manifest_or_task_file_makes_its_checkpoint_corrupt_and_a_restore_falls_back(tmp_path):
    with _store(tmp_path) as store:
        store.first_generation()
        for checkpoint_id in (1, 2, 3):
            _checkpoint(store, checkpoint_id)
        assert store.latest_verified()[0].checkpoint_id == 3
        # checkpoint 3's manifest, its parts' checksums rewritten to match parts of the writer's own
        manifest = _chk(tmp_path, 3) / "_MANIFEST.json"
        manifest.write_text(manifest.read_text().replace('"generation": 0', '"generation": 1'))
        # checkpoint 2's task file
        task = _chk(tmp_path, 2) / "count-0" / "_TASK.json"
        task.write_text(task.read_text().replace('"in:0": 2', '"in:0": 0'))
        picked, skipped = store.latest_verified()
        assert picked.checkpoint_id == 1
        assert [c for c, _ in skipped] == [3, 2]
        assert "manifest" in skipped[0][1][0] and "its signature does not match job ledger's key" in skipped[0][1][0]
        assert "task count-0" in skipped[1][1][0] and "its signature does not match" in skipped[1][1][0]


def test_a_manifest_copied_to_another_checkpoint_or_written_unsigned_is_corrupt(tmp_path):
    with _store(tmp_path) as store:
        store.first_generation()
        _checkpoint(store, 1)
        _checkpoint(store, 2)
        shutil.copy(_chk(tmp_path, 1) / "_MANIFEST.json", _chk(tmp_path, 2) / "_MANIFEST.json")
        assert "copied from another place" in store.verify(2)[0]
        with _store(tmp_path / "other", key=UNSIGNED) as unsigned:  # a manifest the writer made whole
            _checkpoint(unsigned, 2)
        shutil.copy(_chk(tmp_path / "other", 2) / "_MANIFEST.json", _chk(tmp_path, 2) / "_MANIFEST.json")
        assert "is not signed with job ledger's key" in store.verify(2)[0]


def test_an_edited_job_history_stops_the_job_with_the_reason(tmp_path):
    with _store(tmp_path) as store:
        store.first_generation()
        store.next_generation(None)
        history = tmp_path / "store" / JOB / "_JOB.json"
        history.write_text(history.read_text().replace('"generation": 1', '"generation": 0', 1))
        with pytest.raises(SnapshotCorruptError, match="_JOB.json: its signature does not match job ledger's key"):
            store.read_job()


def test_a_job_history_put_back_to_an_older_signed_copy_is_refused_by_the_next_restore(tmp_path, monkeypatch):
    """The history is signed, so an older copy of it verifies: the newest
    generation the job's signed events name on the control topic tells a
    rolled-back one, and a restore that would reuse a number is refused."""
    monkeypatch.setattr(recovery, "earliest_offsets", lambda kafka, channels: {c: 0 for c in channels})
    pipeline = Pipeline(
        JOB, (Ingress("in", 1),), (Stage("count", ("in",), lambda: KeyedAggregate("k", {"n": count()}), sink=Sink()),)
    )
    connection = Connection(KafkaAccess("localhost:1"), "http://localhost:1", "key", "secret", "bucket")
    settings = JobSettings(store=f"file://{tmp_path}/store")
    with _store(tmp_path) as store:
        store.first_generation()
        history = tmp_path / "store" / JOB / "_JOB.json"
        older = history.read_bytes()
        store.next_generation(None)
        store.next_generation(None)  # generation 2 runs, and its events are on the control topic
        history.write_bytes(older)  # the store's writer puts generation 0's history back
        assert store.read_job().generation == 0  # it verifies: it is the job's own, only older
        restores = RestoreService(pipeline, store, settings, connection, generation_heard=lambda: 2)
        with pytest.raises(JobFailed, match=r"holds events of generation 2: the history was rolled back"):
            restores.prepare(None, {}, pipeline.scale, lambda: 9, "restart")
        assert history.read_bytes() == older  # nothing recorded
        # the history as it was: the restore goes on into generation 3
        store.next_generation(None)
        store.next_generation(None)
        assert restores.prepare(None, {}, pipeline.scale, lambda: 9, "restart").generation == 3


def test_a_checkpoint_copied_from_another_store_of_the_same_job_and_secret_does_not_verify(tmp_path):
    """Staging and production with the same secret and job name: a checkpoint of staging's store
    copied into production's is corrupt there, and a restore does not take it."""
    with _store(tmp_path, name="production") as production, _store(tmp_path, name="staging") as staging:
        production.first_generation()
        staging.first_generation()
        _checkpoint(production, 1)
        for checkpoint_id in (1, 2):
            _checkpoint(staging, checkpoint_id)
        copied = tmp_path / "production" / JOB / "checkpoints" / "chk-00000002"
        shutil.copytree(tmp_path / "staging" / JOB / "checkpoints" / "chk-00000002", copied)
        assert production.latest_verified()[0].checkpoint_id == 1
        assert staging.latest_verified()[0].checkpoint_id == 2
