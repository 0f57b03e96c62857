"""A checkpoint's operator state (``spark-abs state``, ``spark-abs
checkpoints diff``): state tables as Arrow, one per table name with the task
as a column, and which keys' state changed between two checkpoints."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc

from operators.dead_letters import without_origin
from operators.state import stored_keys
from streaming.adapters.snapshots import LoadedTask, SnapshotStore
from streaming.errors import SnapshotMissingError

__all__ = ["StateTables", "TableDiff", "loaded_tasks", "state_keys"]


@dataclass(frozen=True)
class TableDiff:
    """How one state table of one task changed from checkpoint ``a`` to ``b``,
    by key: keys added, removed, changed (same key, other values) and
    unchanged, and a sample of each that changed (the ``b`` side, or ``a`` for
    removed keys)."""

    task: str
    table: str
    keys: tuple[str, ...]
    added: int
    removed: int
    changed: int
    unchanged: int
    sample: pa.Table  # a "change" column (added/removed/changed), then the table's columns


def state_keys(table: pa.Table) -> tuple[str, ...]:
    """The key columns of a state table as keyed state records them in its
    schema (``spark-abs.keys``); empty when the table names none."""
    keys = tuple(stored_keys(table) or ())
    return keys if keys and all(k in table.column_names for k in keys) else ()


def _concat(parts: list[pa.Table]) -> pa.Table:
    """The parts of one table across tasks.  An empty keyed state has no fixed
    types (placeholder columns), so empty parts only count when all are."""
    filled = [p for p in parts if p.num_rows] or parts[:1]
    return pa.concat_tables(filled, promote_options="permissive").replace_schema_metadata(filled[0].schema.metadata)


def loaded_tasks(store: SnapshotStore, checkpoint_id: int, task: str | None) -> Iterable[LoadedTask]:
    """Every task of checkpoint ``checkpoint_id`` (or ``task``) loaded, by name."""
    manifest = store.read_manifest(checkpoint_id)
    if task is not None and task not in manifest.tasks:
        raise SnapshotMissingError(
            f"checkpoint {checkpoint_id} has no task {task!r} (tasks: {', '.join(sorted(manifest.tasks))})"
        )
    for name in sorted(manifest.tasks):
        if task is None or name == task:
            yield store.load_task(checkpoint_id, name)


class StateTables:
    """The operator state of ``store``'s checkpoints: read by table, and
    compared between two checkpoints."""

    def __init__(self, store: SnapshotStore):
        self.store = store

    def state(self, checkpoint_id: int, *, task: str | None = None, table: str | None = None) -> dict[str, pa.Table]:
        """Operator state by table name, the rows of every task (or ``task``)
        with a ``task`` column first; only ``table`` when given."""
        by_table: dict[str, list[pa.Table]] = {}
        for loaded in loaded_tasks(self.store, checkpoint_id, task):
            for name, rows in loaded.state.items():
                if table is None or name == table:
                    tagged = rows.add_column(0, "task", pa.array([loaded.snapshot.task] * rows.num_rows, pa.string()))
                    by_table.setdefault(name, []).append(tagged)
        if table is not None and table not in by_table:
            raise SnapshotMissingError(
                f"checkpoint {checkpoint_id}: no state table {table!r}"
                + (f" in task {task}" if task else "")
                + f" (tables: {', '.join(sorted(self._table_names(checkpoint_id))) or 'none'})"
            )
        return {name: _concat(parts) for name, parts in sorted(by_table.items())}

    def diff(self, a: int, b: int, *, table: str | None = None, sample: int = 10) -> list[TableDiff]:
        """How each task's state tables changed from checkpoint ``a`` to ``b``, by key."""
        before, after = self.state(a, table=table), self.state(b, table=table)
        diffs = []
        for name in sorted(set(before) | set(after)):
            # rows an operator buffers carry their origin (operators.dead_letters): not state to compare
            old, new = (None if t is None else without_origin(t) for t in (before.get(name), after.get(name)))
            template = new if new is not None else without_origin(before[name])  # a table of a, b or both
            # a table that names no keys is compared row by row (rows added and removed), a
            # row's occurrence among equal rows counting as part of it
            named = state_keys(template)
            keys = ("task", *(named or [c for c in template.column_names if c != "task"]))
            old = old if old is not None else template.schema.empty_table()
            new = new if new is not None else template.schema.empty_table()
            for task in sorted(self._tasks_with(a, name) | self._tasks_with(b, name)):
                before_rows = old.filter(pc.equal(old["task"], task))
                after_rows = new.filter(pc.equal(new["task"], task))
                if not named:
                    before_rows, after_rows = _numbered(before_rows), _numbered(after_rows)
                diff = _diff_table(
                    task, name, keys + (() if named else (_OCCURRENCE,)), before_rows, after_rows, sample
                )
                if not named:
                    diff = _unnumbered(diff)
                diffs.append(diff)
        return diffs

    def _tasks_with(self, checkpoint_id: int, table: str) -> set[str]:
        manifest = self.store.read_manifest(checkpoint_id)
        return {t for t, snapshot in manifest.tasks.items() if table in snapshot.state_tables}

    def _table_names(self, checkpoint_id: int) -> set[str]:
        manifest = self.store.read_manifest(checkpoint_id)
        return {name for t in manifest.tasks.values() for name in t.state_tables}


_OCCURRENCE = "_occurrence"


def _numbered(rows: pa.Table) -> pa.Table:
    """``rows`` with each row's occurrence among equal rows (0, 1, ...)."""
    seen: dict[tuple, int] = {}
    numbers = []
    for row in zip(*(rows[c].to_pylist() for c in rows.column_names)):
        key = tuple(repr(v) for v in row)
        numbers.append(seen.get(key, 0))
        seen[key] = numbers[-1] + 1
    return rows.append_column(_OCCURRENCE, pa.array(numbers, pa.int64()))


def _unnumbered(diff: TableDiff) -> TableDiff:
    keys = tuple(k for k in diff.keys if k != _OCCURRENCE)
    sample = diff.sample.drop_columns([_OCCURRENCE]) if _OCCURRENCE in diff.sample.column_names else diff.sample
    return TableDiff(diff.task, diff.table, keys, diff.added, diff.removed, diff.changed, diff.unchanged, sample)


def _joinable(keys: pa.Table) -> pa.Table:
    """Key columns that match on null too (a join never matches nulls): as text,
    null as a marker no text value has."""
    columns = {}
    for name in keys.column_names:
        try:
            columns[name] = pc.fill_null(pc.cast(keys[name], pa.string()), "\x00null")
        except (pa.ArrowNotImplementedError, pa.ArrowInvalid):
            columns[name] = keys[name]
    return pa.table(columns)


def _diff_table(task: str, name: str, keys: tuple[str, ...], old: pa.Table, new: pa.Table, sample: int) -> TableDiff:
    """Keys added, removed, changed and unchanged from ``old`` to ``new``."""
    values = [c for c in new.column_names if c not in keys]
    old_keys = _joinable(old.select(list(keys))).append_column("_old", pa.array(range(old.num_rows), pa.int64()))
    new_keys = _joinable(new.select(list(keys))).append_column("_new", pa.array(range(new.num_rows), pa.int64()))
    joined = new_keys.join(old_keys, list(keys), join_type="full outer")
    in_old, in_new = joined["_old"], joined["_new"]
    added = pc.and_(pc.is_null(in_old), pc.is_valid(in_new))
    removed = pc.and_(pc.is_valid(in_old), pc.is_null(in_new))
    both = joined.filter(pc.and_(pc.is_valid(in_old), pc.is_valid(in_new)))
    changed_new: list[int] = []
    if both.num_rows and values:
        left = new.select(values).take(both["_new"])
        right = old.select([c for c in values if c in old.column_names]).take(both["_old"])
        differs = pa.array([False] * both.num_rows)
        for column in values:
            if column not in right.column_names:
                differs = pa.array([True] * both.num_rows)
                break
            same = pc.fill_null(pc.equal(left[column], right[column]), False)
            nulls = pc.and_(pc.is_null(left[column]), pc.is_null(right[column]))
            differs = pc.or_(differs, pc.invert(pc.or_(same, nulls)))
        changed_new = both["_new"].filter(differs).to_pylist()
    added_new = joined["_new"].filter(added).to_pylist()
    removed_old = joined["_old"].filter(removed).to_pylist()
    parts: list[pa.Table] = []
    for change, table, index in (
        ("added", new, added_new),
        ("changed", new, changed_new),
        ("removed", old, removed_old),
    ):
        if index and len(parts) < sample:
            rows = table.take(pa.array(index[:sample], pa.int64()))
            parts.append(rows.add_column(0, "change", pa.array([change] * rows.num_rows, pa.string())))
    shown = (
        pa.concat_tables(parts, promote_options="permissive").slice(0, sample)
        if parts
        else new.schema.empty_table().add_column(0, "change", pa.array([], pa.string()))
    )
    return TableDiff(
        task,
        name,
        keys[1:],
        len(added_new),
        len(removed_old),
        len(changed_new),
        both.num_rows - len(changed_new),
        shown,
    )
