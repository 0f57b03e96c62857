"""A worker's sink commits (``streaming.engine.worker.commits``): its sink
tasks commit on a ``complete`` event only when the store holds the
checkpoint's manifest, read once: what a restore could start from.  A store
that does not answer for a while is waited for, not taken for a missing
manifest."""

from __future__ import annotations

from types import SimpleNamespace

from spark_abs_examples import money
from streaming.adapters.kafka.control.events import Committed, Complete
from streaming.api.config import Connection, KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.worker.commits import CheckpointCommits
from streaming.engine.worker.wiring import RunningTask
from streaming.engine.worker.worker import Worker
from streaming.errors import SnapshotMissingError, StoreError


class _Store:
    """The manifests of ``complete`` checkpoints, and how often each was read."""

    def __init__(self, complete: set[int], away: int = 0):
        self.complete = complete
        self.away = away  # reads that find the store unreachable first
        self.reads: list[int] = []

    def read_manifest(self, checkpoint_id: int):
        self.reads.append(checkpoint_id)
        if self.away:
            self.away -= 1
            raise StoreError("the store did not answer (connection refused)")
        if checkpoint_id not in self.complete:
            raise SnapshotMissingError(f"checkpoint {checkpoint_id} has no manifest")
        return object()


class _Sink:
    def __init__(self):
        self.through: list[int] = []

    def commit_through(self, checkpoint_id: int) -> list[int]:
        self.through.append(checkpoint_id)
        return [checkpoint_id]


def test_a_complete_without_a_manifest_in_the_store_commits_nothing():
    pipeline = money.pipeline("sinks")
    connection = Connection(KafkaAccess("127.0.0.1:9"), "http://127.0.0.1:9", "a", "b", "bucket")
    worker = Worker(pipeline, ["windows-0"], JobSettings(store="file:///x"), connection, generation=3, restore=None)
    worker.store = _Store({7}, away=1)  # type: ignore[assignment]
    published: list = []
    worker.control = SimpleNamespace(publish=published.append)  # type: ignore[assignment]
    sinks = [_Sink(), _Sink()]
    task = SimpleNamespace(on_control=lambda event: None, spec=SimpleNamespace(name="windows-0"))
    worker.running = [RunningTask(task, sink) for sink in sinks]  # type: ignore[arg-type]

    worker._on_control(Complete(checkpoint_id=9, generation=3))  # no manifest of 9: nothing commits
    assert [s.through for s in sinks] == [[], []] and published == []
    worker._on_control(Complete(checkpoint_id=7, generation=3))
    assert [s.through for s in sinks] == [[7], [7]]
    assert [(e.checkpoint_id, e.epochs) for e in published if isinstance(e, Committed)] == [(7, (7,)), (7, (7,))]
    # once per event, not per sink task; the store away at first is waited for, as a commit waits
    assert worker.store.reads == [9, 9, 7]


def _running(name: str, sink: _Sink | None) -> RunningTask:
    return RunningTask(SimpleNamespace(spec=SimpleNamespace(name=name)), sink)  # type: ignore[arg-type]


def test_every_sink_task_commits_and_says_so_the_manifest_read_once():
    store, published, sinks = _Store({7}), [], [_Sink(), _Sink()]
    commits = CheckpointCommits(Complete(checkpoint_id=7, generation=2), 2, lambda: store, published.append)
    for running in (_running("a-0", sinks[0]), _running("b-0", None), _running("w-0", sinks[1])):
        commits.commit(running)
    assert [s.through for s in sinks] == [[7], [7]] and store.reads == [7]
    assert published == [
        Committed(checkpoint_id=7, task="a-0", generation=2, epochs=(7,)),
        Committed(checkpoint_id=7, task="w-0", generation=2, epochs=(7,)),
    ]


def test_a_checkpoint_the_store_has_no_manifest_of_commits_nothing(caplog):
    store, published, sink = _Store(set()), [], _Sink()
    commits = CheckpointCommits(Complete(checkpoint_id=9, generation=2), 2, lambda: store, published.append)
    commits.commit(_running("a-0", sink))
    commits.commit(_running("a-1", sink))
    assert sink.through == [] and published == [] and store.reads == [9]
    assert "the sinks commit nothing for it" in caplog.text
