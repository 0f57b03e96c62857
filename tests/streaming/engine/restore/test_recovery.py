"""``RestoreService`` on a store in a directory, without Kafka (every offset
taken as still held): a restore into a changed pipeline is refused before
anything is recorded, or written first as a checkpoint of kind ``changed``
that the new generation restores."""

from __future__ import annotations

import pyarrow as pa
import pytest

from barriers.messages import ChannelId
from operators import KeyedAggregate, count
from spark_abs_examples.changing import pipeline as changing_pipeline
from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore
from streaming.api.config import Connection, KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.restore import service as recovery
from streaming.engine.restore.changes import AllowDropped
from streaming.engine.restore.service import RestoreService
from streaming.errors import PipelineChangeError
from support.checkpoints import write_checkpoint

JOB = "j"
CONNECTION = Connection(KafkaAccess("localhost:1"), "http://localhost:1", "key", "secret", "bucket")


def counted(keys: list[str], column: str = "n") -> dict[str, pa.Table]:
    operator = KeyedAggregate("key", {column: count()})
    operator.process(pa.table({"key": keys}))
    return operator.snapshot()


@pytest.fixture
def store(tmp_path, monkeypatch):
    monkeypatch.setattr(recovery, "earliest_offsets", lambda kafka, channels: {c: 0 for c in channels})
    store = SnapshotStore(open_store(f"file://{tmp_path}/store"), JOB, key=UNSIGNED)
    store.first_generation(scale=changing_pipeline(JOB, "added").scale.to_json())
    state = {"seen-0": counted(["a", "b"], "seen"), "counts-0": counted(["a", "a", "b"])}
    write_checkpoint(store, changing_pipeline(JOB, "added"), 4, 0, state, position=20)
    yield store
    store.close()


def service(store, tmp_path, allow=None) -> RestoreService:
    settings = JobSettings(store=f"file://{tmp_path}/store")
    return RestoreService(changing_pipeline(JOB, "base"), store, settings, CONNECTION, allow, lambda: None)


def prepare(restores: RestoreService):
    return restores.prepare(None, {}, changing_pipeline(JOB, "base").scale, lambda: 9, "restart")


def test_a_refused_change_records_nothing(store, tmp_path):
    with pytest.raises(PipelineChangeError, match=r"stage seen \(removed\)"):
        prepare(service(store, tmp_path))
    assert store.read_job().generation == 0 and store.checkpoints() == [4]


def test_an_allowed_change_is_written_as_a_checkpoint_the_new_generation_restores(store, tmp_path):
    restores = service(store, tmp_path, AllowDropped.of(["seen"]))
    plan = prepare(restores)
    assert (plan.generation, plan.checkpoint_id, plan.changed_from, plan.rewritten) == (1, 9, 4, True)
    assert store.read_job().restores[-1].changed_from == 4
    restores.write(plan)
    manifest = store.read_manifest(9)
    assert sorted(manifest.tasks) == ["clean-0", "counts-0"]
    assert manifest.metrics["kinds"] == ["changed"] and manifest.metrics["changed_from"] == 4
    assert {c["stage"]: c["change"] for c in manifest.metrics["changes"]} == {"counts": "inputs", "seen": "removed"}
    counts = store.load_task(9, "counts-0")
    # counts keeps its state, and reads clean's topic where seen stood
    assert counts.state["state"].to_pylist() == [{"key": "a", "n": 2}, {"key": "b", "n": 1}]
    assert counts.snapshot.positions == {str(ChannelId(f"spark-abs.{JOB}.clean", 0)): 20}
    assert counts.snapshot.metadata["kind"] == "changed"
    # restored again, the changed checkpoint is the pipeline's own: nothing to change
    again = restores.prepare(9, {}, plan.scale, lambda: 10, "restart")
    assert (again.checkpoint_id, again.change, again.rescale) == (9, None, None)
