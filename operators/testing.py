"""Helpers for testing operators (users' and our own): run one over a
sequence of batches, or run it, snapshot, restore a fresh one from the
snapshot through Parquet, and check the resumed run gives exactly the output
of the uninterrupted one (the resume contract of ``operators.base``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Union

import pyarrow as pa
import pyarrow.parquet as pq

from operators.dead_letters import DeadLetter, DeadLetters
from operators.state import StateChanges, apply_changes, stored_keys

__all__ = [
    "Watermark",
    "Step",
    "RunResult",
    "run",
    "parquet_roundtrip",
    "run_with_restore",
    "run_with_savepoint",
    "assert_resumes_exactly",
    "assert_changes_rebuild_the_state",
]


@dataclass(frozen=True, slots=True)
class Watermark:
    """A step that calls ``on_watermark(value)`` instead of ``process()``."""

    value: int


Step = Union[pa.Table, Mapping[str, pa.Table], Watermark]  # noqa: UP007 - a runtime alias


@dataclass(frozen=True, slots=True)
class RunResult:
    """What a run produced: one output table per step, and the dead letters
    in the order they were rejected."""

    outputs: tuple[pa.Table, ...]
    dead_letters: tuple[DeadLetter, ...]

    def rows(self) -> list[dict[str, Any]]:
        """Every output row, in order."""
        return [row for table in self.outputs for row in table.to_pylist()]

    def __add__(self, other: RunResult) -> RunResult:
        return RunResult(self.outputs + other.outputs, self.dead_letters + other.dead_letters)


def _drain(operator: object) -> list[DeadLetter]:
    letters = getattr(operator, "dead_letters", None)
    return letters.drain() if isinstance(letters, DeadLetters) else []


def run(operator: Any, steps: Sequence[Step]) -> RunResult:
    """Feed ``steps`` to ``operator`` in order, draining its dead letters after each."""
    outputs: list[pa.Table] = []
    letters: list[DeadLetter] = []
    for step in steps:
        outputs.append(operator.on_watermark(step.value) if isinstance(step, Watermark) else operator.process(step))
        letters.extend(_drain(operator))
    return RunResult(tuple(outputs), tuple(letters))


def parquet_roundtrip(state: Mapping[str, pa.Table]) -> dict[str, pa.Table]:
    """``state`` written to Parquet and read back, as the snapshot store does."""
    restored = {}
    for name, table in state.items():
        # in memory Arrow owns: no Python object for Arrow's threads to release (the snapshot store's reading)
        buffer = pa.BufferOutputStream()
        pq.write_table(table, buffer)
        restored[name] = pq.read_table(pa.BufferReader(buffer.getvalue()))
    return restored


def run_with_restore(
    make_operator: Callable[[], Any],
    steps: Sequence[Step],
    cut: int,
    *,
    through: Callable[[Mapping[str, pa.Table]], Mapping[str, pa.Table]] = parquet_roundtrip,
) -> RunResult:
    """Run ``steps[:cut]``, snapshot, restore a new operator from the snapshot
    (passed ``through`` storage), run ``steps[cut:]`` on it; both parts' output."""
    first = make_operator()
    before = run(first, steps[:cut])
    second = make_operator()
    second.restore(through(first.snapshot()))
    return before + run(second, steps[cut:])


def _same(a: pa.Table, b: pa.Table) -> bool:
    return a.schema.equals(b.schema) and a.to_pylist() == b.to_pylist()


def assert_resumes_exactly(make_operator: Callable[[], Any], steps: Sequence[Step], cut: int) -> None:
    """AssertionError unless stopping after ``steps[:cut]`` and resuming from
    a snapshot gives the output and dead letters of an uninterrupted run; and
    so does going back to a savepoint taken at ``cut`` (``savepoint_of``)
    after the rest was processed once, its dead letters left in the operator,
    and processing the rest again (what a task does when its operator raised)."""
    expected = run(make_operator(), steps)
    _same_run(expected, run_with_restore(make_operator, steps, cut), f"after resume (cut at {cut})")
    _same_run(expected, run_with_savepoint(make_operator, steps, cut), f"after going back to a savepoint at {cut}")


def run_with_savepoint(make_operator: Callable[[], Any], steps: Sequence[Step], cut: int) -> RunResult:
    """Run ``steps[:cut]``, take a savepoint (``savepoint_of``), run the rest
    without draining the dead letters, go back, and run the rest again."""
    from operators.base import savepoint_of  # the contract's module imports this one

    operator = make_operator()
    first = run(operator, steps[:cut])
    back = savepoint_of(operator)
    for step in steps[cut:]:
        operator.on_watermark(step.value) if isinstance(step, Watermark) else operator.process(step)
    back()
    return first + run(operator, steps[cut:])


def _same_run(expected: RunResult, actual: RunResult, when: str) -> None:
    for index, (want, got) in enumerate(zip(expected.outputs, actual.outputs)):
        if not _same(want, got):
            raise AssertionError(
                f"step {index} differs {when}:\n expected {want.schema} {want.to_pylist()}\n"
                f" got      {got.schema} {got.to_pylist()}"
            )
    if expected.dead_letters != actual.dead_letters:
        raise AssertionError(
            f"dead letters differ {when}:\n expected {expected.dead_letters}\n got      {actual.dead_letters}"
        )


def assert_changes_rebuild_the_state(make_operator: Callable[[], Any], steps: Sequence[Step], cut: int) -> None:
    """What an incremental checkpoint stores is enough: after every step,
    the tables rebuilt from the operator's changes (``changes_of``), each
    applied to the tables before as the snapshot store applies a chain's
    links, are its ``snapshot()`` tables, rows in the same order; also when
    the operator is restored from a snapshot at ``cut`` and goes on from there."""
    from operators.base import changes_of  # the contract's module imports this one

    operator = make_operator()
    rebuilt: dict[str, pa.Table] = {}
    for position, step in enumerate(steps):
        if position == cut:
            rebuilt = parquet_roundtrip(operator.snapshot())
            operator = make_operator()
            operator.restore(rebuilt)
        run(operator, [step])
        rebuilt = {name: _applied(rebuilt.get(name), changes) for name, changes in changes_of(operator).items()}
        expected = {name: table.to_pylist() for name, table in parquet_roundtrip(operator.snapshot()).items()}
        got = {name: table.to_pylist() for name, table in parquet_roundtrip(rebuilt).items()}
        assert got == expected, f"after step {position}: changes rebuild {got}, the snapshot is {expected}"


def _applied(table: pa.Table | None, changes: StateChanges) -> pa.Table:
    if changes.full or table is None:
        return changes.upserts
    keys = stored_keys(changes.upserts) or changes.removed.column_names
    return apply_changes(table, changes.removed, changes.upserts, keys)
