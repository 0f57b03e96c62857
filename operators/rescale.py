"""Dividing a stage's state among a different number of tasks (a restore
that rescales, docs/architecture/restore.md "Rescaling").

Rows reach task ``s`` of a stage by the hash of the upstream stage's key
column, modulo the number of tasks (``streaming.api.pipeline.route``).  After
a rescale every row of state must sit in the task that will now receive the
rows of its key, so each stored state table says how it divides, in its
schema metadata:

- ``spark-abs.keys`` (every ``KeyedState`` table): rows go with their key.
  One of the key columns must be the column the stage's input is routed by.
- ``spark-abs.rescale = "rows-by:<column>"``: rows go with the value of
  ``<column>`` (rows that may repeat a key, such as a join's buffered rows).
- ``spark-abs.rescale = "min"``: one row; every task gets the minimum of
  each column over the old tasks (nulls ignored).  A watermark divides this
  way, so that no window closes earlier than it would have.

A table that says neither cannot be divided: ``split_state`` raises
``StateDivisionError`` naming it, before anything is restored.  Tables that are
empty in every old task need no rule.  Merging (fewer tasks) and splitting
(more) are the same operation: all old rows, routed again."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence

import pyarrow as pa
import pyarrow.compute as pc

from operators.errors import OperatorError
from operators.state import KEYS_METADATA

__all__ = ["RESCALE_METADATA", "StateDivisionError", "split_state", "rows_by", "MIN"]

RESCALE_METADATA = b"spark-abs.rescale"
MIN = "min"

# (table, column, parts) -> the new task index of every row
Assign = Callable[[pa.Table, str, int], pa.Array]


class StateDivisionError(OperatorError):
    """A stage's state cannot be divided among a new number of tasks."""


def rows_by(column: str) -> str:
    """The ``spark-abs.rescale`` value of a table whose rows go with ``column``."""
    return f"rows-by:{column}"


def _metadata(table: pa.Table, key: bytes) -> str | None:
    value = (table.schema.metadata or {}).get(key)
    return value.decode() if value is not None else None


def _rule(name: str, parts: Sequence[pa.Table], route_keys: Sequence[str]) -> tuple[str, str | None]:
    """``("split", column)`` or ``("min", None)`` for table ``name``."""
    declared = next((t for t in parts if t.schema.metadata), parts[0])
    rescale = _metadata(declared, RESCALE_METADATA)
    keys_text = _metadata(declared, KEYS_METADATA)
    if rescale == MIN:
        return MIN, None
    if rescale and rescale.startswith("rows-by:"):
        column = rescale.partition(":")[2]
        if column not in route_keys:
            raise StateDivisionError(
                f"state table {name!r} divides by column {column!r}, but rows reach the stage by "
                f"{' or '.join(repr(k) for k in route_keys) or 'partition (an ingress topic)'}"
            )
        return "split", column
    if keys_text:
        keys = json.loads(keys_text)
        routed = [k for k in keys if k in route_keys]
        if not routed:
            raise StateDivisionError(
                f"state table {name!r} is keyed by {tuple(keys)}, but rows reach the stage by "
                f"{' or '.join(repr(k) for k in route_keys) or 'partition (an ingress topic)'}: "
                "its rows cannot follow their key"
            )
        return "split", routed[0]
    raise StateDivisionError(
        f"state table {name!r} does not say how it divides among tasks "
        f"(no {KEYS_METADATA.decode()} or {RESCALE_METADATA.decode()} schema metadata)"
    )


def _concat(parts: Sequence[pa.Table]) -> pa.Table:
    filled = [p for p in parts if p.num_rows] or list(parts[:1])
    metadata = next((p.schema.metadata for p in parts if p.schema.metadata), None)
    table = pa.concat_tables(filled, promote_options="permissive") if len(filled) > 1 else filled[0]
    return table.replace_schema_metadata(metadata)


def _minimum(table: pa.Table) -> pa.Table:
    columns = {}
    for name in table.column_names:
        column = table[name]
        value = pc.min(column).as_py() if column.null_count < len(column) else None
        columns[name] = pa.array([value], column.type)
    return pa.table(columns).replace_schema_metadata(table.schema.metadata)


def split_state(
    states: Sequence[Mapping[str, pa.Table]], parts: int, route_keys: Sequence[str], assign: Assign
) -> list[dict[str, pa.Table]]:
    """The state of ``parts`` new tasks from ``states``, the old tasks' state
    (one mapping of table name to table each).  ``route_keys``: the columns
    the stage's inputs are routed by; ``assign`` routes rows as the upstream
    stages do."""
    if parts < 1:
        raise StateDivisionError(f"a stage needs at least one task, got {parts}")
    names = sorted({name for state in states for name in state})
    new: list[dict[str, pa.Table]] = [{} for _ in range(parts)]
    for name in names:
        old = [state[name] for state in states if name in state]
        if len(old) != len(states):
            raise StateDivisionError(f"state table {name!r} is kept by {len(old)} of the {len(states)} tasks")
        table = _concat(old)
        if all(t.num_rows == 0 for t in old):
            for state in new:
                state[name] = table
            continue
        rule, column = _rule(name, old, route_keys)
        if rule == MIN:
            if any(t.num_rows != 1 for t in old):
                raise StateDivisionError(
                    f"state table {name!r} divides by its minimum but is not one row in every task"
                )
            for state in new:
                state[name] = _minimum(table)
            continue
        if column is None:  # _rule names the column of every rule but the minimum
            raise StateDivisionError(f"state table {name!r} divides by no column")
        targets = assign(table, column, parts)
        for index, state in enumerate(new):
            state[name] = table.filter(pc.equal(targets, index))
    return new
