"""Keyed state: one row per key, the state of every keyed operator
(aggregates, windows, the join's right side) and of custom operators users
write.

Rows are replaced, never changed in place: a table handed out by ``table``
or ``snapshot()`` never changes afterwards, which is what makes a snapshot an
immutable copy without copying.  An empty state has no fixed types (the
first rows that arrive bring theirs), so an operator behaves the same
whether its empty state is fresh or restored.

Indexed so that a batch costs what the batch holds, not what the state
holds: a hash table (pandas' int64 table, in C) maps the 64-bit hash of each
key (polars' row hash) to a slot, numbered in order of the key's first
arrival; an array maps each slot to the position of the key's row; rows live
in immutable Arrow chunks that new rows are appended to.  Every hit is
checked against the stored key, and the rare key whose hash another key
already holds is indexed in a dict instead.  A row
replaced leaves a dead row behind; when the dead rows outnumber the live
ones (or someone reads the whole ``table``), the live rows are gathered into
one chunk in slot order.  So the whole table is always the live rows in
order of the keys' first arrival, whatever the history of compactions,
which keeps a restored state and an uninterrupted one in the same order.

The state also keeps what changed since ``changes()`` was last called (the
slots written, the keys removed), which is what an incremental checkpoint
stores instead of the whole table.

Rows need not all be in memory: under a ``StateMemory`` budget (for every
state of the process, ``use_memory``) the largest chunks held in memory are
spilled to Arrow IPC files and mapped back, so the operating system pages
them in when a batch touches them and drops them again under pressure.  The
index stays in memory (about 40 bytes per key)."""

from __future__ import annotations

import json
import threading
import uuid
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pandas._libs.hashtable import Int64HashTable

from operators._arrow import conform, plain, row_index, storable
from operators.errors import InputSchemaError, OperatorConfigError, OperatorError, StateRestoreError

__all__ = [
    "KeyedState",
    "StateChanges",
    "whole",
    "apply_changes",
    "apply_chain",
    "stored_keys",
    "latest_per_key",
    "KEYS_METADATA",
    "StateMemory",
    "use_memory",
    "current_memory",
]

# the schema metadata naming a stored state table's key columns (a JSON list)
KEYS_METADATA = b"spark-abs.keys"

# Dead rows (replaced or removed) are gathered away once they outnumber the
# live rows by this many; below it a small state is never compacted.
_SLACK_ROWS = 1 << 16


# Under a memory budget, the smallest piece a state builds at once.
_MIN_PIECE_BYTES = 1 << 20

# A state of at most this many rows (live and dead) is gathered at once by
# ``snapshot_later``: it takes a few milliseconds, and a compacted state
# makes the next batches faster.
_GATHER_LATER_ROWS = 1 << 18


def latest_per_key(rows: pa.Table, keys: Sequence[str]) -> pa.Table:
    """The last row of ``rows`` for each key, in the order of those last rows."""
    if rows.num_rows == 0:
        return rows
    index = pa.table({**{f"k{i}": rows[key] for i, key in enumerate(keys)}, "i": row_index(rows.num_rows)})
    last = index.group_by([f"k{i}" for i in range(len(keys))], use_threads=False).aggregate([("i", "max")])
    return rows.take(last.sort_by("i_max")["i_max"])


@dataclass(frozen=True, slots=True)
class StateChanges:
    """What changed in a ``KeyedState`` between two calls of ``changes()``.

    ``removed`` holds the key columns of keys removed, ``upserts`` the rows
    (as they are now) of keys written.  Removing ``removed`` from the earlier
    state and then putting ``upserts`` in gives the state now; a key may be
    in both (removed, then written again).  When the state stopped keeping
    track (``full``), ``upserts`` is the whole state, which replaces the
    earlier one."""

    upserts: pa.Table
    removed: pa.Table
    full: bool = False


def stored_keys(table: pa.Table) -> list[str] | None:
    """The key columns a stored state table names (``spark-abs.keys``), or None."""
    recorded = (table.schema.metadata or {}).get(KEYS_METADATA)
    return None if recorded is None else list(json.loads(recorded))


def apply_changes(table: pa.Table, removed: pa.Table | None, upserts: pa.Table | None, keys: Sequence[str]) -> pa.Table:
    """``table`` (one row per key) with the keys of ``removed`` taken out, then
    the rows of ``upserts`` put in: a key's new row where its old one was,
    new keys after the rest in ``upserts``' order.  That is the order a
    ``KeyedState`` keeps (first arrival), so a state rebuilt from a base and
    its changes is the state that was."""
    if removed is not None and removed.num_rows and table.num_rows:  # (an empty state's types do not count)
        table = table.filter(pc.is_null(_match(table, removed, keys)))
    if upserts is None or not upserts.num_rows:
        return table
    if not table.num_rows:
        return upserts  # an empty state's types do not count
    n = table.num_rows
    at = _match(table, upserts, keys)
    both = pa.concat_tables([table, upserts], promote_options="permissive").combine_chunks()
    kept = pc.if_else(pc.is_null(at), row_index(n), pc.add(at.cast(pa.int64()), n))
    # the upserts no row of the table matched: new keys
    matched = pc.drop_null(at).cast(pa.int64())
    fresh = pc.indices_nonzero(pc.invert(pc.is_in(row_index(upserts.num_rows), value_set=matched))).cast(pa.int64())
    return both.take(pa.concat_arrays([_array(kept), _array(pc.add(fresh, n))]))


def _array(values: pa.Array | pa.ChunkedArray) -> pa.Array:
    return values.combine_chunks() if isinstance(values, pa.ChunkedArray) else values


def apply_chain(table: pa.Table, links: Sequence[tuple[str, pa.Table]], keys: Sequence[str]) -> pa.Table:
    """``table`` with each of ``links`` (``("removed", keys)`` or ``("upserts",
    rows)``, oldest first) applied: the same as ``apply_changes`` link by
    link, but the links are folded together first, so the table (the large
    part) is gone through once."""
    removed: list[pa.Table] = []
    upserts: pa.Table | None = None
    for kind, rows in links:
        if not rows.num_rows:
            continue  # nothing to apply (and an empty table's types do not count)
        if kind == "removed":
            removed.append(rows)
            if upserts is not None:
                upserts = apply_changes(upserts, rows, None, keys)
        else:
            upserts = rows if upserts is None else apply_changes(upserts, None, rows, keys)
    gone = pa.concat_tables(removed, promote_options="permissive") if removed else None
    return apply_changes(table, gone, upserts, keys)


def _match(left: pa.Table, right: pa.Table, keys: Sequence[str]) -> pa.Array:
    """For each row of ``left``, the row of ``right`` with the same key (null when none)."""
    if len(keys) == 1:
        key = keys[0]
        values = plain(right[key]).combine_chunks()
        return pc.index_in(plain(left[key]).cast(values.type), value_set=values)
    probe = left.select(list(keys)).append_column("__l", row_index(left.num_rows))
    found = right.select(list(keys)).append_column("__r", row_index(right.num_rows))
    joined = probe.join(found, list(keys), join_type="left outer", use_threads=False).sort_by("__l")
    return joined["__r"].combine_chunks()


def whole(table: pa.Table) -> StateChanges:
    """The changes of a table an operator keeps whole (a watermark, a
    buffer): the table itself, which replaces the one before."""
    return StateChanges(table, pa.table({}), full=True)


class StateMemory:
    """A memory budget for the rows of every ``KeyedState`` of a process.

    Past ``budget_bytes`` of rows in memory, chunks are spilled: written to
    an Arrow IPC file in ``directory`` and read back memory-mapped (the file
    is unlinked once mapped, so it goes with the chunk, and a process that
    dies leaves nothing behind).  Mapped pages are clean and file-backed:
    the operating system reads them in when a batch takes rows from them and
    drops them when memory runs short.

    The states of one process change on different threads (a task each), so
    a state only ever spills its own chunks, on the thread that changes it:
    after a change it counts the bytes all the states hold in memory (each
    keeps its own count) and, while that is over the budget, spills its
    largest chunk in memory.  A state with nothing left to spill leaves the
    rest to the others' next change.  No state builds a chunk larger than
    ``piece_bytes`` (an eighth of the budget, at least 1 MiB) where it would
    otherwise build one of its whole size (merging chunks, compacting,
    popping rows).  The index of each state (its hash table and positions)
    is not counted and stays in memory."""

    def __init__(self, directory: str | Path, budget_bytes: int):
        if budget_bytes < 1:
            raise OperatorConfigError(f"a state memory budget must be at least 1 byte, got {budget_bytes}")
        self.directory = Path(directory)
        try:
            self.directory.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OperatorConfigError(f"keyed state: cannot make the spill directory {self.directory}: {exc}") from None
        self.budget_bytes = budget_bytes
        self.piece_bytes = max(_MIN_PIECE_BYTES, budget_bytes // 8)
        self._states: weakref.WeakSet[KeyedState] = weakref.WeakSet()
        self._lock = threading.Lock()
        # chunks and bytes spilled so far
        self.spilled_chunks = 0
        self.spilled_bytes = 0

    def add(self, state: KeyedState) -> None:
        with self._lock:
            self._states.add(state)

    def in_memory(self) -> int:
        """Bytes of rows the states hold in memory (as each last counted them)."""
        with self._lock:
            states = list(self._states)
        return sum(state._held for state in states)

    def enforce(self, state: KeyedState) -> None:
        """``state`` changed (on the caller's thread): spill its largest chunks
        in memory while the states together hold more than the budget."""
        state._held = state._bytes_in_memory()
        total = self.in_memory()
        if total <= self.budget_bytes:
            return
        held = sorted(
            ((chunk.nbytes, i) for i, chunk in enumerate(state._chunks) if not state._mapped[i]), reverse=True
        )
        for nbytes, i in held:
            if total <= self.budget_bytes:
                break
            state._chunks[i] = self.spill(state._chunks[i])
            state._mapped[i] = True
            state._table = None  # it may hold the chunk's rows in memory
            state._held -= nbytes
            total -= nbytes

    def spill(self, table: pa.Table) -> pa.Table:
        """``table`` written to a file and mapped back."""
        path = self.directory / f"{uuid.uuid4().hex}.arrow"
        try:
            self.directory.mkdir(parents=True, exist_ok=True)  # close() may have removed it
            with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)
            mapped = pa.ipc.open_file(pa.memory_map(str(path))).read_all()
        except (OSError, pa.ArrowException) as exc:
            raise OperatorError(f"keyed state: could not spill {table.nbytes} bytes of rows to {path}: {exc}") from exc
        finally:
            path.unlink(missing_ok=True)
        with self._lock:
            self.spilled_chunks += 1
            self.spilled_bytes += table.nbytes
        return mapped

    def close(self) -> None:
        """Remove the (empty) spill directory; states still spilling make it again."""
        try:
            self.directory.rmdir()
        except OSError:
            pass


_memory: StateMemory | None = None


def current_memory() -> StateMemory | None:
    """The budget keyed states made now spill under (``use_memory``)."""
    return _memory


def use_memory(memory: StateMemory | None) -> StateMemory | None:
    """Keyed states made from now on in this process spill under ``memory``
    (None: they keep every row in memory).  Returns the one used before."""
    global _memory
    previous, _memory = _memory, memory
    return previous


class KeyedState:
    """A table with one row per key: key columns and value columns.

    ``merge`` folds per-key partial results into the state (aggregates),
    ``upsert`` replaces whole rows (latest value per key), ``lookup`` reads
    rows for a column of keys, ``pop`` takes rows out.  Keys are never null.
    ``changes()`` says what changed since it was last called."""

    __slots__ = (
        "keys",
        "operator",
        "_placeholder",
        "_schema",
        "_hash",
        "_overflow",
        "_live",
        "_positions",
        "_slots",
        "_chunks",
        "_mapped",
        "_memory",
        "_held",
        "_starts",
        "_rows",
        "_table",
        "_dirty",
        "_removed",
        "_removed_count",
        "_untracked",
        "__weakref__",
    )
    # what changed since changes() was last called (_track_from_here sets them)
    _dirty: np.ndarray
    _removed: list[pa.Table]
    _removed_count: int
    _untracked: bool

    def __init__(self, keys: Sequence[str], value_columns: Sequence[str] = (), *, operator: str = "KeyedState"):
        if not keys:
            raise OperatorConfigError(f"{operator}: keyed state needs at least one key column")
        self.keys: tuple[str, ...] = tuple(keys)
        self.operator = operator
        # an empty state's types do not count; int64 is only a placeholder
        self._placeholder = pa.table({name: pa.array([], pa.int64()) for name in (*self.keys, *value_columns)})
        self._memory = _memory
        self._held = 0  # bytes of rows in memory, as the memory budget last counted them
        if _memory is not None:
            _memory.add(self)
        self._load(self._placeholder)

    # ---- reading

    @property
    def table(self) -> pa.Table:
        """The state as it is now (an immutable table), rows in order of
        their keys' first arrival."""
        if self._table is None:
            self._compact()
        return self._table

    def __len__(self) -> int:
        return self._live

    @property
    def schema(self) -> pa.Schema:
        """The state's columns and types (an empty state's are placeholders)."""
        return self._schema

    def contains(self, keys: pa.Table) -> np.ndarray:
        """Whether the state holds each row's key (``keys``: the key columns,
        the state's types), without reading the rest of the state."""
        if not self._live:
            return np.zeros(keys.num_rows, bool)
        return self._slots_of(keys, create=False) >= 0

    def lookup(self, keys: pa.ChunkedArray | pa.Array) -> pa.Table:
        """The state's row for each of ``keys`` (single key column only), in
        the same order; a row of nulls where the state has none."""
        if len(self.keys) != 1:
            raise OperatorConfigError(f"{self.operator}: lookup needs a single key column, the state has {self.keys}")
        if not self._live:
            return self.table.take(pa.nulls(len(keys), pa.int64()))
        probe = pa.table({self.keys[0]: self._same_type(keys, self._schema.field(self.keys[0]).type)})
        slots = self._slots_of(probe, create=False)
        found = slots >= 0
        rows = self._take(self._positions[slots[found]])
        at = np.cumsum(found) - 1
        return rows.take(pa.array(at, mask=~found))

    def snapshot(self) -> pa.Table:
        """The state to store, its key columns named in the schema's metadata
        (``spark-abs.keys``, what ``spark-abs checkpoints diff`` compares by)."""
        return self._stored(self.table)

    def snapshot_later(self) -> Callable[[], pa.Table]:
        """``snapshot()`` as a function to call later, on another thread: what
        it needs is taken now (the chunks, which never change, and where each
        live row is: a copy of the positions, not of the rows), and the rows
        are gathered when it is called, whatever the state did meanwhile.  A
        small state is gathered now."""
        if self._table is not None or self._in_slot_order() or self._rows <= _GATHER_LATER_ROWS:
            table = self.snapshot()  # no copy, or a small one (which also leaves the state compacted)
            return lambda: table
        positions = self._positions[: self._slots]
        positions = positions[positions >= 0]
        chunks, starts = list(self._chunks), list(self._starts)
        return lambda: self._stored(self._take(positions, chunks=chunks, starts=starts))

    def changes(self) -> StateChanges:
        """What changed since the last call (or since ``restore``, or since
        the state was made); the next call starts from here.  A state whose
        changes outgrew it stops keeping track and says so (``full``)."""
        if self._untracked:
            changes = StateChanges(self.snapshot(), self._key_columns(self.table.slice(0, 0)), full=True)
        else:
            positions = self._positions[np.flatnonzero(self._dirty[: self._slots])]
            upserts = self._take(positions[positions >= 0])
            removed = pa.concat_tables(self._removed) if self._removed else self._key_columns(upserts.slice(0, 0))
            changes = StateChanges(self._stored(upserts), removed)
        self._track_from_here()
        return changes

    # ---- writing

    def merge(
        self,
        partial: pa.Table,
        combine: Callable[[pa.Table], pa.Table],
        fold: Callable[[pa.Table, pa.Table], pa.Table | None] | None = None,
    ) -> pa.Table:
        """Fold ``partial`` (at most one row per key, the state's columns) into
        the state and return the new rows of the keys it holds, in its order.

        ``combine`` gets the partial rows followed by the state's rows for the
        same keys and returns one row per key (in any order).  ``fold``, if
        given, does the same row by row: it gets the partial rows of keys the
        state holds and the state's rows of the same keys in the same order,
        and returns the columns it combined (None: let ``combine`` do it)."""
        if not self._live:
            self._start_over(partial)
            return partial
        partial = conform(partial, self._schema, self.operator, "batch")
        slots = self._slots_of(partial, create=True)
        positions = self._positions[slots]
        combined = self._folded(partial, positions, fold) if fold is not None else None
        if combined is None:
            combined = combine(pa.concat_tables([partial, self._take(positions[positions >= 0])]))
            combined = self._in_order_of(partial, conform(combined, self._schema, self.operator, "combined rows"))
        if combined.num_rows:
            self._append(combined, slots)
        return combined

    def upsert(self, rows: pa.Table) -> None:
        """Make ``rows`` (at most one per key) the rows of their keys; other
        keys keep theirs.  Columns missing on either side become null."""
        if not self._live:
            self._start_over(rows)
            return
        rows = self._fit(rows)
        if rows.num_rows:
            self._append(rows, self._slots_of(rows, create=True))

    def pop(self, mask: pa.ChunkedArray | pa.Array) -> pa.Table:
        """Take the rows where ``mask`` (over ``table``) is true out of the
        state and return them."""
        table = self.table
        taken = table.filter(mask)
        if not taken.num_rows:
            return taken
        live = np.flatnonzero(self._positions[: self._slots] >= 0)
        gone = _array(pc.fill_null(mask, False)).to_numpy(zero_copy_only=False).astype(bool)
        self._forget(taken, live[gone])
        kept = live[~gone]
        self._positions[kept] = np.arange(len(kept))
        self._replace_rows(
            table.slice(start, end - start).filter(pa.array(~gone[start:end])).combine_chunks()
            for start, end in self._pieces(table.num_rows)
        )
        if not self._untracked:
            self._removed.append(self._key_columns(taken))
            self._removed_count += taken.num_rows
            if self._removed_count > self._live + _SLACK_ROWS:
                self._stop_tracking()
        return taken

    def restore(self, table: pa.Table, table_name: str) -> None:
        """Take ``table`` as the state, after checking it has the key columns,
        no null key and no key twice (StateRestoreError otherwise)."""
        missing = [key for key in self.keys if key not in table.column_names]
        if missing:
            raise StateRestoreError(
                f"{self.operator}: snapshot table {table_name!r} lacks key column(s) {missing} (has {table.column_names})"
            )
        for key in self.keys:
            if table[key].null_count:
                raise StateRestoreError(f"{self.operator}: snapshot table {table_name!r} has null keys in {key!r}")
        if table.num_rows:
            distinct = table.group_by(list(self.keys), use_threads=False).aggregate([]).num_rows
            if distinct != table.num_rows:
                raise StateRestoreError(
                    f"{self.operator}: snapshot table {table_name!r} holds {table.num_rows - distinct} duplicate key(s)"
                )
        # the stored key names stay in the store: rows taken from the state must not carry them downstream
        self._load(table.replace_schema_metadata(None))

    # ---- the index

    def _load(self, table: pa.Table) -> None:
        """Make ``table`` (no key twice) the whole state, tracking from here."""
        table = table.combine_chunks()
        self._schema = table.schema
        self._chunks, self._mapped, self._starts, self._rows = [table], [False], [0], table.num_rows
        self._table: pa.Table | None = table
        self._positions = np.arange(max(table.num_rows, 16), dtype=np.int64)
        self._reindex(table)
        self._track_from_here()
        self._enforce_memory()

    def _reindex(self, table: pa.Table) -> None:
        """Index ``table``, the live rows in slot order: row i is slot i."""
        n = table.num_rows
        self._hash = Int64HashTable(max(n, 16))
        self._slots = self._live = n
        hashes = self._hashes(table)
        self._hash.map_keys_to_values(hashes, np.arange(n, dtype=np.int64))
        # two keys of one hash: the table keeps the last, the dict the others
        clash = np.flatnonzero(self._hash.lookup(hashes) != np.arange(n))
        self._overflow: dict = dict(zip(self._key_list(table.take(clash)), clash.tolist())) if len(clash) else {}

    def _start_over(self, rows: pa.Table) -> None:
        """An empty state takes ``rows`` (at most one per key) with their types."""
        removed, removed_count, untracked = self._removed, self._removed_count, self._untracked
        self._load(rows)
        # what was removed before still has to reach the next changes()
        self._removed, self._removed_count, self._untracked = removed, removed_count, untracked
        if not untracked and rows.num_rows:
            self._dirty[: rows.num_rows] = True

    def _hashes(self, rows: pa.Table) -> np.ndarray:
        """A 64-bit hash of each row's key (polars' row hash, seed 0)."""
        keys = pa.table({key: plain(rows[key]) for key in self.keys})
        try:
            frame = pl.from_arrow(keys)
        except Exception as exc:  # polars names its own errors; any of them means this key type is out
            raise InputSchemaError(f"{self.operator}: keys of type {keys.schema} cannot index a state: {exc}") from None
        # a table makes a DataFrame (polars' overloads cannot tell, pyarrow being untyped here)
        return cast(pl.DataFrame, frame).hash_rows(seed=0).to_numpy().view(np.int64)

    def _key_list(self, rows: pa.Table) -> list:
        """The keys of ``rows`` as Python values (tuples for several key columns)."""
        if len(self.keys) == 1:
            return plain(rows[self.keys[0]]).to_pylist()
        return list(zip(*(plain(rows[key]).to_pylist() for key in self.keys)))

    def _slots_of(self, rows: pa.Table, *, create: bool) -> np.ndarray:
        """The slot of each row's key (at most one row per key); new keys get
        new slots when ``create``, -1 otherwise."""
        hashes = self._hashes(rows)
        slots = self._hash.lookup(hashes)
        hit = np.flatnonzero(slots >= 0)
        if len(hit):
            other = hit[~self._same_keys(rows, hit, self._positions[slots[hit]])]
            slots[other] = -1  # a key of the same hash holds the table's entry
        if self._overflow:
            missed = np.flatnonzero(slots < 0)
            get = self._overflow.get
            slots[missed] = [get(key, -1) for key in self._key_list(rows.take(missed))]
        if create:
            new = np.flatnonzero(slots < 0)
            if len(new):
                self._new_slots(rows, hashes, slots, new)
        return slots

    def _new_slots(self, rows: pa.Table, hashes: np.ndarray, slots: np.ndarray, new: np.ndarray) -> None:
        first = self._slots
        ids = np.arange(first, first + len(new), dtype=np.int64)
        slots[new] = ids
        self._slots += len(new)
        self._live += len(new)
        if self._slots > len(self._positions):
            size = max(self._slots, 2 * len(self._positions))
            self._positions = np.concatenate([self._positions[:first], np.empty(size - first, np.int64)])
            self._dirty = np.concatenate([self._dirty[:first], np.zeros(size - first, bool)])
        self._positions[first : self._slots] = -1
        fresh = hashes[new]
        free = self._hash.lookup(fresh) < 0  # hashes no live key holds
        self._hash.map_keys_to_values(fresh[free], ids[free])
        mine = np.zeros(len(new), bool)
        mine[free] = self._hash.lookup(fresh[free]) == ids[free]  # two new keys of one hash: one wins
        if not mine.all():
            self._overflow.update(zip(self._key_list(rows.take(new[~mine])), ids[~mine].tolist()))

    def _same_keys(self, rows: pa.Table, at: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """Whether the key of each row ``at`` is the key stored at ``positions``."""
        stored = self._take(positions, self.keys)
        same = None
        for key in self.keys:
            equal = pc.fill_null(pc.equal(plain(rows[key]).take(at), stored[key]), False)
            same = equal if same is None else pc.and_(same, equal)
        return np.asarray(_array(same), dtype=bool)

    def _forget(self, taken: pa.Table, slots: np.ndarray) -> None:
        """The keys of ``taken`` (the rows of ``slots``) leave the index."""
        hashes = self._hashes(taken)
        if self._overflow:
            held = np.array([self._overflow.pop(key, None) is not None for key in self._key_list(taken)], bool)
            hashes = hashes[~held]
        self._hash.map_keys_to_values(hashes, np.full(len(hashes), -1, np.int64))
        self._positions[slots] = -1
        self._live -= len(slots)

    def _folded(
        self, partial: pa.Table, positions: np.ndarray, fold: Callable[[pa.Table, pa.Table], pa.Table | None]
    ) -> pa.Table | None:
        """``partial`` with the rows of keys the state holds folded into the
        state's (``fold``), in ``partial``'s order: no grouping, no reordering."""
        held = positions >= 0
        if not held.any():
            return partial
        at = np.flatnonzero(held)
        folded = fold(partial.take(at), self._take(positions[at]))
        if folded is None:
            return None
        mask = pa.array(held)
        columns = [
            pc.replace_with_mask(partial[name].combine_chunks(), mask, folded[name].combine_chunks())
            if name in folded.column_names
            else partial[name]
            for name in partial.column_names
        ]
        return pa.Table.from_arrays(columns, schema=partial.schema)

    def _in_order_of(self, partial: pa.Table, combined: pa.Table) -> pa.Table:
        """``combined`` (one row per key of ``partial``) in ``partial``'s order:
        Arrow's grouping does not keep the order of first appearance."""
        at = _match(partial, combined, self.keys)
        if combined.num_rows != partial.num_rows or at.null_count:
            raise OperatorError(
                f"{self.operator}: combine returned {combined.num_rows} rows for the {partial.num_rows} keys "
                "of a batch (it must return one row per key)"
            )
        return combined.take(at)

    def _take(
        self,
        positions: np.ndarray,
        columns: Sequence[str] | None = None,
        *,
        chunks: list[pa.Table] | None = None,
        starts: list[int] | None = None,
    ) -> pa.Table:
        """The rows at ``positions`` (all live), in that order (only ``columns``,
        if given), of the state's chunks (or of ``chunks`` starting at ``starts``)."""
        if chunks is None:
            chunks, starts = self._chunks, self._starts
        chunks = chunks if columns is None else [chunk.select(list(columns)) for chunk in chunks]
        if len(chunks) == 1:
            return chunks[0].take(positions)
        if starts is None:
            raise OperatorError(f"{self.operator}: chunks to take rows from come with their starts")
        chunk = np.searchsorted(starts, positions, side="right") - 1
        # chunks are few (a binary counter's worth): a stable sort of bytes is a radix sort
        order = np.argsort(chunk.astype(np.uint8) if len(chunks) < 256 else chunk, kind="stable")
        by_chunk = chunk[order]
        bounds = np.flatnonzero(np.diff(by_chunk)) + 1
        parts = [
            chunks[by_chunk[start]].take(positions[part] - starts[by_chunk[start]])
            for start, part in zip([0, *bounds.tolist()], np.split(order, bounds))
            if len(part)
        ]
        if len(parts) <= 1:
            return parts[0] if parts else chunks[0].slice(0, 0)
        gathered = pa.concat_tables(parts).combine_chunks()
        back = np.empty_like(order)
        back[order] = np.arange(len(order))
        return gathered.take(back)

    def _append(self, rows: pa.Table, slots: np.ndarray) -> None:
        """``rows`` (the state's schema, one per slot) become the rows of ``slots``."""
        start = self._rows
        self._chunks.append(rows.combine_chunks())
        self._mapped.append(False)
        self._starts.append(start)
        # neighbours of like size merge (a binary counter): few chunks, each row copied O(log n) times
        # (under a memory budget, not past a piece's size)
        while (
            len(self._chunks) > 2
            and self._chunks[-2].num_rows <= 2 * self._chunks[-1].num_rows
            and (self._memory is None or self._chunks[-2].nbytes + self._chunks[-1].nbytes <= self._memory.piece_bytes)
        ):
            merged = pa.concat_tables(self._chunks[-2:]).combine_chunks()
            del self._chunks[-2:], self._mapped[-2:], self._starts[-1]
            self._chunks.append(merged)
            self._mapped.append(False)
        self._positions[slots] = np.arange(start, start + rows.num_rows)
        self._rows += rows.num_rows
        self._table = None
        if not self._untracked:
            self._dirty[slots] = True
        if self._rows > 2 * self._live + _SLACK_ROWS:
            self._compact()
        else:
            self._enforce_memory()

    def _compact(self) -> None:
        """Gather the live rows into one chunk in slot order; renumber the
        slots when most of them belong to keys removed.  A state that only
        ever took new keys is its chunks as they are: the whole table costs
        no copy (a growing state's full snapshot)."""
        if self._in_slot_order():
            self._table = pa.concat_tables(self._chunks)
            return
        live = np.flatnonzero(self._positions[: self._slots] >= 0)
        at = self._positions[live]
        chunks, starts = self._chunks, self._starts
        table = self._replace_rows(
            self._take(at[start:end], chunks=chunks, starts=starts) for start, end in self._pieces(len(live))
        )
        if self._slots > 2 * len(live) + _SLACK_ROWS:
            self._dirty[: len(live)] = self._dirty[live]
            self._dirty[len(live) : self._slots] = False
            self._reindex(table)  # also drops the hashes of keys removed
            self._positions[: len(live)] = np.arange(len(live))
        else:
            self._positions[live] = np.arange(len(live))

    def _in_slot_order(self) -> bool:
        """Whether the chunks are the live rows in slot order (a state that
        only ever took new keys)."""
        positions = self._positions[: self._slots]
        return bool(self._rows == self._slots and self._slots and positions[0] == 0 and np.all(np.diff(positions) == 1))

    def _pieces(self, rows: int) -> list[tuple[int, int]]:
        """[start, end) ranges of ``rows`` rows of the state that make chunks
        of at most a piece (one range when the state has no memory budget)."""
        if self._memory is None or not rows:
            return [(0, rows)]
        held = sum(chunk.nbytes for chunk in self._chunks)
        per_piece = max(1, int(self._memory.piece_bytes * self._rows / max(held, 1)))
        return [(start, min(rows, start + per_piece)) for start in range(0, rows, per_piece)]

    def _replace_rows(self, pieces: Iterator[pa.Table]) -> pa.Table:
        """The live rows, in slot order, become ``pieces`` (one chunk each, in
        memory until the budget spills them; ``_pieces`` gives at least one,
        empty when no row is live); the whole table comes back."""
        self._chunks, self._mapped, self._starts, self._rows = [], [], [], 0
        for piece in pieces:
            self._chunks.append(piece)
            self._mapped.append(False)
            self._starts.append(self._rows)
            self._rows += piece.num_rows
            self._enforce_memory()
        self._table = pa.concat_tables(self._chunks)
        return self._table

    def _enforce_memory(self) -> None:
        if self._memory is not None:
            self._memory.enforce(self)

    def _bytes_in_memory(self) -> int:
        return sum(chunk.nbytes for chunk, mapped in zip(self._chunks, self._mapped) if not mapped)

    # ---- schemas and tracking

    def _fit(self, rows: pa.Table) -> pa.Table:
        """``rows`` with the state's columns and types; a row with a column the
        state lacks (or a wider type) widens the state first."""
        if rows.schema.equals(self._schema):
            return rows
        try:
            wider = pa.unify_schemas([self._schema, rows.schema], promote_options="permissive")
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            raise InputSchemaError(
                f"{self.operator}: rows {rows.schema} do not fit the state's {self._schema}: {exc}"
            ) from None
        if not wider.equals(self._schema):
            self._chunks = [_with_schema(chunk, wider) for chunk in self._chunks]
            self._mapped = [False] * len(self._chunks)  # counted as in memory until spilled again
            self._schema = wider
            self._table = None
        return _with_schema(rows, wider)

    def _same_type(self, values: pa.ChunkedArray | pa.Array, type_: pa.DataType) -> pa.ChunkedArray | pa.Array:
        values = plain(values) if isinstance(values, pa.ChunkedArray) else values
        if values.type == type_:
            return values
        try:
            return values.cast(type_)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputSchemaError(
                f"{self.operator}: keys of type {values.type} do not match the state's {type_}: {exc}"
            ) from None

    def _key_columns(self, rows: pa.Table) -> pa.Table:
        return rows.select(list(self.keys)).replace_schema_metadata(None)

    def _stored(self, table: pa.Table) -> pa.Table:
        return storable(table).replace_schema_metadata({KEYS_METADATA: json.dumps(list(self.keys))})

    def _track_from_here(self) -> None:
        self._dirty = np.zeros(len(self._positions), bool)  # per slot: written since the last changes()
        self._removed = []
        self._removed_count = 0
        self._untracked = False

    def _stop_tracking(self) -> None:
        """More was removed than the state holds: the next ``changes()`` is the
        whole state (cheaper than the removals), so stop recording them."""
        self._dirty[:] = False
        self._removed, self._removed_count = [], 0
        self._untracked = True


def _with_schema(table: pa.Table, schema: pa.Schema) -> pa.Table:
    """``table`` with ``schema``'s columns (missing ones null) and types."""
    columns = [
        table[field.name].cast(field.type) if field.name in table.column_names else pa.nulls(table.num_rows, field.type)
        for field in schema
    ]
    return pa.Table.from_arrays(columns, schema=schema)
