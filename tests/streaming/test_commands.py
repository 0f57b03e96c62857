"""`spark-abs checkpoints` on a local store: each checkpoint verified, the one
a restore would pick marked; and `spark-abs run`'s help."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pyarrow as pa

from streaming.commands import checkpoint_rows, render_checkpoints
from streaming.snapshots import SnapshotStore
from streaming.store import open_store

JOB = "orders"


def _write(store: SnapshotStore, cid: int, *, complete: bool = True) -> None:
    snap = store.write_task(cid, 0, "valid-0", {"counts": pa.table({"n": [cid, 2, 3]})},
                            positions={"orders:0": 10 * cid}, in_flight={"orders:0": (10 * cid - 4, 10 * cid)})
    if complete:
        store.write_manifest(cid, 0, {"valid-0": snap}, metrics={"kinds": ["unaligned"], "trigger_to_complete_s": 0.5})


def _store(tmp_path: Path) -> tuple[SnapshotStore, str]:
    uri = f"file://{tmp_path}/store"
    store = SnapshotStore(open_store(uri), JOB)
    for cid in (1, 2):
        _write(store, cid)
    _write(store, 3, complete=False)
    # damage checkpoint 2's state part: it no longer verifies
    part = next((tmp_path / "store" / JOB / "checkpoints" / "chk-00000002").rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-9] + b"corrupted")
    return store, uri


def test_every_checkpoint_is_verified_and_the_restore_pick_is_marked(tmp_path):
    store, _ = _store(tmp_path)
    rows = checkpoint_rows(store)
    store.close()
    assert [(r.checkpoint_id, r.complete, r.usable) for r in rows] == [(1, True, True), (2, True, False),
                                                                       (3, False, False)]
    assert rows[0].in_flight_offsets == 4 and rows[0].kinds == ("unaligned",) and rows[0].state_bytes > 0
    assert any("checksum" in p for p in rows[1].problems), rows[1].problems
    text = render_checkpoints(JOB, rows, 0).splitlines()
    line = {int(t.split()[0]): t for t in text if t.strip()[:1].isdigit()}
    assert line[1].endswith("yes   <- a restore picks this one")
    assert "NO:" in line[2] and "checksum" in line[2]
    assert "NO: no manifest: never completed" in line[3]


def test_nothing_usable_says_a_restore_starts_from_the_beginning(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB)
    _write(store, 1, complete=False)
    text = render_checkpoints(JOB, checkpoint_rows(store), 0)
    store.close()
    assert "a restore would start from the beginning" in text
    assert render_checkpoints(JOB, [], None) == "job orders: no checkpoints in the store"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streaming.cli", *args], capture_output=True, text=True, timeout=60)


def test_the_checkpoints_command(tmp_path):
    _, uri = _store(tmp_path)
    done = _cli("checkpoints", "--store", uri, "--job", JOB)
    assert done.returncode == 0, done.stderr
    assert "<- a restore picks this one" in done.stdout and "never completed" in done.stdout


def test_run_explains_itself_and_names_a_bad_option(tmp_path):
    helped = _cli("run", "--help")
    assert helped.returncode == 0 and "--restore N" in helped.stdout and "module:attribute" in helped.stdout
    bad = _cli("--home", str(tmp_path), "run", "orders:orders", "--store", f"file://{tmp_path}/s",
               "--mode", "aligned-timeout")
    assert bad.returncode == 2 and "aligned-timeout needs alignment_timeout_ms" in bad.stderr
    assert "Traceback" not in bad.stderr
    for flag in ("--for", "--checkpoints"):
        zero = _cli("--home", str(tmp_path), "run", "orders:orders", "--store", f"file://{tmp_path}/s", flag, "0")
        assert zero.returncode == 2 and f"{flag} must be positive, got 0" in zero.stderr, zero.stderr
