"""A worker's sink commits (``streaming.engine.worker.commits``): each sink
task commits a complete checkpoint and says so, the store asked once for
its manifest; a checkpoint the store has no manifest of commits nothing."""

from __future__ import annotations

from types import SimpleNamespace

from streaming.adapters.kafka.control.events import Committed, Complete
from streaming.engine.worker.commits import CheckpointCommits
from streaming.engine.worker.wiring import RunningTask
from streaming.errors import SnapshotMissingError


class _Store:
    def __init__(self, manifests: set[int]):
        self.manifests = manifests
        self.reads: list[int] = []

    def read_manifest(self, checkpoint_id: int) -> object:
        self.reads.append(checkpoint_id)
        if checkpoint_id not in self.manifests:
            raise SnapshotMissingError(f"no manifest of checkpoint {checkpoint_id}")
        return object()


class _Sink:
    def __init__(self):
        self.through: list[int] = []

    def commit_through(self, checkpoint_id: int) -> list[int]:
        self.through.append(checkpoint_id)
        return [checkpoint_id - 1, checkpoint_id]


def _running(name: str, sink: _Sink | None) -> RunningTask:
    return RunningTask(SimpleNamespace(spec=SimpleNamespace(name=name)), sink)  # type: ignore[arg-type]


def test_every_sink_task_commits_and_says_so_the_manifest_read_once():
    store, published, sinks = _Store({7}), [], [_Sink(), _Sink()]
    commits = CheckpointCommits(Complete(checkpoint_id=7, generation=2), 2, lambda: store, published.append)
    for running in (_running("a-0", sinks[0]), _running("b-0", None), _running("w-0", sinks[1])):
        commits.commit(running)
    assert [s.through for s in sinks] == [[7], [7]] and store.reads == [7]
    assert published == [
        Committed(checkpoint_id=7, task="a-0", generation=2, epochs=(6, 7)),
        Committed(checkpoint_id=7, task="w-0", generation=2, epochs=(6, 7)),
    ]


def test_a_checkpoint_the_store_has_no_manifest_of_commits_nothing(caplog):
    store, published, sink = _Store(set()), [], _Sink()
    commits = CheckpointCommits(Complete(checkpoint_id=9, generation=2), 2, lambda: store, published.append)
    commits.commit(_running("a-0", sink))
    commits.commit(_running("a-1", sink))
    assert sink.through == [] and published == [] and store.reads == [9]
    assert "the sinks commit nothing for it" in caplog.text
