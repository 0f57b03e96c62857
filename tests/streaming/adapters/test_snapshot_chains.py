"""Incremental checkpoints in the store: state tables kept as chains (a base,
then each later checkpoint's changes), read back whole, verified link by
link, and kept by retention as long as a kept checkpoint links to them."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pytest

from operators import KeyedState
from operators.state import KEYS_METADATA
from streaming.adapters.snapshots import SnapshotStore, TaskParts, TaskSnapshot

JOB = "counts"


def _chk_dir(store: SnapshotStore, cid: int) -> Path:
    return Path(store.layout.checkpoint_dir(cid))


def _counts(state: KeyedState, *pairs: tuple[str, int]) -> None:
    def add(rows: pa.Table) -> pa.Table:
        grouped = rows.group_by("k", use_threads=False).aggregate([("n", "sum")])
        return pa.table({"k": grouped["k"], "n": grouped["n_sum"]})

    state.merge(pa.table({"k": [k for k, _ in pairs], "n": [n for _, n in pairs]}), add)


def _write(store: SnapshotStore, cid: int, previous: TaskSnapshot | None, state: KeyedState) -> TaskSnapshot:
    """What a task of an incremental job writes: a base when there is no
    previous snapshot, its changes linked after the previous chain otherwise."""
    changes = state.changes()
    if previous is None or changes.full:
        steps = [("base", state.snapshot())]
    else:
        steps = [*previous.state_chains["counts"], ("removed", changes.removed), ("upserts", changes.upserts)]
    snapshot = store.write_task(cid, 1, "A", TaskParts(positions={"t:0": cid}, chains={"counts": steps}))
    store.write_manifest(cid, 1, {"A": snapshot})
    return snapshot


def _chain(store: SnapshotStore) -> tuple[KeyedState, list[TaskSnapshot]]:
    """Checkpoints 1 (base), 2 and 3 (changes) of one task's counts."""
    state, written = KeyedState(["k"], ["n"]), []
    _counts(state, ("a", 1), ("b", 1), ("c", 1))
    written.append(_write(store, 1, None, state))
    _counts(state, ("b", 5), ("d", 1))
    written.append(_write(store, 2, written[-1], state))
    state.pop(pa.array([True, False, False, False]))  # a goes
    _counts(state, ("e", 2), ("a", 7))  # and comes back, after the others
    written.append(_write(store, 3, written[-1], state))
    return state, written


def test_a_chain_reads_back_as_the_whole_table_in_the_state_s_order(store) -> None:
    state, written = _chain(store)
    assert [link.kind for link in written[2].state_chains["counts"]] == [
        "base",
        "removed",
        "upserts",
        "removed",
        "upserts",
    ]
    assert written[2].needs() == {1, 2}
    loaded = store.load_task(3, "A").state["counts"]
    assert loaded.select(["k", "n"]).to_pylist() == state.table.to_pylist()
    assert store.load_task(2, "A").state["counts"].select(["k", "n"]).to_pylist() == [
        {"k": "a", "n": 1},
        {"k": "b", "n": 6},
        {"k": "c", "n": 1},
        {"k": "d", "n": 1},
    ]
    # checkpoint 3 stored only what changed after checkpoint 2
    own = [p for p in written[2].parts]
    assert sum(p.rows for p in own) == 3  # a removed; e and a put in
    assert json.loads((_chk_dir(store, 3) / "A" / "_TASK.json").read_text())["format_version"] == 2


def test_a_damaged_link_fails_every_checkpoint_that_reads_it_and_the_restore_falls_back(store) -> None:
    _chain(store)
    part = _chk_dir(store, 2) / "A" / "state" / "counts.upserts-2.parquet"
    part.write_bytes(part.read_bytes()[:-3] + b"\x00\x00\x00")
    assert store.verify(1) == []
    assert any("a link of its chain" in problem and "checksum" in problem for problem in store.verify(3))
    picked, skipped = store.latest_verified()
    assert picked is not None and picked.checkpoint_id == 1
    assert [checkpoint for checkpoint, _ in skipped] == [3, 2]


def test_retention_keeps_what_a_kept_checkpoint_links_to(store) -> None:
    state, written = _chain(store)
    assert store.apply_retention(1) == []  # 3 is kept, and it reads 1 and 2
    assert store.completed() == [1, 2, 3]
    _counts(state, ("f", 1))
    assert store.write_task(4, 1, "A", TaskParts(chains={"counts": [("base", state.snapshot())]}))
    store.write_manifest(4, 1, {"A": store.reader.required_task(4, "A")})
    assert store.apply_retention(1) == [1, 2, 3]  # a new base: nothing links to the old chain
    assert store.load_task(4, "A").state["counts"].num_rows == 6


def test_an_aborted_checkpoint_a_later_one_links_to_is_kept(store) -> None:
    state, written = _chain(store)
    # checkpoint 4's task wrote its changes, but the checkpoint never completed
    _counts(state, ("b", 1))
    changes = state.changes()
    steps = [*written[2].state_chains["counts"], ("removed", changes.removed), ("upserts", changes.upserts)]
    four = store.write_task(4, 1, "A", TaskParts(chains={"counts": steps}))
    _counts(state, ("c", 1))
    changes = state.changes()
    five = store.write_task(
        5, 1, "A", TaskParts(chains={"counts": [*four.state_chains["counts"], ("upserts", changes.upserts)]})
    )
    store.write_manifest(5, 1, {"A": five})
    assert store.apply_retention(1) == []
    assert store.checkpoints() == [1, 2, 3, 4, 5]
    assert store.load_task(5, "A").state["counts"].select(["k", "n"]).to_pylist() == state.table.to_pylist()


def test_a_chain_is_refused_unless_it_starts_with_its_one_base(store) -> None:
    upserts = pa.table({"k": ["a"], "n": [1]}).replace_schema_metadata({KEYS_METADATA: '["k"]'})
    with pytest.raises(ValueError, match="must start with its one base"):
        store.write_task(1, 1, "A", TaskParts(chains={"counts": [("upserts", upserts)]}))
    with pytest.raises(ValueError, match="given whole and as a chain"):
        store.write_task(1, 1, "A", TaskParts(state={"counts": upserts}, chains={"counts": [("base", upserts)]}))
    assert store.checkpoints() == []
