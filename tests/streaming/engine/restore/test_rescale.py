"""A checkpoint rescaled, without Kafka or a store: which channels move
where, how state divides, which internal topics are new, and how channel
state is routed again (stale and control records left out)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from barriers.headers import GENERATION_HEADER
from barriers.lineage import Lineage
from barriers.messages import UNSIGNED, Barrier, ChannelId, encode
from spark_abs_examples import money as money_example
from spark_abs_examples.money import Balances
from streaming.adapters.serde import codec
from streaming.adapters.snapshots import LoadedTask, Manifest, TaskSnapshot
from streaming.api.pipeline import Ingress, Pipeline, Scale, Sink, Stage, parse_parallelism, route
from streaming.engine.restore.rescale import plan_rescale, scale_of, target_scale
from streaming.engine.task.watermarks import watermark_headers
from streaming.errors import ConfigError, RescaleError

HEADERS = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))
JOB = "j"
LEGS = f"spark-abs.{JOB}.legs"
ACCOUNTS = f"spark-abs.{JOB}.accounts"
INGRESS = f"{JOB}.transfers"


def records(channel: ChannelId, rows: list[tuple[int, bytes, list]]) -> pa.Table:
    """(offset, value, headers) of ``channel``."""
    return pa.table(
        {
            "topic": pa.array([channel.topic] * len(rows)),
            "partition": pa.array([channel.partition] * len(rows), pa.int32()),
            "offset": pa.array([r[0] for r in rows], pa.int64()),
            "key": pa.nulls(len(rows), pa.binary()),
            "value": pa.array([r[1] for r in rows], pa.binary()),
            "headers": pa.array([[{"key": k, "value": v} for k, v in r[2]] for r in rows], HEADERS),
            "timestamp": pa.nulls(len(rows), pa.timestamp("ms")),
        }
    )


def legs(*pairs: tuple[str, int]) -> bytes:
    (value,) = codec.encode_batches(pa.table({"account": [a for a, _ in pairs], "amount": [n for _, n in pairs]}))
    return value


def arrow(generation: int) -> list:
    return [(GENERATION_HEADER, str(generation).encode()), (codec.FORMAT_HEADER, codec.ARROW_FORMAT)]


def balances(rows: dict[str, int]) -> pa.Table:
    operator = Balances()
    operator.process(pa.table({"account": list(rows), "amount": list(rows.values())}))
    return operator.snapshot()["state"]


def snapshot(task, positions, *, in_flight=None, watermarks=None, lineage=None, generation=1):
    return TaskSnapshot(
        task,
        7,
        generation,
        positions={str(c): p for c, p in positions.items()},
        in_flight={str(c): r for c, r in (in_flight or {}).items()},
        metadata={
            "watermarks": {str(c): w for c, w in (watermarks or {}).items()},
            "lineage": (lineage or Lineage()).to_json(),
        },
    )


def checkpoint():
    """Checkpoint 7 of the demo (legs 2, accounts 2, windows 1) taken in
    generation 1 (restored at 3 on legs:0), with channel state on legs -> accounts."""
    lineage = Lineage().after_restore(1, {ChannelId(LEGS, 0): 3, ChannelId(LEGS, 3): 0})
    on_0 = ChannelId(LEGS, 0)  # legs-0 -> accounts-0
    on_2 = ChannelId(LEGS, 2)  # legs-1 -> accounts-0
    copied = records(
        on_0,
        [
            (4, legs(("a", 5), ("c", -5)), arrow(1)),
            (5, b"", watermark_headers(300, 1)),
            (6, legs(("e", 7)), arrow(1)),
        ],
    )
    ranged = [
        (10, legs(("a", 1)), arrow(0)),  # generation 0, after generation 1's cut at 9: stale
        (11, legs(("g", 2), ("a", -2)), arrow(1)),
        (12, b"", encode(Barrier(6, job=JOB), key=UNSIGNED)),
    ]
    stale_lineage = Lineage().after_restore(1, {on_0: 3, on_2: 9})
    loaded = {
        "legs-0": LoadedTask(snapshot("legs-0", {ChannelId(INGRESS, 0): 40}, lineage=lineage), {}, {}),
        "legs-1": LoadedTask(
            snapshot("legs-1", {ChannelId(INGRESS, 1): 41}, in_flight={ChannelId(INGRESS, 1): (30, 41)}),
            {},
            {},
        ),
        "accounts-0": LoadedTask(
            snapshot(
                "accounts-0",
                {on_0: 8, on_2: 14},
                in_flight={on_0: (4, 7), on_2: (10, 13)},
                watermarks={on_0: 250, on_2: 200},
                lineage=stale_lineage,
            ),
            {"state": balances({"a": 10, "b": -3})},
            {str(on_0): copied},
        ),
        "accounts-1": LoadedTask(
            snapshot(
                "accounts-1",
                {ChannelId(LEGS, 1): 5, ChannelId(LEGS, 3): 6},
                watermarks={ChannelId(LEGS, 1): 260, ChannelId(LEGS, 3): 240},
            ),
            {"state": balances({"c": 4, "d": -11, "e": 0})},
            {},
        ),
        "windows-0": LoadedTask(
            snapshot("windows-0", {ChannelId(ACCOUNTS, 0): 9, ChannelId(ACCOUNTS, 1): 9}),
            {},
            {},
        ),
    }
    ranges = {on_2: records(on_2, ranged)}
    manifest = Manifest(JOB, 7, 1, {n: t.snapshot for n, t in loaded.items()}, "now")
    return loaded, manifest, ranges


def read_from(ranges):
    def read(channel, start, end):
        table = ranges[channel]
        return table.filter(pc.and_(pc.greater_equal(table["offset"], start), pc.less(table["offset"], end)))

    return read


def test_parallelism_is_read_from_stage_equals_tasks():
    assert parse_parallelism("accounts=3, windows=2") == {"accounts": 3, "windows": 2}
    for bad in ("accounts", "accounts=0", "accounts=x", "=3"):
        with pytest.raises(ConfigError, match="stage=tasks"):
            parse_parallelism(bad)


def test_a_rescaled_pipeline_has_the_new_counts_and_topics():
    pipeline = money_example.pipeline(JOB)
    scaled = pipeline.rescaled(Scale({"accounts": 3}, {"legs": f"{LEGS}.g4"}))
    assert scaled.stage("accounts").parallelism == 3
    assert scaled.internal_topics() == {f"{LEGS}.g4": 6, ACCOUNTS: 3}
    assert Scale.from_json(scaled.scale.to_json()) == scaled.scale
    with pytest.raises(ConfigError, match="no stage nope"):
        pipeline.rescaled(Scale({"nope": 2}))
    with pytest.raises(ConfigError, match="not a stage another stage reads"):
        pipeline.rescaled(Scale({}, {"windows": "x"}))


def test_the_scale_of_a_checkpoint_comes_from_its_tasks_and_channels():
    _, manifest, _ = checkpoint()
    assert scale_of(manifest, money_example.pipeline(JOB)) == Scale(
        {"legs": 2, "accounts": 2, "windows": 1}, {"legs": LEGS, "accounts": ACCOUNTS}
    )


def test_only_topics_whose_ends_change_are_new():
    pipeline = money_example.pipeline(JOB)
    new = target_scale(pipeline, pipeline.scale, {"windows": 2}, 5)
    assert new.topics == {"legs": LEGS, "accounts": f"{ACCOUNTS}.g5"}
    same = target_scale(pipeline, pipeline.scale, {}, 5)
    assert same == pipeline.scale


def test_a_checkpoint_rescaled_from_two_to_three_accounts_tasks():
    loaded, manifest, ranges = checkpoint()
    pipeline = money_example.pipeline(JOB)
    old = scale_of(manifest, pipeline)
    new = target_scale(pipeline, old, {"accounts": 3}, 2)
    plan = plan_rescale(pipeline, 7, loaded, old, new, 2, read_from(ranges))
    assert sorted(plan.tasks) == ["accounts-0", "accounts-1", "accounts-2", "legs-0", "legs-1", "windows-0"]

    # legs keep their ingress channels, positions, channel state and lineage
    assert plan.tasks["legs-1"].positions == {ChannelId(INGRESS, 1): 41}
    assert plan.tasks["legs-1"].in_flight == {ChannelId(INGRESS, 1): (30, 41)}
    assert plan.tasks["legs-0"].lineage == Lineage.from_json(loaded["legs-0"].snapshot.metadata["lineage"])

    # balances follow their account
    state = {name: plan.tasks[f"accounts-{i}"].state["state"] for i, name in enumerate("012")}
    everything = pa.concat_tables(state.values())
    assert sorted(everything["account"].to_pylist()) == ["a", "b", "c", "d", "e"]
    assert pc.sum(everything["balance"]).as_py() == 0
    for index, table in enumerate(state.values()):
        assert route(table, "account", 3).to_pylist() == [index] * table.num_rows

    # channel state of the old topic, routed again onto the new one; stale and control records left out
    new_topic = f"{LEGS}.g2"
    assert new.topics["legs"] == new_topic
    rows = {c: pa.concat_tables(ts) for c, ts in plan.rerouted.items()}
    assert {c.topic for c in rows} == {new_topic}
    moved = pa.concat_tables(rows.values())
    assert sorted(zip(moved["account"].to_pylist(), moved["amount"].to_pylist())) == sorted(
        [("a", 5), ("c", -5), ("e", 7), ("g", 2), ("a", -2)]
    )
    for channel, table in rows.items():
        writer, reader = divmod(channel.partition, 3)
        assert route(table, "account", 3).to_pylist() == [reader] * table.num_rows
    # legs:0 came from legs-0, legs:2 from legs-1: each keeps its writer
    assert {c.partition // 3 for c, t in rows.items() if "e" in t["account"].to_pylist()} == {0}
    assert {c.partition // 3 for c, t in rows.items() if "g" in t["account"].to_pylist()} == {1}

    # the new channels start at 0 and, once written, hold that channel state as a range
    reader = plan.tasks["accounts-1"]
    assert set(reader.positions) == {ChannelId(new_topic, 1), ChannelId(new_topic, 4)}
    assert all(p == 0 for p in reader.positions.values())
    assert set(reader.watermarks.values()) == {200}  # the lowest of the old channels
    written = {c: (0, len(ts)) for c, ts in plan.rerouted.items()}
    plan.place(written)
    for task in plan.tasks.values():
        for channel, (start, end) in written.items():
            if channel in task.positions:
                assert task.positions[channel] == end and task.in_flight[channel] == (start, end)

    # windows keeps its state; its input is a new topic too (accounts now has three writers)
    assert new.topics["accounts"] == f"{ACCOUNTS}.g2"
    assert set(plan.tasks["windows-0"].positions) == {ChannelId(f"{ACCOUNTS}.g2", i) for i in range(3)}
    assert plan.rerouted_rows == 5


def test_state_of_a_stage_reading_an_ingress_topic_cannot_be_divided():
    pipeline = Pipeline(JOB, (Ingress("in", 4),), (Stage("sums", ("in",), Balances, parallelism=2, sink=Sink()),))
    loaded = {
        f"sums-{i}": LoadedTask(
            snapshot(f"sums-{i}", {ChannelId("in", p): 1 for p in range(4) if p % 2 == i}),
            {"state": balances({"a": i + 1})},
            {},
        )
        for i in range(2)
    }
    old = pipeline.scale
    new = target_scale(pipeline, old, {"sums": 3}, 2)
    with pytest.raises(RescaleError, match="reads ingress topic in, whose partitions"):
        plan_rescale(pipeline, 7, loaded, old, new, 2, read_from({}))


def test_a_rescale_plan_as_restore_dry_run_shows_it():
    from streaming.tools.views import render_rescale_plan

    loaded, manifest, ranges = checkpoint()
    pipeline = money_example.pipeline(JOB)
    old = scale_of(manifest, pipeline)
    plan = plan_rescale(pipeline, 7, loaded, old, target_scale(pipeline, old, {"accounts": 3}, 2), 2, read_from(ranges))
    text = render_rescale_plan(plan)
    assert "checkpoint 7: accounts=2, legs=2, windows=1 -> accounts=3, legs=2, windows=1 (generation 2)" in text
    assert f"new topic {LEGS}.g2 (6 partition(s)) for the output of legs" in text
    assert "5 rows of unaligned channel state routed again by key" in text
    assert all(f"accounts-{i}" in text for i in range(3))
