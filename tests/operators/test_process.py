"""KeyedProcess, the keyed operator users write with per-key state and
event-time timers: against a plain-Python model, independent of how the
input is cut into batches, resumed exactly from a snapshot, divided among a
new number of tasks, and its edges (late rows, null keys, timers that
register timers, clear(), restore errors, bad arguments)."""

from __future__ import annotations

from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from operator_cases import KEYS_INT, KEYS_STR, maybe_null, table

from operators import DeadLetter, DeadLetters, InputSchemaError, OperatorConfigError, OperatorError, StateRestoreError
from operators.process import KeyContext, KeyedProcess, KeyedProcessFunction
from operators.rescale import split_state
from operators.testing import Watermark, assert_resumes_exactly, parquet_roundtrip, run
from streaming.api.pipeline import route as assign  # how the upstream stages route rows to tasks

PROFILE = settings.get_profile("operators")
GAP = 10  # the session timeout: a key's session ends GAP ms of event time after its last row
OP = "KeyedProcess"


class SessionTotals(KeyedProcessFunction):
    """Sums ``v`` per key; after each row emits the running total; a timer at
    the key's last time + GAP emits the total and ends the session.  A fold:
    the same whether a key's rows come in one call or several."""

    def process_rows(self, key, rows, ctx):
        total, last = ctx.state.get("total", 0), ctx.state.get("last")
        out = []
        for row in rows:
            total += row["v"]
            last = row["t"] if last is None else max(last, row["t"])
            out.append({"k": key, "kind": "update", "total": total, "at": row["t"]})
        for timer in ctx.timers():
            ctx.delete_timer(timer)
        ctx.state.update(total=total, last=last)
        ctx.register_timer(last + GAP)
        return out

    def on_timer(self, key, timestamp, ctx):
        total = ctx.state["total"]
        ctx.clear()
        return [{"k": key, "kind": "timeout", "total": total, "at": timestamp}]


def schema_of(key_type: pa.DataType) -> pa.Schema:
    return pa.schema([("k", key_type), ("kind", pa.string()), ("total", pa.int64()), ("at", pa.int64())])


def sessions(key_type: pa.DataType | None = None):
    """A factory of session operators; with ``key_type``, a declared output schema."""
    schema = schema_of(key_type) if key_type is not None else None
    return lambda: KeyedProcess("k", SessionTotals, time_column="t", output_schema=schema)


def row_schema(keys: list) -> pa.Schema:
    return pa.schema([("k", pa.string() if keys is KEYS_STR else pa.int64()), ("t", pa.int64()), ("v", pa.int64())])


@st.composite
def process_steps(draw, *, nulls: bool = True, max_steps: int = 8) -> list:
    keys = draw(st.sampled_from([KEYS_STR, KEYS_INT]))
    key = st.sampled_from(keys)
    time = st.integers(-20, 120)
    row = st.fixed_dictionaries(
        {"k": maybe_null(key) if nulls else key, "t": maybe_null(time) if nulls else time, "v": st.integers(-5, 5)}
    )
    batch = st.lists(row, max_size=8).map(lambda rows: table(rows, row_schema(keys)))
    step = st.one_of(batch, batch, st.integers(-20, 150).map(Watermark))
    return draw(st.lists(step, max_size=max_steps))


def sessions_model(steps: list):
    """Expected outputs and dead letters of KeyedProcess("k", SessionTotals, time_column="t")."""
    watermark = None
    state: dict[Any, dict[str, int]] = {}
    timers: dict[Any, int] = {}
    outputs, letters = [], []
    for step in steps:
        out = []
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
            for at, k in sorted((at, k) for k, at in timers.items() if at <= watermark):
                out.append({"k": k, "kind": "timeout", "total": state.pop(k)["total"], "at": at})
                del timers[k]
        else:
            rows = step.to_pylist()
            letters += [DeadLetter(r, "null_key", OP) for r in rows if r["k"] is None]
            rows = [r for r in rows if r["k"] is not None]
            letters += [DeadLetter(r, "null_event_time", OP) for r in rows if r["t"] is None]
            rows = [r for r in rows if r["t"] is not None]
            letters += [DeadLetter(r, "late", OP) for r in rows if watermark is not None and r["t"] < watermark]
            rows = [r for r in rows if watermark is None or r["t"] >= watermark]
            order = list(dict.fromkeys(r["k"] for r in rows))
            for k in order:
                for r in (r for r in rows if r["k"] == k):
                    s = state.setdefault(k, {"total": 0, "last": r["t"]})
                    s["total"] += r["v"]
                    s["last"] = max(s["last"], r["t"])
                    out.append({"k": k, "kind": "update", "total": s["total"], "at": r["t"]})
                timers[k] = state[k]["last"] + GAP
        outputs.append(out)
    return outputs, letters


# -- properties ------------------------------------------------------------


def key_type_of(steps: list) -> pa.DataType:
    """The key type of the batches among ``steps`` (one for all; string if none)."""
    return next((s.schema.field("k").type for s in steps if isinstance(s, pa.Table)), pa.string())


@PROFILE
@given(process_steps(), st.booleans())
def test_matches_the_model(steps, declared) -> None:
    key_type = key_type_of(steps) if declared else None
    result = run(sessions(key_type)(), steps)
    expected_outputs, expected_letters = sessions_model(steps)
    assert [t.to_pylist() for t in result.outputs] == expected_outputs
    assert list(result.dead_letters) == expected_letters
    if declared:
        assert all(t.schema == schema_of(key_type) for t in result.outputs)


@st.composite
def cut_twice(draw) -> tuple[list, list]:
    """The same rows and watermark steps, the rows between two watermark
    steps cut into batches in two random ways."""
    keys = draw(st.sampled_from([KEYS_STR, KEYS_INT]))
    row = st.fixed_dictionaries(
        {"k": maybe_null(st.sampled_from(keys)), "t": maybe_null(st.integers(0, 100)), "v": st.integers(-5, 5)}
    )
    segments = draw(st.lists(st.one_of(st.integers(0, 130).map(Watermark), st.lists(row, max_size=10)), max_size=6))
    runs: tuple[list, list] = ([], [])
    for segment in segments:
        for steps in runs:
            if isinstance(segment, Watermark):
                steps.append(segment)
                continue
            bounds = sorted(draw(st.lists(st.integers(0, len(segment)), max_size=4)))
            for start, end in zip([0, *bounds], [*bounds, len(segment)]):
                steps.append(table(segment[start:end], row_schema(keys)))
    return runs


def by_segment(steps: list, outputs: tuple[pa.Table, ...]) -> list[Any]:
    """Per watermark step its output exactly; between two, the multiset of rows."""
    parts: list[Any] = [Counter()]
    for step, output in zip(steps, outputs):
        rows = output.to_pylist()
        if isinstance(step, Watermark):
            parts += [rows, Counter()]
        else:
            parts[-1].update(tuple(sorted(r.items())) for r in rows)
    return parts


@PROFILE
@given(cut_twice())
def test_output_does_not_depend_on_how_rows_are_cut_into_batches(runs) -> None:
    first, second = runs
    a, b = run(sessions()(), first), run(sessions()(), second)
    assert by_segment(first, a.outputs) == by_segment(second, b.outputs)
    assert Counter((repr(sorted(l.row.items())), l.reason) for l in a.dead_letters) == Counter(
        (repr(sorted(l.row.items())), l.reason) for l in b.dead_letters
    )


def assert_snapshot_frozen(make, steps, cut) -> None:
    operator = make()
    run(operator, steps[:cut])
    snapshot = operator.snapshot()
    frozen = {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()}
    run(operator, steps[cut:])
    assert {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()} == frozen


def assert_restore_round_trips(make, steps, cut) -> None:
    operator = make()
    run(operator, steps[:cut])
    snapshot = parquet_roundtrip(operator.snapshot())
    again = make()
    again.restore(snapshot)
    assert {n: t.to_pylist() for n, t in again.snapshot().items()} == {n: t.to_pylist() for n, t in snapshot.items()}


@PROFILE
@given(st.data(), st.booleans())
def test_resumes_exactly(data, declared) -> None:
    steps = data.draw(process_steps())
    cut = data.draw(st.integers(0, len(steps)))
    make = sessions(key_type_of(steps) if declared else None)
    assert_resumes_exactly(make, steps, cut)
    assert_snapshot_frozen(make, steps, cut)
    assert_restore_round_trips(make, steps, cut)


@PROFILE
@given(st.data())
def test_heartbeats_resume_exactly(data) -> None:
    """Timers that register timers, across a snapshot."""
    steps = data.draw(process_steps(nulls=False))
    assert_resumes_exactly(lambda: KeyedProcess("k", Heartbeat), steps, data.draw(st.integers(0, len(steps))))


@PROFILE
@given(st.data(), st.integers(0, 60), st.integers(0, 200))
def test_state_divided_among_three_tasks_fires_the_same_timers(data, early, late) -> None:
    """Two tasks' snapshots divided among three (as a rescale does) restore
    into fresh operators that, given the rest of the input routed anew, emit
    what one operator given everything emits."""
    keys = data.draw(st.sampled_from([KEYS_STR, KEYS_INT]))
    row = st.fixed_dictionaries({"k": st.sampled_from(keys), "t": st.integers(0, 100), "v": st.integers(-5, 5)})
    before = table(data.draw(st.lists(row, max_size=16)), row_schema(keys))
    after = table(data.draw(st.lists(row, max_size=8)), row_schema(keys))
    make = sessions()

    def routed(rows: pa.Table, parts: int) -> list[pa.Table]:
        targets = assign(rows, "k", parts)
        return [rows.filter(pc.equal(targets, index)) for index in range(parts)]

    def emitted(operator, steps) -> list[dict]:
        return run(operator, steps).rows()

    whole = make()
    expected_before = emitted(whole, [before, Watermark(early)])
    expected_after = emitted(whole, [after, Watermark(early + late)])
    old, got_before = [make(), make()], []
    for operator, rows in zip(old, routed(before, 2)):
        got_before += emitted(operator, [rows, Watermark(early)])
    divided = split_state([parquet_roundtrip(o.snapshot()) for o in old], 3, ["k"], assign)
    got_after = []
    for index, (state, rows) in enumerate(zip(divided, routed(after, 3))):
        for name in ("state", "timers"):
            assert set(assign(state[name], "k", 3).to_pylist()) <= {index}
        operator = make()
        operator.restore(state)
        got_after += emitted(operator, [rows, Watermark(early + late)])

    def key(r):
        return (r["at"], str(r["k"]), r["kind"], r["total"])

    assert sorted(got_before, key=key) == sorted(expected_before, key=key)
    assert sorted(got_after, key=key) == sorted(expected_after, key=key)


# -- process ---------------------------------------------------------------


class Recorder(KeyedProcessFunction):
    """Emits one row per call: the key, its rows' ``t``, the watermark seen."""

    def process_rows(self, key, rows, ctx):
        ctx.state["calls"] = ctx.state.get("calls", 0) + 1
        return [{"k": key, "ts": [r["t"] for r in rows], "calls": ctx.state["calls"], "wm": ctx.watermark}]


def batch(rows, schema=None) -> pa.Table:
    return pa.Table.from_pylist(
        [dict(zip(["k", "t", "v"], r)) for r in rows],
        schema=schema or pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())]),
    )


def test_one_call_per_key_in_order_of_first_row_with_rows_in_batch_order() -> None:
    op = KeyedProcess("k", Recorder)
    out = op.process(batch([("b", 1, 0), ("a", 2, 0), ("b", 3, 0), ("c", 4, 0), ("a", 5, 0)]))
    assert out.to_pylist() == [
        {"k": "b", "ts": [1, 3], "calls": 1, "wm": None},
        {"k": "a", "ts": [2, 5], "calls": 1, "wm": None},
        {"k": "c", "ts": [4], "calls": 1, "wm": None},
    ]
    op.on_watermark(3)
    assert op.process(batch([("a", 1, 0)])).to_pylist() == [{"k": "a", "ts": [1], "calls": 2, "wm": 3}]


def test_rows_carry_every_column() -> None:
    seen = []

    class Keep(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            seen.extend(rows)

    KeyedProcess("k", Keep).process(pa.table({"k": ["a"], "x": [1.5], "y": [[1, 2]]}))
    assert seen == [{"k": "a", "x": 1.5, "y": [1, 2]}]


def test_null_keys_go_to_the_dead_letters() -> None:
    op = KeyedProcess("k", Recorder)
    out = op.process(batch([(None, 1, 0), ("a", 2, 0), (None, 3, 0)]))
    assert [r["k"] for r in out.to_pylist()] == ["a"]
    assert [(l.row["t"], l.reason, l.operator) for l in op.dead_letters.drain()] == [
        (1, "null_key", OP),
        (3, "null_key", OP),
    ]


def test_rows_behind_the_watermark_are_late_and_rows_never_move_it() -> None:
    op = KeyedProcess("k", Recorder, time_column="t")
    op.process(batch([("a", 100, 0)]))
    assert op.watermark is None
    op.on_watermark(50)
    out = op.process(batch([("a", 49, 1), ("b", 50, 2), ("a", None, 3), ("a", 51, 4)]))
    assert [(r["k"], r["ts"]) for r in out.to_pylist()] == [("b", [50]), ("a", [51])]
    assert [(l.row["v"], l.reason) for l in op.dead_letters.drain()] == [(3, "null_event_time"), (1, "late")]
    assert op.on_watermark(20).num_rows == 0 and op.watermark == 50  # never goes back


def test_without_a_time_column_no_row_is_late() -> None:
    op = KeyedProcess("k", Recorder)
    op.on_watermark(50)
    assert op.process(batch([("a", 1, 0), ("a", None, 0)])).num_rows == 1
    assert op.dead_letters.drain() == []


def test_timestamp_time_columns_compare_in_whole_milliseconds() -> None:
    class Keys(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            return [{"k": key}]

    def at(values, unit):
        return pa.array(values, pa.int64()).cast(pa.timestamp(unit))

    op = KeyedProcess("k", Keys, time_column="ts")
    op.on_watermark(2)
    out = op.process(pa.table({"k": ["a", "b", "c"], "ts": at([1_999, 2_000, 2_001], "us")}))
    assert [r["k"] for r in out.to_pylist()] == ["b", "c"]
    assert [l.row["k"] for l in op.dead_letters.drain()] == ["a"]
    seconds = KeyedProcess("k", Keys, time_column="ts")
    seconds.on_watermark(1_500)
    assert [r["k"] for r in seconds.process(pa.table({"k": ["a", "b"], "ts": at([1, 2], "s")})).to_pylist()] == ["b"]
    with pytest.raises(InputSchemaError, match="expected integer milliseconds"):
        op.process(pa.table({"k": ["a"], "ts": ["noon"]}))


def test_dead_letters_can_be_shared() -> None:
    shared = DeadLetters()
    op = KeyedProcess("k", Recorder, dead_letters=shared)
    op.process(batch([(None, 1, 0)]))
    assert op.dead_letters is shared and len(shared) == 1


# -- timers ----------------------------------------------------------------


class Heartbeat(KeyedProcessFunction):
    """A key's first row starts three beats, 5 ms apart: each timer emits and
    registers the next."""

    def process_rows(self, key, rows, ctx):
        if "beats" not in ctx.state:
            ctx.state["beats"] = 0
            ctx.register_timer(min(r["t"] for r in rows) + 5)

    def on_timer(self, key, timestamp, ctx):
        ctx.state["beats"] += 1
        if ctx.state["beats"] < 3:
            ctx.register_timer(timestamp + 5)
        return [{"k": key, "at": timestamp, "beat": ctx.state["beats"]}]


def test_timers_that_register_timers_fire_in_the_same_call_in_timestamp_then_key_order() -> None:
    op = KeyedProcess("k", Heartbeat)
    op.process(batch([("b", 0, 0), ("a", 2, 0), ("c", 5, 0)]))
    assert [(r["k"], r["at"], r["beat"]) for r in op.on_watermark(12).to_pylist()] == [
        ("b", 5, 1),
        ("a", 7, 1),
        ("b", 10, 2),
        ("c", 10, 1),
        ("a", 12, 2),
    ]
    assert [(r["k"], r["at"]) for r in op.on_watermark(100).to_pylist()] == [("b", 15), ("c", 15), ("a", 17), ("c", 20)]
    assert op.on_watermark(1_000).num_rows == 0  # each timer fires once
    assert [op.timers_of(k) for k in "abc"] == [[], [], []]


def test_a_timer_behind_the_watermark_fires_at_the_next_on_watermark_call() -> None:
    op = KeyedProcess("k", Heartbeat)
    op.on_watermark(100)
    op.process(batch([("a", 0, 0)]))  # registers 5, long passed
    assert op.timers_of("a") == [5]
    out = op.on_watermark(50)  # does not move the watermark, still fires what is due
    assert [(r["at"], r["beat"]) for r in out.to_pylist()] == [(5, 1), (10, 2), (15, 3)]
    assert op.watermark == 100


def test_registering_a_timer_twice_fires_it_once_and_deleting_it_never() -> None:
    class Twice(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            for r in rows:
                ctx.register_timer(r["t"])
            if key == "gone":
                ctx.delete_timer(rows[0]["t"])
                ctx.delete_timer(12345)  # no such timer: nothing happens
            ctx.state["seen"] = True

        def on_timer(self, key, timestamp, ctx):
            return [{"k": key, "at": timestamp, "left": ctx.timers()}]

    op = KeyedProcess("k", Twice)
    op.process(batch([("a", 7, 0), ("a", 7, 0), ("gone", 3, 0)]))
    op.process(batch([("a", 7, 0), ("a", 9, 0)]))
    assert op.on_watermark(10).to_pylist() == [{"k": "a", "at": 7, "left": [9]}, {"k": "a", "at": 9, "left": []}]


def test_deleting_timers_in_on_timer_and_heap_compaction() -> None:
    class Churn(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            for timer in ctx.timers():
                ctx.delete_timer(timer)
            ctx.register_timer(rows[-1]["t"] + 1_000)
            ctx.register_timer(rows[-1]["t"] + 2_000)

        def on_timer(self, key, timestamp, ctx):
            ctx.clear()  # the later timer never fires
            return [{"k": key, "at": timestamp}]

    op = KeyedProcess("k", Churn)
    for t in range(300):
        op.process(batch([("a", t, 0), ("b", t, 0)]))
    assert len(op._heap) <= 4 * 2 + 64  # deleted timers do not pile up
    assert op.on_watermark(10_000).to_pylist() == [{"k": "a", "at": 1_299}, {"k": "b", "at": 1_299}]
    assert op.snapshot()["timers"].num_rows == 0


def test_clear_drops_state_and_timers() -> None:
    class Clearing(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            ctx.state["n"] = ctx.state.get("n", 0) + len(rows)
            ctx.register_timer(100)
            if any(r["v"] < 0 for r in rows):
                ctx.clear()
            return [{"k": key, "n": ctx.state.get("n"), "timers": ctx.timers()}]

        def on_timer(self, key, timestamp, ctx):
            return [{"k": key, "n": ctx.state["n"], "timers": [timestamp]}]

    op = KeyedProcess("k", Clearing)
    op.process(batch([("a", 0, 1), ("b", 0, 1)]))
    out = op.process(batch([("a", 0, -1)]))
    assert out.to_pylist() == [{"k": "a", "n": None, "timers": []}]
    assert op.state_of("a") == {} and op.timers_of("a") == []
    assert op.snapshot()["state"]["k"].to_pylist() == ["b"]
    assert op.on_watermark(100).to_pylist() == [{"k": "b", "n": 1, "timers": [100]}]


def test_a_key_with_nothing_left_is_forgotten_and_the_next_keys_bring_their_type() -> None:
    op = KeyedProcess("k", SessionTotals, time_column="t")
    op.process(batch([("a", 0, 1)]))
    op.on_watermark(GAP)
    snapshot = op.snapshot()
    assert snapshot["state"].num_rows == 0 and snapshot["timers"].num_rows == 0
    ints = pa.schema([("k", pa.int32()), ("t", pa.int64()), ("v", pa.int64())])
    assert op.process(batch([(7, 20, 1)], ints)).to_pylist()[0]["k"] == 7
    assert op.snapshot()["state"].schema.field("k").type == pa.int32()


# -- state -----------------------------------------------------------------


def test_state_goes_through_json_after_every_call() -> None:
    class Shapes(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            seen = dict(ctx.state)
            ctx.state = {"pair": (1, 2), 3: "three"}
            return [{"seen": repr(seen)}]

    op = KeyedProcess("k", Shapes)
    op.process(batch([("a", 0, 0)]))
    out = op.process(batch([("a", 0, 0)]))
    assert out.to_pylist() == [{"seen": repr({"pair": [1, 2], "3": "three"})}]  # as a restore would give it
    assert op.snapshot()["state"]["state"].to_pylist() == ['{"pair":[1,2],"3":"three"}']


@pytest.mark.parametrize(
    "state, message",
    [({"s": {1, 2}}, "JSON cannot hold"), ({"x": float("nan")}, "JSON cannot hold"), ([1], "not a dict")],
)
def test_state_json_cannot_hold_fails_at_the_call_and_changes_nothing(state, message) -> None:
    class Bad(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            if key == "bad":
                ctx.state = state
            else:
                ctx.state["ok"] = 1
                ctx.register_timer(5)

    op = KeyedProcess("k", Bad)
    op.process(batch([("a", 0, 0)]))
    before = op.snapshot()
    with pytest.raises(OperatorError, match=message):
        op.process(batch([(None, 0, 0), ("b", 0, 0), ("bad", 0, 0)]))
    assert {n: t.to_pylist() for n, t in op.snapshot().items()} == {n: t.to_pylist() for n, t in before.items()}
    assert op.dead_letters.drain() == []  # the failed call's letters are not handed on


def test_a_failing_on_timer_leaves_the_operator_as_it_was() -> None:
    class Flaky(KeyedProcessFunction):
        fail = True

        def process_rows(self, key, rows, ctx):
            ctx.state["n"] = 1
            ctx.register_timer(rows[0]["t"])

        def on_timer(self, key, timestamp, ctx):
            ctx.clear()
            if key == "b" and self.fail:
                raise RuntimeError("boom")
            return [{"k": key}]

    op = KeyedProcess("k", Flaky)
    op.process(batch([("a", 1, 0), ("b", 2, 0)]))
    with pytest.raises(RuntimeError, match="boom"):
        op.on_watermark(10)
    assert op.watermark is None and op.timers_of("a") == [1] and op.state_of("a") == {"n": 1}
    op.function.fail = False
    assert op.on_watermark(10).to_pylist() == [{"k": "a"}, {"k": "b"}]


def test_a_context_is_only_valid_during_its_call() -> None:
    kept: list[KeyContext] = []

    class Keeper(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            kept.append(ctx)

    KeyedProcess("k", Keeper).process(batch([("a", 0, 0)]))
    with pytest.raises(OperatorError, match="used after the call"):
        kept[0].register_timer(1)


@pytest.mark.parametrize("timestamp", [1.5, "10", True, 1 << 63])
def test_timer_timestamps_are_int64_milliseconds(timestamp) -> None:
    class Odd(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            ctx.register_timer(timestamp)

    with pytest.raises(OperatorError, match="timestamp"):
        KeyedProcess("k", Odd).process(batch([("a", 0, 0)]))


# -- output ----------------------------------------------------------------


def test_output_schema_is_kept_even_when_empty() -> None:
    schema = schema_of(pa.string())
    op = KeyedProcess("k", SessionTotals, time_column="t", output_schema=schema)
    assert op.on_watermark(0).schema == schema
    assert op.process(batch([])).schema == schema
    assert op.process(batch([("a", 1, 2)])).schema == schema
    assert KeyedProcess("k", SessionTotals).on_watermark(0).num_columns == 0


def test_output_rows_are_checked() -> None:
    class Returns(KeyedProcessFunction):
        def __init__(self, result):
            self.result = result

        def process_rows(self, key, rows, ctx):
            return self.result

    cases = [
        ({"k": 1}, "one dict"),
        (5, "not an iterable"),
        (["row"], "not a dict"),
        ([{"x": 1}, {"x": "one"}], "give output_schema"),
    ]
    for result, message in cases:
        with pytest.raises(OperatorError, match=message):
            KeyedProcess("k", lambda result=result: Returns(result)).process(batch([("a", 0, 0)]))
    declared = pa.schema([("x", pa.int64())])
    with pytest.raises(OperatorError, match=r"columns \['y'\] that output_schema lacks"):
        KeyedProcess("k", Returns([{"x": 1, "y": 2}]), output_schema=declared).process(batch([("a", 0, 0)]))
    with pytest.raises(OperatorError, match="do not fit output_schema"):
        KeyedProcess("k", Returns([{"x": "one"}]), output_schema=declared).process(batch([("a", 0, 0)]))
    out = KeyedProcess("k", Returns(iter([{"x": 1}, {}])), output_schema=declared).process(batch([("a", 0, 0)]))
    assert out.to_pylist() == [{"x": 1}, {"x": None}]


def test_inferred_output_takes_every_column_named() -> None:
    class Ragged(KeyedProcessFunction):
        def process_rows(self, key, rows, ctx):
            yield {"a": 1}
            yield {"b": "x", "a": 2}

    assert KeyedProcess("k", Ragged).process(batch([("a", 0, 0)])).to_pylist() == [
        {"a": 1, "b": None},
        {"a": 2, "b": "x"},
    ]


# -- keys ------------------------------------------------------------------


def test_key_types_are_kept_through_a_snapshot() -> None:
    keys = pa.array(["x", "y", "x"]).dictionary_encode()
    op = KeyedProcess("k", Heartbeat)
    op.process(pa.table({"k": keys, "t": [1, 2, 3]}))
    ints = KeyedProcess("k", Heartbeat)
    ints.process(pa.table({"k": pa.array([3, 1], pa.int16()), "t": [0, 0]}))
    for operator, key_type in [(op, pa.string()), (ints, pa.int16())]:
        snapshot = parquet_roundtrip(operator.snapshot())
        assert snapshot["state"].schema.field("k").type == key_type
        assert snapshot["timers"].schema.field("k").type == key_type
        again = KeyedProcess("k", Heartbeat)
        again.restore(snapshot)
        assert again.on_watermark(100).to_pylist() == operator.on_watermark(100).to_pylist()


def test_keys_of_another_type_are_cast_to_the_state_s_or_refused() -> None:
    op = KeyedProcess("k", Recorder)
    op.process(pa.table({"k": pa.array([1], pa.int64()), "t": [0]}))
    assert op.process(pa.table({"k": pa.array([1], pa.int8()), "t": [0]})).to_pylist()[0]["calls"] == 2
    with pytest.raises(InputSchemaError, match="do not match the state's int64"):
        op.process(pa.table({"k": ["x"], "t": [0]}))
    with pytest.raises(InputSchemaError, match="keys must be scalars"):
        KeyedProcess("k", Recorder).process(pa.table({"k": [[1]], "t": [0]}))
    with pytest.raises(InputSchemaError, match="no column 'k'"):
        op.process(pa.table({"key": [1]}))


# -- restore ---------------------------------------------------------------


def sample() -> KeyedProcess:
    op = KeyedProcess("k", SessionTotals, time_column="t")
    op.process(batch([("a", 1, 2), ("b", 3, 4)]))
    op.on_watermark(2)
    return op


STRING_STATE = pa.schema([("k", pa.string()), ("state", pa.string())])


def replaced(state: dict, name: str, rows: pa.Table) -> dict:
    return {**state, name: rows}


def restore_cases() -> dict[str, tuple[object, str]]:
    good = parquet_roundtrip(sample().snapshot())
    return {
        "missing table": ({"state": good["state"], "timers": good["timers"]}, r"missing \['watermark'\]"),
        "extra table": ({**good, "extra": pa.table({"x": [1]})}, r"unexpected \['extra'\]"),
        "state columns": (replaced(good, "state", pa.table({"k": ["a"], "json": ["{}"]})), "has columns"),
        "not JSON": (replaced(good, "state", pa.table({"k": ["a"], "state": ["{not json"]})), "not JSON"),
        "not an object": (replaced(good, "state", pa.table({"k": ["a"], "state": ["[1, 2]"]})), "not an object"),
        "NaN": (replaced(good, "state", pa.table({"k": ["a"], "state": ['{"x": NaN}']})), "not JSON"),
        "state not text": (replaced(good, "state", pa.table({"k": ["a"], "state": [1]})), "expected JSON text"),
        "null state": (
            replaced(good, "state", pa.table({"k": ["a"], "state": pa.array([None], pa.string())})),
            "null states",
        ),
        "null state key": (
            replaced(good, "state", pa.Table.from_pylist([{"k": None, "state": "{}"}], STRING_STATE)),
            "null keys",
        ),
        "duplicate state keys": (
            replaced(good, "state", pa.table({"k": ["a", "a"], "state": ["{}", "{}"]})),
            "duplicate key",
        ),
        "nested keys": (replaced(good, "state", pa.table({"k": [[1]], "state": ["{}"]})), "keys are scalars"),
        "key types differ": (replaced(good, "state", pa.table({"k": [1], "state": ['{"n": 1}']})), "differ in type"),
        "timer columns": (replaced(good, "timers", pa.table({"k": ["a"], "at": [1]})), "has columns"),
        "timestamp as text": (replaced(good, "timers", pa.table({"k": ["a"], "timestamp": ["1"]})), "expected int64"),
        "duplicate timers": (
            replaced(good, "timers", pa.table({"k": ["a", "a"], "timestamp": [5, 5]})),
            "duplicate timer",
        ),
        "null timer key": (replaced(good, "timers", pa.table({"k": [None, "a"], "timestamp": [5, 6]})), "null keys"),
        "timestamp beyond int64": (
            replaced(good, "timers", pa.table({"k": ["a"], "timestamp": pa.array([1 << 63], pa.uint64())})),
            "int64",
        ),
        "two watermarks": (replaced(good, "watermark", pa.table({"watermark": [1, 2]})), "one integer row"),
        "watermark as text": (replaced(good, "watermark", pa.table({"watermark": ["x"]})), "one integer row"),
        "not a mapping": (None, "must be a mapping"),
    }


@pytest.mark.parametrize("case", list(restore_cases()))
def test_restore_refuses_bad_state_and_changes_nothing(case) -> None:
    state, message = restore_cases()[case]
    op = sample()
    before = {n: t.to_pylist() for n, t in op.snapshot().items()}
    with pytest.raises(StateRestoreError, match=message):
        op.restore(state)
    assert {n: t.to_pylist() for n, t in op.snapshot().items()} == before
    assert op.on_watermark(100).to_pylist() == sample().on_watermark(100).to_pylist()


def test_restore_replaces_state_and_accepts_timers_behind_the_watermark() -> None:
    op = sample()
    op.restore(
        {
            "state": pa.table({"k": ["z", "empty"], "state": ['{"total": 5, "last": 0}', "{}"]}),
            "timers": pa.table({"k": ["z"], "timestamp": [1]}),
            "watermark": pa.table({"watermark": [50]}),
        }
    )
    assert op.snapshot()["state"]["k"].to_pylist() == ["z"]  # {} is no state
    assert op.on_watermark(0).to_pylist() == [{"k": "z", "kind": "timeout", "total": 5, "at": 1}]
    assert op.watermark == 50


def test_a_fresh_snapshot_restores_and_says_how_it_divides() -> None:
    snapshot = KeyedProcess("k", SessionTotals).snapshot()
    op = sample()
    op.restore(parquet_roundtrip(snapshot))
    assert op.watermark is None and op.snapshot()["state"].num_rows == 0
    metadata = {name: table.schema.metadata for name, table in sample().snapshot().items()}
    assert metadata == {
        "state": {b"spark-abs.keys": b'["k"]'},
        "timers": {b"spark-abs.rescale": b"rows-by:k"},
        "watermark": {b"spark-abs.rescale": b"min"},
    }


# -- construction ----------------------------------------------------------


def test_the_function_may_be_an_instance_a_class_or_a_factory() -> None:
    for function in (Recorder(), Recorder, lambda: Recorder()):
        assert isinstance(KeyedProcess("k", function).function, Recorder)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"key": ""}, "key must be a non-empty column name"),
        ({"key": 3}, "key must be a non-empty column name"),
        ({"key": "state"}, "reserved"),
        ({"key": "timestamp"}, "reserved"),
        ({"function": 42}, "function must be"),
        ({"function": lambda: 42}, "function must be"),
        ({"function": object}, "function must be"),
        ({"time_column": ""}, "time_column"),
        ({"output_schema": {"x": "int64"}}, "output_schema must be a pyarrow.Schema"),
        ({"output_schema": pa.schema([("x", pa.int64()), ("x", pa.string())])}, "twice"),
        ({"dead_letters": []}, "dead_letters"),
    ],
)
def test_bad_arguments_fail_at_construction(kwargs, message) -> None:
    arguments = {"key": "k", "function": Recorder, **kwargs}
    with pytest.raises(OperatorConfigError, match=message):
        KeyedProcess(**arguments)


def test_a_function_without_process_rows_fails_when_called() -> None:
    with pytest.raises(NotImplementedError, match="process_rows"):
        KeyedProcess("k", KeyedProcessFunction).process(batch([("a", 0, 0)]))


def test_bad_watermarks_are_refused() -> None:
    for value in (1.5, "10", True):
        with pytest.raises(OperatorConfigError, match="watermark must be"):
            KeyedProcess("k", Recorder).on_watermark(value)


def test_state_keys_and_repr() -> None:
    op = KeyedProcess("user", Recorder, time_column="t")
    assert op.state_keys == {None: "user"}
    assert repr(op) == "KeyedProcess(key='user', function=Recorder, time='t')"
    assert repr(KeyedProcess("user", Recorder)) == "KeyedProcess(key='user', function=Recorder)"
