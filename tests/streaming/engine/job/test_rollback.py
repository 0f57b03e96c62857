"""Going back past completed checkpoints with a Kafka sink is said on the
runner's console (``streaming.engine.job.rollback``), not only in a worker's log: what the sink committed after
the restored checkpoint cannot be taken back.  Checkpoints an earlier
restore already left behind do not count again."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from spark_abs_examples.money import pipeline
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskParts
from streaming.api.pipeline import Sink
from streaming.engine.job.rollback import warn_of_a_rollback

LOGGER = "streaming.engine.job.runner"


class _Runner:
    """What of a JobRunner the warning reads: its job, pipeline, store and log."""

    def __init__(self, tmp_path: Path, sink: Sink):
        self.job = "money"
        self.pipeline = pipeline("money", sink=sink)
        self.store = SnapshotStore(open_store(f"file://{tmp_path}/store"), "money", key=UNSIGNED)
        self.store.first_generation()
        self.log = logging.LoggerAdapter(logging.getLogger(LOGGER), {"job": "money"})

    def complete(self, generation: int, *checkpoint_ids: int) -> None:
        for checkpoint_id in checkpoint_ids:
            snap = self.store.write_task(checkpoint_id, generation, "windows-0", TaskParts(state={}, positions={}))
            self.store.write_manifest(checkpoint_id, generation, {"windows-0": snap})


def _said(caplog, runner: _Runner, checkpoint_id: int | None, generation: int) -> list[str]:
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=LOGGER):
        warn_of_a_rollback(runner.log, runner.pipeline, runner.store, checkpoint_id, generation)
    return [r.getMessage() for r in caplog.records]


def test_going_back_past_completed_checkpoints_with_a_kafka_sink_is_a_warning(tmp_path, caplog):
    runner = _Runner(tmp_path, Sink("kafka", "money.balances"))
    runner.complete(0, 3, 4, 5)
    (said,) = _said(caplog, runner, 3, 1)
    assert "going back to checkpoint 3, while checkpoint(s) up to 5 completed" in said
    assert "money.balances" in said and "read_kafka_output" in said and "superseded" in said
    (said,) = _said(caplog, runner, None, 1)  # from the beginning: every completed one is gone back past
    assert "going back to the beginning, while checkpoint(s) up to 5 completed" in said


def test_checkpoints_an_earlier_restore_left_behind_do_not_count_again(tmp_path, caplog):
    runner = _Runner(tmp_path, Sink("kafka", "money.balances"))
    runner.complete(0, 3, 4, 5)
    runner.store.next_generation(3)  # generation 1 went back to checkpoint 3: 4 and 5 are off the line
    assert _said(caplog, runner, 3, 1) != []  # that restore itself is warned of ...
    # ... but generation 1 failing before a checkpoint of its own, and restoring 3 again, is not a rollback
    assert _said(caplog, runner, 3, 2) == []
    runner.complete(1, 6)
    (said,) = _said(caplog, runner, 3, 2)  # going back past 6, of generation 1, is one
    assert "while checkpoint(s) up to 6 completed" in said


@pytest.mark.parametrize(("sink", "restored"), [(Sink("kafka", "money.balances"), 5), (Sink(), 3)])
def test_no_warning_at_the_newest_checkpoint_or_for_the_object_store_sink(tmp_path, caplog, sink, restored):
    runner = _Runner(tmp_path, sink)
    runner.complete(0, 3, 4, 5)
    assert _said(caplog, runner, restored, 1) == []  # the object-store sink takes its output back itself


def test_a_store_that_cannot_say_is_a_warning_not_a_failed_restore(tmp_path, caplog):
    runner = _Runner(tmp_path, Sink("kafka", "money.balances"))
    runner.complete(0, 3, 4)
    (tmp_path / "store" / "money" / "checkpoints" / "chk-00000004" / "_MANIFEST.json").write_text("{not json")
    (said,) = _said(caplog, runner, 3, 1)
    assert said.startswith("job money: cannot tell whether this restore goes back past committed output")
