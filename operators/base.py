"""The operator contract: what the stage task calls on every operator, and
``Chain``, operators applied one after the other.

The stage task hands each micro-batch (a ``pyarrow.Table``) to
``process()``; at a checkpoint barrier it calls ``snapshot()`` on every
operator and stores the tables as Parquet; on restore it builds fresh
operators, calls ``restore()`` with what ``snapshot()`` returned, and replays
the input that came after the snapshot.

The resume contract, which every stateful operator keeps and the property
tests check:

1. ``snapshot()`` returns *all* the state, as Arrow tables.  Anything not in
   it is lost on restore.  The tables are an immutable copy: processing more
   batches never changes a snapshot already returned.
2. ``restore(state)`` receives exactly that mapping back (after a Parquet
   round trip) and replaces whatever state the operator had.  State it
   cannot take (a table missing or extra, wrong columns or types, duplicate
   or null keys) raises ``StateRestoreError`` and leaves the operator as it was.
3. After ``restore()``, processing the rest of the input gives exactly the
   output (and dead letters) of a run that was never interrupted.  Output
   therefore depends only on the sequence of batches, never on wall-clock
   time, thread scheduling or how the input was cut into snapshots.

Output and dead letters are not state: rows returned by ``process()`` belong
to the batch that produced them.

Two optional parts, which the built-in operators have:

- ``on_watermark(watermark)`` (``WatermarkAware``): the operator follows
  event time.  The stage task calls it whenever the minimum over its
  event-time inputs moves on (docs/architecture/protocol.md, "Event time"); an
  operator never moves event time from the rows it sees.
- ``watermark_hold()``: the earliest event time of rows the operator may
  still emit (rows it buffers), or None.  The task tells downstream no more
  than the smaller of its watermark and this hold, so buffered rows are
  never late after it (a watermark hold, as Beam calls it).
- ``changes()``: what changed in each snapshot table since the last call
  (or since ``restore()``), as ``StateChanges``: the rows of keys written
  and the keys removed, or the whole table.  A task of an incremental job
  calls it at every checkpoint and stores only that (``changes_of`` gives
  every table whole for an operator without it).  Operators built on
  ``KeyedState`` have it for free: ``KeyedState.changes()``.
- ``snapshot_later()``: ``snapshot()``'s tables, where one may be a function
  that gives the table when called, later and on another thread, as the
  table was when ``snapshot_later()`` was called.  The task's upload thread
  calls them, so a large state is gathered off the processing thread
  (``snapshot_later_of`` gives ``snapshot()`` for an operator without it;
  ``gathered`` calls the functions).  ``KeyedState.snapshot_later()`` is
  one.
- ``savepoint()``: a function that puts the operator back as it is now,
  after any calls since (its state; the dead letters it collected since
  are dropped), for a ``process()`` call that raised half-way: the task
  then finds the rows it raises on (``streaming.engine.task.record_errors``).
  ``savepoint_of`` gives one for every operator: its own (``KeyedProcess``
  copies its maps of keys), or its ``snapshot_later_of`` tables restored.
- ``state_keys``: the column that divides the state, per input name
  (``{None: "account"}`` for one input).  The pipeline check
  (``streaming.api.partitioning``) uses it to refuse partitionings in which rows of one
  key could reach different tasks; a stateful operator without it may not
  read an ingress topic by partition with several tasks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Protocol, runtime_checkable

import pyarrow as pa

from operators._arrow import concat
from operators.dead_letters import DeadLetters, without_origin
from operators.errors import OperatorConfigError, OperatorError, StateRestoreError
from operators.state import StateChanges, whole

__all__ = [
    "Operator",
    "MultiInputOperator",
    "WatermarkAware",
    "Stateless",
    "Chain",
    "changes_of",
    "snapshot_later_of",
    "gathered",
    "LaterTables",
    "takes_origin",
    "savepoint_of",
]

# snapshot_later()'s tables: a table, or a function that gives it
LaterTables = dict[str, pa.Table | Callable[[], pa.Table]]


@runtime_checkable
class Operator(Protocol):
    """A step of a stage: one input table in, one output table out.

    ``process(batch)`` returns the output rows for this batch (possibly none,
    as an empty table).  ``snapshot()`` returns all the state as named Arrow
    tables (``{}`` for a stateless operator); ``restore(state)`` takes such a
    mapping back.  See the module docstring for the resume contract."""

    def process(self, batch: pa.Table) -> pa.Table: ...

    def snapshot(self) -> dict[str, pa.Table]: ...

    def restore(self, state: Mapping[str, pa.Table]) -> None: ...


@runtime_checkable
class MultiInputOperator(Protocol):
    """An operator with named inputs (``inputs``), e.g. a join or a union.

    ``process(batches)`` takes one table per input name for the same
    micro-batch; a missing name means no rows from that input.  The operator
    documents the order in which it applies its inputs within one call."""

    inputs: tuple[str, ...]

    def process(self, batches: Mapping[str, pa.Table]) -> pa.Table: ...

    def snapshot(self) -> dict[str, pa.Table]: ...

    def restore(self, state: Mapping[str, pa.Table]) -> None: ...


@runtime_checkable
class WatermarkAware(Protocol):
    """An operator that can emit when event time moves on without input rows
    (idle input, end of stream).  ``on_watermark(watermark)`` advances its
    watermark (it never goes back) and returns what that releases."""

    def on_watermark(self, watermark: int) -> pa.Table: ...


class Stateless:
    """Base for operators without state: ``snapshot()`` is ``{}`` and
    ``restore()`` accepts only ``{}``."""

    def process(self, batch: pa.Table) -> pa.Table:
        raise NotImplementedError

    def snapshot(self) -> dict[str, pa.Table]:
        return {}

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        if state:
            raise StateRestoreError(f"{type(self).__name__} is stateless but was given tables {sorted(state)}")


def changes_of(operator: object) -> dict[str, StateChanges]:
    """What changed in each of ``operator``'s snapshot tables since the last
    call: its ``changes()``, or every table of ``snapshot()`` whole when it
    keeps no track."""
    changes = getattr(operator, "changes", None)
    if callable(changes):
        return changes()
    return {name: whole(table) for name, table in operator.snapshot().items()}  # type: ignore[attr-defined]


def snapshot_later_of(operator: object) -> LaterTables:
    """``operator``'s ``snapshot_later()``, or its ``snapshot()`` when it has
    none, or when a subclass overrides ``snapshot()`` but not ``snapshot_later()``
    (the inherited one would not store what its ``snapshot()`` says)."""
    later = getattr(operator, "snapshot_later", None)
    if callable(later) and not _overrides_snapshot_only(type(operator)):
        return later()
    return operator.snapshot()  # type: ignore[attr-defined]


def savepoint_of(operator: object) -> Callable[[], None]:
    """A function that puts ``operator`` back as it is now (see the module
    docstring, ``savepoint()``) and drops the dead letters it collected
    since.  Cheap when nothing goes wrong: ``snapshot_later_of``'s tables
    are taken (no row copied for the built-in keyed state) and only
    gathered when the function is called."""
    own = getattr(operator, "savepoint", None)
    if callable(own):
        back = own()
    else:
        tables = snapshot_later_of(operator)

        def back() -> None:
            operator.restore(gathered(tables))  # type: ignore[attr-defined]

    def rollback() -> None:
        back()
        letters = getattr(operator, "dead_letters", None)
        if isinstance(letters, DeadLetters):
            letters.drain_batches()

    return rollback


def _overrides_snapshot_only(cls: type) -> bool:
    def owner(name: str) -> type | None:
        return next((c for c in cls.__mro__ if name in vars(c)), None)

    snapshot, later = owner("snapshot"), owner("snapshot_later")
    return snapshot is not None and later is not None and snapshot is not later and issubclass(snapshot, later)


def gathered(tables: Mapping[str, pa.Table | Callable[[], pa.Table]]) -> dict[str, pa.Table]:
    """``snapshot_later()``'s tables, each function called."""
    return {name: table if isinstance(table, pa.Table) else table() for name, table in tables.items()}


def takes_origin(operator: object) -> bool:
    """Whether ``operator`` takes rows with their origin (the column
    ``operators.dead_letters.ORIGIN``): the built-in operators do, and keep
    it where an output row is one input row; an operator of one's own gets
    rows without it, as the stage's input has them, unless its class says
    ``keeps_origin = True`` (it passes the column on with the rows it keeps,
    as ``pa.Table.filter``, ``take`` and ``append_column`` do)."""
    declared = getattr(type(operator), "keeps_origin", None)
    if declared is not None:
        return bool(declared)
    return type(operator).__module__.split(".")[0] == "operators"


def _hold_of(operator: object) -> int | None:
    hold = getattr(operator, "watermark_hold", None)
    return hold() if callable(hold) else None


def _held(watermark: int, before: tuple) -> int:
    """``watermark``, held back by what the operators ``before`` buffer."""
    holds = [h for h in (_hold_of(o) for o in before) if h is not None]
    return min([watermark, *holds])


def _is_operator(candidate: object) -> bool:
    return all(callable(getattr(candidate, name, None)) for name in ("process", "snapshot", "restore"))


def _inputs_of(operator: object) -> tuple[str, ...] | None:
    inputs = getattr(operator, "inputs", None)
    return tuple(inputs) if inputs else None


class Chain:
    """Operators applied in order: the output of one is the input of the next.

    Only the first may be a ``MultiInputOperator``; the chain then takes what
    it takes (``process(batches)``) and has its ``inputs`` (a chain of
    single-input operators has no ``inputs`` attribute).  The chain is
    itself an operator: ``snapshot()`` prefixes each operator's tables with
    its position (``"0.counts"``, ``"2.windows"``; a nested chain gives
    ``"1.0.counts"``), ``restore()`` hands each operator its own tables and
    is all-or-nothing.  Dead letters of every operator are moved into
    ``chain.dead_letters`` after each step.

    When a step returns no rows, the steps after it are not called for that
    batch (they would have nothing to do) and that empty table is the output."""

    def __init__(self, *operators: Operator | MultiInputOperator):
        if not operators:
            raise OperatorConfigError("Chain needs at least one operator")
        for position, operator in enumerate(operators):
            if not _is_operator(operator):
                raise OperatorConfigError(
                    f"Chain: operator {position} ({operator!r}) has no process/snapshot/restore methods"
                )
            if position and _inputs_of(operator):
                raise OperatorConfigError(
                    f"Chain: only the first operator may have several inputs; operator {position} has {_inputs_of(operator)}"
                )
        self.operators: tuple[Operator | MultiInputOperator, ...] = operators
        self.dead_letters = DeadLetters()
        head_inputs = _inputs_of(operators[0])
        if head_inputs:
            # only then is the chain a MultiInputOperator
            self.inputs: tuple[str, ...] = head_inputs

    def process(self, batch: pa.Table | Mapping[str, pa.Table]) -> pa.Table:
        inputs = _inputs_of(self)
        if inputs is None and not isinstance(batch, pa.Table):
            raise OperatorError(f"Chain: the first operator takes one pyarrow.Table, got {type(batch).__name__}")
        if inputs is not None and not isinstance(batch, Mapping):
            raise OperatorError(f"Chain: the first operator takes a mapping of {inputs} to tables")
        return self._run(0, batch)

    def on_watermark(self, watermark: int) -> pa.Table:
        """Advance every watermark-aware operator in order; what one releases
        flows through the operators after it before they get the watermark,
        which is held back by the rows the operators before them buffer."""
        outputs: list[pa.Table] = []
        for position, operator in enumerate(self.operators):
            if isinstance(operator, WatermarkAware):
                held = _held(watermark, self.operators[:position])
                released = operator.on_watermark(held)
                self._collect(operator)
                outputs.append(self._run(position + 1, released))
        return concat(outputs) if outputs else pa.table({})

    def watermark_hold(self) -> int | None:
        """The earliest event time any operator of the chain may still emit."""
        holds = [h for h in (_hold_of(o) for o in self.operators) if h is not None]
        return min(holds) if holds else None

    def snapshot(self) -> dict[str, pa.Table]:
        return {
            f"{position}.{name}": table
            for position, operator in enumerate(self.operators)
            for name, table in operator.snapshot().items()
        }

    def snapshot_later(self) -> LaterTables:
        """Each operator's ``snapshot_later_of``, named as ``snapshot()`` names its tables."""
        return {
            f"{position}.{name}": table
            for position, operator in enumerate(self.operators)
            for name, table in snapshot_later_of(operator).items()
        }

    def savepoint(self) -> Callable[[], None]:
        """Each operator's ``savepoint_of``, put back together."""
        backs = [savepoint_of(operator) for operator in self.operators]

        def rollback() -> None:
            for back in backs:
                back()

        return rollback

    def changes(self) -> dict[str, StateChanges]:
        """Each operator's changes (``changes_of``), named as ``snapshot()`` names its tables."""
        return {
            f"{position}.{name}": changes
            for position, operator in enumerate(self.operators)
            for name, changes in changes_of(operator).items()
        }

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        parts: list[dict[str, pa.Table]] = [{} for _ in self.operators]
        for name, table in state.items():
            head, dot, rest = str(name).partition(".")
            if not (dot and head.isdigit() and int(head) < len(self.operators)):
                raise StateRestoreError(
                    f"Chain: snapshot table {name!r} belongs to no operator (expected '<position>.<table>' "
                    f"with position below {len(self.operators)})"
                )
            parts[int(head)][rest] = table
        before = [operator.snapshot() for operator in self.operators]
        for position, operator in enumerate(self.operators):
            try:
                operator.restore(parts[position])
            except Exception as exc:
                for done in range(position):
                    self.operators[done].restore(before[done])
                if isinstance(exc, StateRestoreError):
                    raise StateRestoreError(f"Chain operator {position}: {exc}") from exc
                raise

    def _run(self, start: int, data: pa.Table | Mapping[str, pa.Table]) -> pa.Table:
        for operator in self.operators[start:]:
            if isinstance(data, pa.Table) and data.num_rows == 0:
                break  # nothing for the rest to do (and an empty table may lack their columns)
            if not takes_origin(operator):
                data = (
                    without_origin(data)
                    if isinstance(data, pa.Table)
                    else {name: without_origin(table) for name, table in data.items()}
                )
            data = operator.process(data)
            self._collect(operator)
        return data

    def _collect(self, operator: object) -> None:
        letters = getattr(operator, "dead_letters", None)
        if isinstance(letters, DeadLetters):
            self.dead_letters.absorb(letters)

    def __repr__(self) -> str:
        return f"Chain({', '.join(map(repr, self.operators))})"
