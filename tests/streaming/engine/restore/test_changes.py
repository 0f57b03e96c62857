"""A checkpoint compared with a changed pipeline, without Kafka or a store:
stages matched by name, added stages empty, removed ones refused unless
allowed, a changed state schema refused with both schemas named, and the
edges whose reader changed (handed over, or a new topic from the beginning)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from barriers.lineage import Lineage
from barriers.messages import ChannelId
from operators import KeyedAggregate, count, max_, sum_
from streaming.adapters.snapshots import LoadedTask, Manifest, TaskSnapshot
from streaming.api.pipeline import Ingress, Pipeline, Sink, Stage
from streaming.engine.restore.changes import AllowDropped, Change, plan_change
from streaming.errors import PipelineChangeError

JOB = "j"
EVENTS = f"{JOB}.events"
CLEAN = f"spark-abs.{JOB}.clean"


def _passthrough():
    from operators.stateless import Passthrough

    return Passthrough()


def _counts():
    return KeyedAggregate("key", {"n": count()})


def pipeline(*stages: Stage, partitions: int = 1) -> Pipeline:
    return Pipeline(JOB, (Ingress(EVENTS, partitions),), stages)


CLEAN_STAGE = Stage("clean", (EVENTS,), _passthrough, key="key")
BASE = pipeline(CLEAN_STAGE, Stage("counts", ("clean",), _counts, sink=Sink()))
ADDED = pipeline(
    CLEAN_STAGE,
    Stage("seen", ("clean",), _counts, key="key"),
    Stage("counts", ("seen",), _counts, sink=Sink()),
)


def counted(keys: list[str]) -> dict[str, pa.Table]:
    operator = _counts()
    operator.process(pa.table({"key": keys}))
    return operator.snapshot()


def checkpoint(
    of: Pipeline,
    *,
    state: dict[str, dict[str, pa.Table]] | None = None,
    in_flight: dict[str, dict[ChannelId, tuple[int, int]]] | None = None,
    position: int = 10,
) -> tuple[Manifest, dict[str, LoadedTask]]:
    """Checkpoint 7 of ``of`` (generation 1): every channel at ``position``."""
    tasks, loaded = {}, {}
    for spec in of.tasks():
        flight = (in_flight or {}).get(spec.name, {})
        lineage = Lineage().after_restore(1, {c: 3 for c in spec.inputs})
        snapshot = TaskSnapshot(
            spec.name,
            7,
            1,
            positions={str(c): position for c in spec.inputs},
            in_flight={str(c): r for c, r in flight.items()},
            metadata={"watermarks": {str(c): 100 for c in spec.inputs}, "lineage": lineage.to_json()},
        )
        tasks[spec.name] = snapshot
        loaded[spec.name] = LoadedTask(snapshot, dict((state or {}).get(spec.name, {})), {})
    manifest = Manifest(JOB, 7, 1, tasks, "2026-01-01T00:00:00Z")
    return manifest, loaded


def plan(new: Pipeline, manifest, loaded, **options):
    return plan_change(new, manifest, loaded.__getitem__, 2, **options)


def fates(change) -> dict[str, tuple[Change, bool]]:
    return {s.stage: (s.change, s.refusal is not None) for s in change.stages}


def test_the_same_pipeline_changes_nothing_and_loads_one_task_per_stage():
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])})
    asked = []
    change = plan_change(BASE, manifest, lambda n: asked.append(n) or loaded[n], 2)
    assert not change.changed and change.tasks == {}
    assert fates(change) == {"clean": (Change.KEPT, False), "counts": (Change.KEPT, False)}
    assert sorted(asked) == ["clean-0", "counts-0"]
    change.check()


def test_a_stage_inserted_takes_over_the_edge_and_its_reader_reads_a_new_topic_from_the_beginning():
    on = ChannelId(CLEAN, 0)
    manifest, loaded = checkpoint(
        BASE, state={"counts-0": counted(["a", "a", "b"])}, in_flight={"counts-0": {on: (8, 10)}}
    )
    change = plan(ADDED, manifest, loaded)
    change.check()
    assert fates(change) == {
        "clean": (Change.KEPT, False),
        "seen": (Change.ADDED, False),
        "counts": (Change.INPUTS, False),
    }
    seen, counts = change.tasks["seen-0"], change.tasks["counts-0"]
    # seen starts empty, on clean's topic where counts stood, with counts's channel state there
    assert seen.state == {}
    assert seen.positions == {on: 10} and seen.in_flight == {on: (8, 10)} and seen.watermarks == {on: 100}
    assert seen.lineage.restores == ((1, {on: 3}),)
    # counts keeps its state and reads seen's output on a topic of generation 2, from its beginning
    new_topic = ChannelId(f"spark-abs.{JOB}.seen.g2", 0)
    assert counts.state["state"].to_pylist() == [{"key": "a", "n": 2}, {"key": "b", "n": 1}]
    assert counts.positions == {new_topic: 0} and counts.in_flight == {}
    assert change.scale.topics == {"clean": CLEAN, "seen": new_topic.topic}
    assert "reads clean where counts stood" in change.stages[1].action


def test_a_stage_added_at_the_end_reads_the_old_last_stage_from_a_new_topic():
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])})
    longer = pipeline(
        CLEAN_STAGE,
        Stage("counts", ("clean",), _counts, key="key"),
        Stage("top", ("counts",), lambda: KeyedAggregate("key", {"top": max_("n")}), sink=Sink()),
    )
    change = plan(longer, manifest, loaded)
    change.check()
    assert fates(change)["top"] == (Change.ADDED, False) and fates(change)["counts"] == (Change.KEPT, False)
    assert change.tasks["top" + "-0"].positions == {ChannelId(f"spark-abs.{JOB}.counts.g2", 0): 0}
    assert change.tasks["counts-0"].positions == {ChannelId(CLEAN, 0): 10}


def test_a_removed_stage_with_state_is_refused_until_its_state_may_be_dropped():
    manifest, loaded = checkpoint(ADDED, state={"seen-0": counted(["a", "b"]), "counts-0": counted(["a"])})
    change = plan(BASE, manifest, loaded)
    assert fates(change)["seen"] == (Change.REMOVED, True)
    with pytest.raises(
        PipelineChangeError, match=r"stage seen \(removed\): .*2 row\(s\) of state \(table state\)"
    ) as err:
        change.check()
    assert "--allow-dropped-state seen" in str(err.value)

    for allow in (AllowDropped.of(["seen"]), AllowDropped.everything()):
        allowed = plan(BASE, manifest, loaded, allow=allow)
        allowed.check()
        assert fates(allowed)["seen"] == (Change.REMOVED, False)
        # counts takes seen's place on clean's topic, keeping its own state
        assert allowed.tasks["counts-0"].positions == {ChannelId(CLEAN, 0): 10}
        assert allowed.tasks["counts-0"].state["state"].num_rows == 1
        assert sorted(allowed.tasks) == ["clean-0", "counts-0"]
    assert fates(plan(BASE, manifest, loaded, allow=AllowDropped.of(["counts"])))["seen"] == (Change.REMOVED, True)


def test_a_removed_stateless_stage_goes_quietly_but_its_output_in_flight_is_dropped_state():
    manifest, loaded = checkpoint(ADDED, state={"counts-0": counted(["a"])})
    assert fates(plan(BASE, manifest, loaded))["seen"] == (Change.REMOVED, False)
    in_flight = {"counts-0": {ChannelId(f"spark-abs.{JOB}.seen", 0): (5, 10)}}
    manifest, loaded = checkpoint(ADDED, state={"counts-0": counted(["a"])}, in_flight=in_flight)
    refused = plan(BASE, manifest, loaded)
    assert [s.stage for s in refused.refusals] == ["seen"]
    assert "5 record(s) of channel state" in refused.refusals[0].refusal


def test_a_changed_state_schema_is_refused_with_both_schemas():
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a", "b"])})
    summing = pipeline(
        CLEAN_STAGE, Stage("counts", ("clean",), lambda: KeyedAggregate("key", {"total": sum_("n")}), sink=Sink())
    )
    change = plan(summing, manifest, loaded)
    assert fates(change) == {"clean": (Change.KEPT, False), "counts": (Change.STATE_SCHEMA, True)}
    with pytest.raises(PipelineChangeError) as err:
        change.check()
    message = str(err.value)
    assert "stored state(key: string, n: int64)" in message
    assert "snapshots state(key, total)" in message
    assert "--allow-dropped-state counts" in message
    # allowed: the stage starts empty, everything else as it was
    allowed = plan(summing, manifest, loaded, allow=AllowDropped.of(["counts"]))
    allowed.check()
    assert allowed.tasks["counts-0"].state == {} and allowed.tasks["counts-0"].positions == {ChannelId(CLEAN, 0): 10}


def test_a_state_check_can_be_left_out():
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])})
    summing = pipeline(
        CLEAN_STAGE, Stage("counts", ("clean",), lambda: KeyedAggregate("key", {"total": sum_("n")}), sink=Sink())
    )
    assert not plan(summing, manifest, loaded, check_state=False).changed


def test_a_new_reader_with_another_task_count_gets_a_new_topic_and_cannot_take_channel_state():
    on = ChannelId(CLEAN, 0)
    wide = pipeline(
        CLEAN_STAGE,
        Stage("seen", ("clean",), _counts, key="key", parallelism=2),
        Stage("counts", ("seen",), _counts, sink=Sink()),
    )
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])})
    aligned = plan(wide, manifest, loaded)
    aligned.check()
    clean_g2 = f"spark-abs.{JOB}.clean.g2"
    assert aligned.tasks["seen-1"].positions == {ChannelId(clean_g2, 1): 0}
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])}, in_flight={"counts-0": {on: (8, 10)}})
    refused = plan(wide, manifest, loaded)
    assert [s.stage for s in refused.refusals] == ["seen"]
    assert "2 record(s) of unaligned channel state" in refused.refusals[0].refusal


def test_a_new_stage_reading_an_ingress_topic_starts_at_the_cut_and_a_new_topic_at_the_beginning():
    on = ChannelId(EVENTS, 0)
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])}, in_flight={"clean-0": {on: (8, 10)}})
    audit = Stage("audit", (EVENTS,), _counts, sink=Sink())
    other = Stage("others", ("other",), _counts, sink=Sink())
    wider = Pipeline(JOB, (Ingress(EVENTS, 1), Ingress("other", 1)), (*BASE.stages, audit, other))
    change = plan(wider, manifest, loaded)
    change.check()
    # the cut, without the channel state clean had not processed yet (it stays clean's)
    assert change.tasks["audit-0"].positions == {on: 10} and change.tasks["audit-0"].in_flight == {}
    assert change.tasks["clean-0"].in_flight == {on: (8, 10)}
    assert change.tasks["others-0"].positions == {} and change.tasks["others-0"].state == {}
    assert "reads events from the checkpoint's cut" in change.stages[2].action.replace(EVENTS, "events")
    assert "reads other from the beginning of other" in change.stages[3].action


def test_changing_a_kept_stages_task_count_with_the_pipeline_is_refused():
    manifest, loaded = checkpoint(BASE, state={"counts-0": counted(["a"])})
    change = plan(ADDED, manifest, loaded, counts={"counts": 2, "seen": 1})
    assert fates(change)["counts"] == (Change.TASKS, True)
    assert "then rescale it" in change.refusals[0].refusal
    # a new stage's count may be chosen
    assert plan(ADDED, manifest, loaded, counts={"clean": 1, "counts": 1, "seen": 1}).refusals == ()
