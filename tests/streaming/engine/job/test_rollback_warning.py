"""Going back past completed checkpoints with a Kafka sink is said on the
runner's console, not only in a worker's log: what the sink committed after
the restored checkpoint cannot be taken back."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest

from spark_abs_examples.money import pipeline
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore, TaskParts
from streaming.api.pipeline import Sink
from streaming.engine.job.runner import JobRunner


def _runner(tmp_path: Path, sink: Sink, completed: list[int]) -> SimpleNamespace:
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), "money")
    for checkpoint_id in completed:
        snap = store.write_task(checkpoint_id, 0, "windows-0", TaskParts(state={}, positions={}))
        store.write_manifest(checkpoint_id, 0, {"windows-0": snap})
    log = logging.LoggerAdapter(logging.getLogger("streaming.engine.job.runner"), {"job": "money"})
    return SimpleNamespace(job="money", pipeline=pipeline("money", sink=sink), store=store, log=log)


def test_going_back_past_completed_checkpoints_with_a_kafka_sink_is_a_warning(tmp_path, caplog):
    runner = _runner(tmp_path, Sink("kafka", "money.balances"), [3, 4, 5])
    with caplog.at_level(logging.WARNING, logger="streaming.engine.job.runner"):
        JobRunner._warn_of_a_rollback(runner, 3)
    (said,) = [r.getMessage() for r in caplog.records]
    assert "going back to checkpoint 3, while checkpoint(s) up to 5 completed" in said
    assert "money.balances" in said and "read_kafka_output" in said and "superseded" in said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="streaming.engine.job.runner"):
        JobRunner._warn_of_a_rollback(runner, None)  # from the beginning: every completed one is gone back past
    assert "going back to the beginning, while checkpoint(s) up to 5 completed" in caplog.records[0].getMessage()


@pytest.mark.parametrize(("sink", "restored"), [(Sink("kafka", "money.balances"), 5), (Sink(), 3)])
def test_no_warning_at_the_newest_checkpoint_or_for_the_object_store_sink(tmp_path, caplog, sink, restored):
    runner = _runner(tmp_path, sink, [3, 4, 5])
    with caplog.at_level(logging.WARNING, logger="streaming.engine.job.runner"):
        JobRunner._warn_of_a_rollback(runner, restored)  # the object-store sink takes its output back
    assert not caplog.records
