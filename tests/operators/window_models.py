"""Plain-Python models of the sliding and session window operators, row by
row, and what their tests share: the same steps cut into other batches,
steps routed to the tasks of a stage, and the resume checks."""

from __future__ import annotations

import datetime as dt
import zlib
from collections import Counter
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st
from operator_cases import table

from operators import DeadLetter
from operators.testing import Watermark, assert_resumes_exactly, parquet_roundtrip, run

EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
SCHEMA = pa.schema([("k", pa.string()), ("t", pa.int64()), ("v", pa.int64())])


@st.composite
def dense_window_steps(draw, span: int = 60, max_steps: int = 7) -> list:
    """Like operator_cases.window_steps, with more rows of fewer keys in a
    narrower span of time, ``[0, span]`` (a few session gaps): long
    sessions, rows inside them, rows bridging two."""
    row = st.fixed_dictionaries(
        {
            # sampled_from draws about evenly (maybe_null's one_of draws None about half the time)
            "k": st.sampled_from(["a", "a", "a", "b", "b", None]),
            "t": st.sampled_from(range(span + 1)),
            "v": st.sampled_from([*range(10), None]),
        }
    )
    batch = st.lists(row, min_size=2, max_size=12).map(lambda rows: table(rows, SCHEMA))
    watermark = st.sampled_from(range(span + span // 2)).map(Watermark)
    step = st.sampled_from([batch, batch, batch, watermark]).flatmap(lambda kind: kind)
    return draw(st.lists(step, max_size=max_steps))


def _plus(total: int | None, value: int | None) -> int | None:
    if value is None:
        return total
    return value if total is None else total + value


def _rows_of(step: pa.Table, op: str, letters: list[DeadLetter]) -> list[dict[str, Any]]:
    """The rows of a batch with a key and a time; the others become letters,
    null keys first (the operators reject them a batch at a time)."""
    rows = step.to_pylist()
    letters += [DeadLetter(r, "null_key", op) for r in rows if r["k"] is None]
    rows = [r for r in rows if r["k"] is not None]
    letters += [DeadLetter(r, "null_event_time", op) for r in rows if r["t"] is None]
    return [r for r in rows if r["t"] is not None]


def sliding_model(steps: list, size: int, slide: int, lateness: int):
    """Expected outputs and dead letters of SlidingWindowAggregate(k, t, size,
    slide, {n: count(), s: sum_(v)}, allowed_lateness=lateness): a row counts
    in every window [s, s + size) with s a multiple of slide, s <= t, that is
    still open (s + size + lateness > watermark); it is late when none is."""
    watermark = None
    open_: dict[tuple[str, int], dict[str, Any]] = {}
    outputs, letters = [], []
    op = "SlidingWindowAggregate"

    def is_open(start: int) -> bool:
        return watermark is None or start + size + lateness > watermark

    for step in steps:
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
        else:
            accepted = []
            for r in _rows_of(step, op, letters):
                starts = [s for s in range(r["t"] - size + 1, r["t"] + 1) if s % slide == 0]
                assert len(starts) == size // slide
                windows = [s for s in starts if is_open(s)]
                if windows:
                    accepted.append((r, windows))
                else:
                    letters.append(DeadLetter(r, "late", op))
            for r, windows in accepted:
                for start in windows:
                    w = open_.setdefault((r["k"], start), {"n": 0, "s": None})
                    w["n"] += 1
                    w["s"] = _plus(w["s"], r["v"])
        closed = sorted((start, k) for (k, start) in open_ if not is_open(start))
        outputs.append(
            [
                {"k": k, "window_start": start, "window_end": start + size, **open_.pop((k, start))}
                for start, k in closed
            ]
        )
    return outputs, letters


def session_model(steps: list, gap: int, lateness: int):
    """Expected outputs and dead letters of SessionWindowAggregate(k, t, gap,
    {n: count(), s: sum_(v)}, allowed_lateness=lateness), one row at a time:
    a row is late when t + gap + lateness <= watermark; otherwise it merges
    every open session of its key with t <= end and t + gap >= start into
    one."""
    watermark = None
    open_: dict[str, list[dict[str, Any]]] = {}
    outputs, letters = [], []
    op = "SessionWindowAggregate"
    for step in steps:
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
        else:
            accepted = []
            for r in _rows_of(step, op, letters):
                if watermark is not None and r["t"] + gap + lateness <= watermark:
                    letters.append(DeadLetter(r, "late", op))
                else:
                    accepted.append(r)
            for r in accepted:
                t, sessions = r["t"], open_.setdefault(r["k"], [])
                touching = [s for s in sessions if t <= s["end"] and t + gap >= s["start"]]
                merged = {"start": t, "end": t + gap, "n": 1, "s": r["v"]}
                for s in touching:
                    sessions.remove(s)
                    merged = {
                        "start": min(merged["start"], s["start"]),
                        "end": max(merged["end"], s["end"]),
                        "n": merged["n"] + s["n"],
                        "s": _plus(merged["s"], s["s"]),
                    }
                sessions.append(merged)
        out = []
        for k, sessions in open_.items():
            for s in list(sessions):
                if watermark is not None and s["end"] + lateness <= watermark:
                    sessions.remove(s)
                    out.append({"k": k, "session_start": s["start"], "session_end": s["end"], "n": s["n"], "s": s["s"]})
        outputs.append(sorted(out, key=lambda row: (row["session_start"], row["k"])))
    return outputs, letters


@st.composite
def recut(draw, steps: list) -> list:
    """``steps`` with the rows between two watermark steps shuffled and cut
    into other batches (some possibly empty)."""
    out: list = []
    pending: list[dict[str, Any]] = []

    def flush() -> None:
        rows = draw(st.permutations(pending))
        bounds = [0, *sorted(draw(st.lists(st.integers(0, len(rows)), max_size=3))), len(rows)]
        out.extend(table(rows[a:b], SCHEMA) for a, b in zip(bounds, bounds[1:]))
        pending.clear()

    for step in steps:
        if isinstance(step, Watermark):
            flush()
            out.append(step)
        else:
            pending.extend(step.to_pylist())
    flush()
    return out


def row_counts(rows) -> Counter:
    """Output rows as a multiset."""
    return Counter(tuple(sorted(row.items())) for row in rows)


def letter_counts(letters) -> Counter:
    """Dead letters as a multiset."""
    return Counter((tuple(sorted(letter.row.items())), letter.reason, letter.operator) for letter in letters)


def watermark_outputs(steps: list, result) -> list[list[dict[str, Any]]]:
    """What each Watermark step released; every other step must release nothing."""
    for step, output in zip(steps, result.outputs):
        if not isinstance(step, Watermark):
            assert output.num_rows == 0, f"process() emitted {output.to_pylist()}"
    return [output.to_pylist() for step, output in zip(steps, result.outputs) if isinstance(step, Watermark)]


def assign(table: pa.Table, column: str, parts: int) -> pa.Array:
    """The routing of streaming.api.pipeline.route (as in test_rescale_state):
    crc32 of the key's text; a null key (a dead letter anyway) to task 0."""
    texts = pc.cast(table[column], pa.string()).to_pylist()
    return pa.array([zlib.crc32(t.encode()) % parts if t is not None else 0 for t in texts], pa.int64())


def routed(step, parts: int, task: int):
    """The part of ``step`` that reaches ``task`` of ``parts``; every task gets every watermark."""
    if isinstance(step, Watermark):
        return step
    return step.filter(pc.equal(assign(step, "k", parts), task))


# milliseconds per unit of a test's integer times read as timestamps of that unit
SCALE = {"s": 1000, "ms": 1, "us": 1}


def timestamp_runs(make, steps: list, unit: str):
    """``make()`` run over ``steps`` with times and watermarks scaled to
    milliseconds (``SCALE``), and over the same times as timestamps of
    ``unit`` with a zone (microseconds a little past each millisecond)."""
    scale = SCALE[unit]
    stamped = pa.schema([("k", pa.string()), ("t", pa.timestamp(unit, "Europe/Paris")), ("v", pa.int64())])

    def as_ints(step):
        if isinstance(step, Watermark):
            return Watermark(step.value * scale)
        return step.set_column(1, "t", pc.multiply(step["t"], scale))

    def as_stamps(step):
        if isinstance(step, Watermark):
            return Watermark(step.value * scale)
        raw = pc.add(pc.multiply(step["t"], 1000), 999) if unit == "us" else step["t"]
        return step.set_column(1, "t", raw).cast(stamped)

    return run(make(), [as_ints(s) for s in steps]), run(make(), [as_stamps(s) for s in steps])


def millis(row: dict[str, Any], *columns: str) -> dict[str, Any]:
    """``row`` with the datetimes of ``columns`` as integer milliseconds."""
    return {**row, **{c: (row[c] - EPOCH) // dt.timedelta(milliseconds=1) for c in columns}}


def check_resume(make, steps: list, cut: int) -> None:
    """The resume contract at ``cut``: an exact resume, a snapshot that later
    batches do not change, and snapshot -> restore -> snapshot round trips."""
    assert_resumes_exactly(make, steps, cut)
    operator = make()
    run(operator, steps[:cut])
    snapshot = operator.snapshot()
    frozen = {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()}
    again = make()
    again.restore(parquet_roundtrip(snapshot))
    assert {n: t.to_pylist() for n, t in again.snapshot().items()} == {n: v for n, (_, v) in frozen.items()}
    run(operator, steps[cut:])
    assert {name: (t.schema, t.to_pylist()) for name, t in snapshot.items()} == frozen
