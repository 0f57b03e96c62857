"""Plain-Python models of IntervalJoin and Deduplicate, row by row, the
random steps their property tests draw, and what those tests share:
comparing output as multisets, running step by step, routing steps and
state to the tasks of a stage (as test_rescale_state.assign does)."""

from __future__ import annotations

import zlib
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
from hypothesis import strategies as st
from operator_cases import table

from operators import DeadLetter
from operators.testing import Watermark

LEFT = pa.schema([("id", pa.int64()), ("t", pa.int64()), ("x", pa.int64())])
RIGHT = pa.schema([("id", pa.int64()), ("t", pa.int64()), ("name", pa.string())])
DEDUP = pa.schema([("k", pa.string()), ("g", pa.int64()), ("t", pa.int64()), ("v", pa.int64())])
FLUSH = 1_000  # a watermark past every time the strategies draw


# -- drawing steps ----------------------------------------------------------------


def sometimes_null(values: st.SearchStrategy) -> st.SearchStrategy:
    """``values``, or None about one time in ten (``operator_cases.maybe_null``
    gives None about half the time: Hypothesis draws each distinct branch of
    ``one_of`` alike)."""
    return st.tuples(st.integers(0, 9), values).map(lambda drawn: None if drawn[0] == 0 else drawn[1])


def sized_lists(element: st.SearchStrategy, most: int) -> st.SearchStrategy[list]:
    """Lists of 0 to ``most`` elements, each length about as likely (Hypothesis
    favours short lists, which rarely hold two rows that meet)."""
    return st.integers(0, most).flatmap(lambda n: st.lists(element, min_size=n, max_size=n))


def _event_time_steps(draw, max_steps: int, flush: bool | None, batch) -> list:
    """Batches (``batch(now)``) and watermark steps: event time moves on about
    3 ms a step, rows come up to 8 ms out of order and the watermark trails
    them, so that rows meet, wait, leave the state and are late.  ``flush``:
    end with a watermark past every time (None: maybe)."""
    steps: list = []
    for index in range(draw(st.integers(1, max_steps))):
        now = 3 * index
        if draw(st.integers(0, 2)) == 0:
            steps.append(Watermark(draw(st.integers(max(0, now - 6), now + 3))))
        else:
            steps.append(batch(now))
    if draw(st.booleans()) if flush is None else flush:
        steps.append(Watermark(FLUSH))
    return steps


def _times(now: int) -> st.SearchStrategy:
    return sometimes_null(st.integers(max(0, now - 5), now + 3))


@st.composite
def interval_steps(draw, max_steps: int = 8, flush: bool | None = None) -> list:
    """Steps for IntervalJoin("id", left_time="t", right_time="t"): mappings
    with a left batch (``LEFT``), a right one (``RIGHT``), both or neither,
    and watermark steps."""

    def batch(now: int) -> dict[str, pa.Table]:
        key = sometimes_null(st.integers(0, 1))
        left_row = st.fixed_dictionaries({"id": key, "t": _times(now), "x": st.integers(0, 99)})
        right_row = st.fixed_dictionaries({"id": key, "t": _times(now), "name": st.sampled_from("pqr")})
        sides = draw(st.sampled_from([("left",), ("right",), ("left", "right"), ("left", "right"), ()]))
        step = {}
        if "left" in sides:
            step["left"] = table(draw(sized_lists(left_row, 5)), LEFT)
        if "right" in sides:
            step["right"] = table(draw(sized_lists(right_row, 5)), RIGHT)
        return step

    return _event_time_steps(draw, max_steps, flush, batch)


@st.composite
def dedup_steps(draw, max_steps: int = 8, flush: bool | None = None) -> list:
    """Steps for Deduplicate(["k"] or ["k", "g"], "t"): batches (``DEDUP``)
    and watermark steps."""

    def batch(now: int) -> pa.Table:
        row = st.fixed_dictionaries(
            {
                "k": sometimes_null(st.sampled_from("ab")),
                "g": sometimes_null(st.integers(0, 1)),
                "t": _times(now),
                "v": st.integers(0, 99),
            }
        )
        return table(draw(sized_lists(row, 6)), DEDUP)

    return _event_time_steps(draw, max_steps, flush, batch)


def cut_points(steps: Sequence) -> st.SearchStrategy[int]:
    """Any cut, or one right after a watermark step (where a lost watermark shows)."""
    after_watermarks = [i + 1 for i, step in enumerate(steps) if isinstance(step, Watermark)]
    anywhere = st.integers(0, len(steps))
    return st.one_of(anywhere, st.sampled_from(after_watermarks)) if after_watermarks else anywhere


# -- the models -------------------------------------------------------------------


def interval_join_model(steps: list, lower: int, upper: int, how: str) -> list[tuple[list, list, list, list]]:
    """Per step: the output rows, the dead letters, then the buffered left
    rows (with "__matched") and right rows of IntervalJoin("id",
    left_time="t", right_time="t", lower=lower, upper=upper, how=how)."""
    op = "IntervalJoin"
    watermark = None
    buffered_left: list[dict[str, Any]] = []  # {"row": ..., "matched": bool}
    buffered_right: list[dict[str, Any]] = []
    right_known = False  # before the first right batch the right columns are unknown
    result = []

    def matches(left: dict, right: dict) -> bool:
        return left["id"] == right["id"] and left["t"] + lower <= right["t"] <= left["t"] + upper

    def pair(left: dict, right: dict) -> dict:
        return {**left, "t_right": right["t"], "name": right["name"]}

    def admit(rows: list[dict], letters: list) -> list[dict]:
        kept = []
        for row in rows:
            if row["id"] is None:
                letters.append(DeadLetter(row, "null_key", op))
            elif row["t"] is None:
                letters.append(DeadLetter(row, "null_event_time", op))
            elif watermark is not None and row["t"] < watermark:
                letters.append(DeadLetter(row, "late", op))
            else:
                kept.append(row)
        return kept

    for step in steps:
        out: list[dict] = []
        letters: list[DeadLetter] = []
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
            still = []
            for entry in buffered_left:
                if entry["row"]["t"] + upper >= watermark:
                    still.append(entry)
                elif how == "left_outer" and not entry["matched"]:
                    nulls = {"t_right": None, "name": None} if right_known else {}
                    out.append({**entry["row"], **nulls})
            buffered_left = still
            buffered_right = [r for r in buffered_right if r["t"] - lower >= watermark]
        else:
            new_left = admit(step["left"].to_pylist(), letters) if "left" in step else []
            new_right = admit(step["right"].to_pylist(), letters) if "right" in step else []
            right_known = right_known or "right" in step
            for left in new_left:  # the left rows first: they meet the right rows of earlier calls
                found = [right for right in buffered_right if matches(left, right)]
                out += [pair(left, right) for right in found]
                buffered_left.append({"row": left, "matched": bool(found)})
            for right in new_right:  # then the right rows: they meet every buffered left row
                for entry in buffered_left:
                    if matches(entry["row"], right):
                        out.append(pair(entry["row"], right))
                        entry["matched"] = True
                buffered_right.append(right)
        left_state = [{**entry["row"], "__matched": entry["matched"]} for entry in buffered_left]
        result.append((out, letters, left_state, list(buffered_right)))
    return result


def dedup_model(steps: list, columns: Sequence[str], within: int) -> list[tuple[list, list, int, dict]]:
    """Per step: the output rows, the dead letters, the rows dropped as
    duplicates, and then the remembered keys (key tuple -> first time) of
    Deduplicate(columns, "t", within)."""
    op = "Deduplicate"
    watermark = None
    seen: dict[tuple, int] = {}
    result = []
    for step in steps:
        out: list[dict] = []
        letters: list[DeadLetter] = []
        duplicates = 0
        if isinstance(step, Watermark):
            watermark = step.value if watermark is None else max(watermark, step.value)
            seen = {key: first for key, first in seen.items() if first + within > watermark}
        else:
            for row in step.to_pylist():
                key = tuple(row[column] for column in columns)
                if None in key:
                    letters.append(DeadLetter(row, "null_key", op))
                elif row["t"] is None:
                    letters.append(DeadLetter(row, "null_event_time", op))
                elif watermark is not None and row["t"] + within <= watermark:
                    letters.append(DeadLetter(row, "late", op))
                elif key in seen:
                    duplicates += 1
                else:
                    out.append(row)
                    seen[key] = row["t"]
        result.append((out, letters, duplicates, dict(seen)))
    return result


# -- comparing and running ----------------------------------------------------------


def canon(row: dict) -> tuple:
    return tuple(sorted(row.items()))


def bag(rows: list[dict]) -> Counter:
    """Rows as a multiset."""
    return Counter(canon(row) for row in rows)


def letter_bag(letters) -> Counter:
    """Dead letters as a multiset."""
    return Counter((letter.reason, letter.operator, canon(letter.row)) for letter in letters)


def run_steps(operator, steps: Sequence) -> list[tuple[pa.Table, list]]:
    """Per step: the output table and the dead letters drained after it."""
    result = []
    for step in steps:
        out = operator.on_watermark(step.value) if isinstance(step, Watermark) else operator.process(step)
        result.append((out, operator.dead_letters.drain()))
    return result


def rows_and_letters(results: list[tuple[pa.Table, list]]) -> tuple[Counter, Counter]:
    """What ``run_steps`` results hold, as multisets of rows and of dead letters."""
    return (
        bag([row for out, _ in results for row in out.to_pylist()]),
        letter_bag([letter for _, letters in results for letter in letters]),
    )


def route(rows: pa.Table, column: str, parts: int) -> pa.Array:
    """The task of each row, as test_rescale_state.assign routes (crc32 of the
    key's text); a null key goes to task 0 (its row is a dead letter anywhere)."""
    texts = pc.cast(rows[column], pa.string()).to_pylist()
    return pa.array([0 if t is None else zlib.crc32(t.encode()) % parts for t in texts], pa.int64())


def part_of(step, column: str, index: int, parts: int):
    """The part of ``step`` that task ``index`` of ``parts`` receives: its rows
    (of every input) routed by ``column``; every task gets each watermark."""
    if isinstance(step, Watermark):
        return step
    if isinstance(step, pa.Table):
        return step.filter(pc.equal(route(step, column, parts), index))
    return {side: rows.filter(pc.equal(route(rows, column, parts), index)) for side, rows in step.items()}
