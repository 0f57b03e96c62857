"""The object-store sink on a local filesystem and the real S3 server: output
appears only on commit, a commit is never written twice, recovery after a
crash between the manifest and the sink's commit gives each epoch exactly
once, and a restore to an older checkpoint takes back what came after it."""

from __future__ import annotations

import time

import pytest

from streaming import read_committed_output  # what a user reads output with
from streaming.adapters.sinks.base import Recovery
from streaming.adapters.sinks.object_store import ObjectStoreSink
from streaming.errors import SinkError


def _values(location) -> list[str]:
    table = read_committed_output(location)
    return [] if table is None else table["value"].to_pylist()


def test_object_store_sink_shows_an_epoch_only_after_commit(location, epoch_rows):
    sink = ObjectStoreSink(location, "task-0")
    sink.stage(1, epoch_rows(1))
    sink.stage(2, epoch_rows(2))
    assert _values(location) == []
    assert sink.staged_epochs() == [1, 2]
    assert sink.commit(1) is True
    assert _values(location) == ["1:0", "1:1", "1:2"]
    assert sink.staged_epochs() == [2]  # moved, not copied: a commit leaves nothing staged
    assert sink.commit(1) is False  # idempotent
    assert _values(location) == ["1:0", "1:1", "1:2"]


def test_a_commit_cut_short_after_the_copy_is_finished_by_the_next_one(location, epoch_rows):
    sink = ObjectStoreSink(location, "task-0")
    sink.stage(1, epoch_rows(1))
    # S3's move is a copy then a delete: the output exists and the staged file still does
    location.filesystem.create_dir(location.path("output", "epoch-000000000001"))
    location.filesystem.copy_file(location.path("staging", "epoch-000000000001", "task-0.parquet"), sink.output_path(1))
    assert sink.commit_through(1) == []
    assert sink.staged_epochs() == []
    assert _values(location) == ["1:0", "1:1", "1:2"]


def test_object_store_sink_recovery_commits_up_to_the_checkpoint_and_discards_the_rest(location, epoch_rows):
    crashed = ObjectStoreSink(location, "task-0")
    for epoch in (1, 2, 3):
        crashed.stage(epoch, epoch_rows(epoch, 2))
    crashed.commit(1)
    # Checkpoint 2 completed (manifest written) but the crash came before the
    # sink's commit; epoch 3 was staged by the run that failed.
    restarted = ObjectStoreSink(location, "task-0")
    assert restarted.recover(completed_checkpoint=2) == Recovery(committed=[2], discarded=[3])
    assert _values(location) == ["1:0", "1:1", "2:0", "2:1"]
    assert not restarted.recover(completed_checkpoint=2)
    restarted.stage(3, epoch_rows(3, 1))
    restarted.commit(3)
    assert _values(location) == ["1:0", "1:1", "2:0", "2:1", "3:0"]


def test_a_restore_to_an_older_checkpoint_takes_back_the_output_committed_after_it(location, epoch_rows):
    first = ObjectStoreSink(location, "task-0")
    other = ObjectStoreSink(location, "task-1")
    for epoch in (1, 2, 3):
        first.stage(epoch, epoch_rows(epoch, 1))
        first.commit(epoch)
    other.stage(3, epoch_rows(30, 1))
    other.commit(3)
    # restored from checkpoint 1: epochs 2 and 3 of task-0 go, task-1's epoch 3 is its own to take back
    restored = ObjectStoreSink(location, "task-0")
    before = time.time() - 1
    assert restored.recover(completed_checkpoint=1) == Recovery(retracted=[2, 3])  # committed: nothing staged
    retracted = location.filesystem.get_file_info(location.path("retracted", "epoch-000000000002", "task-0.parquet"))
    assert retracted.mtime.timestamp() >= before  # gc's grace period counts from the retraction
    assert _values(location) == ["1:0", "30:0"]
    assert ObjectStoreSink(location, "task-1").recover(completed_checkpoint=1).retracted == [3]
    assert _values(location) == ["1:0"]
    # the replay writes them again under the new generation's epochs
    restored.stage(4, epoch_rows(2, 1))
    restored.commit(4)
    assert _values(location) == ["1:0", "2:0"]


def test_committing_an_epoch_never_staged_is_a_clear_error(location):
    with pytest.raises(SinkError, match="epoch 7.*missing or unreadable"):
        ObjectStoreSink(location, "task-0").commit(7)
