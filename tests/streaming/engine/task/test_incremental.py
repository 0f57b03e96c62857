"""Incremental snapshots in the stage task: a base at the task's first
checkpoint and every ``base_every``, only the keys a checkpoint's batches
touched in between, and a base again after changes that could not be
stored; each checkpoint reads back as the operator's whole state."""

from __future__ import annotations

from pathlib import Path

import pytest
from task_cases import batch, make_task
from test_task import counting_pipeline

from barriers.messages import Barrier, CancelBarrier, CheckpointOptions
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.engine.task.uploads import Incremental


@pytest.fixture
def store(tmp_path: Path):
    with SnapshotStore(open_store(str(tmp_path / "snapshots")), "job", key=UNSIGNED) as snapshots:
        yield snapshots


def _checkpoint(task, n: int, *accounts: str) -> None:
    """Records of ``accounts`` on channel 0, then barrier ``n`` on both channels."""
    offset = 100 * n
    records = [("in", 0, offset + i, {"account": a, "amount": 1}) for i, a in enumerate(accounts)]
    task.process_batch(
        batch(*records, ("in", 0, offset + 99, Barrier(n, job="job")), ("in", 1, n, Barrier(n, job="job")))
    )
    task.wait_for_uploads()


def _stored_rows(store: SnapshotStore, n: int) -> list[dict]:
    return store.load_task(n, "count-0").state["state"].select(["account", "n"]).to_pylist()


def test_checkpoints_store_a_base_then_only_the_keys_touched(store) -> None:
    task, io = make_task(counting_pipeline(), incremental=Incremental(base_every=3))
    task.io.write_snapshot = store.write_task
    _checkpoint(task, 1, *[f"a{i}" for i in range(50)])
    _checkpoint(task, 2, "a3", "a7", "new")
    _checkpoint(task, 3, "a3")
    _checkpoint(task, 4, "a9")
    snaps = {n: store.reader.required_task(n, "count-0") for n in (1, 2, 3, 4)}
    assert [snaps[n].state_kind for n in (1, 2, 3, 4)] == ["base", "changes", "changes", "base"]
    assert [link.part.rows for link in snaps[2].state_chains["state"]] == [50, 3]  # the base, then a3, a7, new
    assert snaps[3].needs() == {1, 2} and snaps[3].state_bytes < snaps[1].state_bytes
    expected = task.operator.snapshot()["state"].select(["account", "n"]).to_pylist()
    assert _stored_rows(store, 4) == expected
    assert {r["account"]: r["n"] for r in _stored_rows(store, 3)}["a3"] == 3
    assert [e.kind for e in io.events].count("ack") == 4


def test_after_changes_that_could_not_be_stored_the_next_checkpoint_is_a_base(store) -> None:
    task, io = make_task(counting_pipeline(), incremental=Incremental(base_every=100))
    failures = iter([OSError("the store is down")])

    def write(checkpoint_id, *args, **kwargs):
        if checkpoint_id == 2:
            raise next(failures)
        return store.write_task(checkpoint_id, *args, **kwargs)

    task.io.write_snapshot = write
    _checkpoint(task, 1, "a", "b")
    _checkpoint(task, 2, "a")  # declined: its changes (a) are stored nowhere
    _checkpoint(task, 3, "c")
    assert [e.kind for e in io.events if e.kind != "announce"] == ["ack", "decline", "ack"]
    assert store.reader.required_task(3, "count-0").state_kind == "base"
    assert {r["account"]: r["n"] for r in _stored_rows(store, 3)} == {"a": 2, "b": 1, "c": 1}
    _checkpoint(task, 4, "b")
    assert store.reader.required_task(4, "count-0").state_kind == "changes"
    assert {r["account"]: r["n"] for r in _stored_rows(store, 4)} == {"a": 2, "b": 2, "c": 1}


def test_changes_counted_from_an_aborted_snapshot_are_declined_and_a_base_follows(store) -> None:
    """Unaligned: checkpoint 2's snapshot is taken at its first barrier, then
    the checkpoint is cancelled; checkpoint 3's changes follow 2's snapshot,
    which was never stored, so 3 is declined and 4 stores a base."""
    task, io = make_task(counting_pipeline(), incremental=Incremental(base_every=100))
    task.io.write_snapshot = store.write_task
    unaligned = CheckpointOptions.unaligned()
    _checkpoint(task, 1, "a", "b")
    task.process_batch(
        batch(("in", 0, 200, {"account": "a", "amount": 1}), ("in", 0, 201, Barrier(2, job="job", options=unaligned)))
    )
    task.process_batch(batch(("in", 1, 200, CancelBarrier(2, job="job", reason="test"))))
    task.wait_for_uploads()
    for n in (3, 4):
        task.process_batch(
            batch(
                ("in", 0, 100 * n, {"account": "c", "amount": 1}),
                ("in", 0, 100 * n + 1, Barrier(n, job="job")),
                ("in", 1, 100 * n, Barrier(n, job="job")),
            )
        )
        task.wait_for_uploads()
    declines = [e for e in io.events if e.kind == "decline"]
    assert [e.checkpoint_id for e in declines] == [2, 3]
    assert "follow checkpoint 2" in declines[1].detail and "stores the whole state" in declines[1].detail
    assert store.reader.required_task(4, "count-0").state_kind == "base"
    assert {r["account"]: r["n"] for r in _stored_rows(store, 4)} == {"a": 2, "b": 1, "c": 2}
