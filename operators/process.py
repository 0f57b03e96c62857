"""A keyed operator users write themselves, with per-key state and event-time
timers: the shape of Flink's ``KeyedProcessFunction`` and Spark's
``transformWithState`` / ``StatefulProcessor``.

The user writes a ``KeyedProcessFunction`` (``process_rows`` and, if it sets
timers, ``on_timer``); ``KeyedProcess`` runs it per key and keeps what it
leaves behind.  Each call gets a ``KeyContext``: the key's ``state`` (a
dict of JSON values, ``{}`` for none), the ``watermark``, and the key's
event-time timers (``register_timer``, ``delete_timer``, ``timers``,
``clear``).

``process(batch)``:

1. rows with a null key go to the dead letters (``null_key``); with a
   ``time_column``, rows with a null event time too (``null_event_time``),
   and rows behind the watermark (time < watermark) are late (``late``);
2. the other rows are grouped by key, keys in the order of their first row
   in the batch, each key's rows in batch order, and ``process_rows(key,
   rows, ctx)`` is called once per key;
3. the rows (dicts) the calls return, in call order, are the output.

``on_watermark(w)``: the watermark becomes ``max(watermark, w)`` (the
engine's watermark: rows never move it) and every timer at or before it
fires, once, in (timestamp, key) order: ``on_timer(key, timestamp, ctx)``
is called and what it returns is the output.  A timer registered at or
before the watermark (in ``process_rows``, or in ``on_timer``) fires at the
next ``on_watermark`` call, or later in the same call when ``on_timer``
registered it; it fires in its (timestamp, key) place among the timers still
due, so a function that always registers a due timer again never returns.

The contract a function keeps, so that the operator keeps the resume
contract of ``operators.base``:

1. Everything it remembers is in ``ctx.state`` and its timers.  Attributes
   of the function object are not in any snapshot and are lost on restore.
2. ``ctx.state`` is stored as JSON text after every call, and every call
   gets it back from that text: tuples come back as lists, dict keys as
   strings, whether or not a restore happened in between.  A value JSON
   cannot hold (a set, NaN, a datetime) raises ``OperatorError`` at the call
   that left it.  An empty dict is no state: a key with neither state nor
   timers is forgotten.
3. What it returns and leaves depends only on the key, the rows and the
   context it is given, never on the clock, randomness or other keys.
4. For the output not to depend on how the input was cut into batches,
   ``process_rows`` must leave the same state and timers, and return the
   same rows in all, whether a key's rows come in one call or in several (like a
   fold: ``process_rows(k, a + b)`` = ``process_rows(k, a)`` then
   ``process_rows(k, b)``).  Batch boundaries are not part of the input the
   engine promises to keep.

If a call raises, the operator is left as it was before ``process`` or
``on_watermark`` was called (state, timers, watermark, dead letters) and
the exception propagates.  Timers are event time only (milliseconds, the
engine's watermark); there are no processing-time timers, since output
never depends on the clock.  Rows returned by ``on_timer`` go downstream
with the watermark that fired them: give them an event time no earlier
than the timer's if a later stage follows event time.  Having
``on_watermark``, the operator follows event time: a stage running it
needs an input that carries event time (``streaming.api.partitioning``)."""

from __future__ import annotations

import datetime as dt
import heapq
import json
import operator as _operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, SupportsIndex

import pyarrow as pa
import pyarrow.compute as pc

from operators._arrow import expect_columns, expect_tables, plain, require_columns, storable
from operators.dead_letters import DeadLetters, Reason, without_origin
from operators.errors import InputSchemaError, OperatorConfigError, OperatorError, StateRestoreError
from operators.keyed import key_name, split_null_keys
from operators.rescale import MIN, RESCALE_METADATA, rows_by
from operators.state import KEYS_METADATA, KeyedState

__all__ = ["KeyedProcess", "KeyedProcessFunction", "KeyContext"]

_INT64_MIN, _INT64_MAX = -(1 << 63), (1 << 63) - 1
_PER_MS = {"s": None, "ms": 1, "us": 1_000, "ns": 1_000_000}
_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)
# the heap keeps timers deleted since they were pushed; past twice the live
# ones (and this many), it is rebuilt
_HEAP_SLACK = 64


class KeyedProcessFunction:
    """What a ``KeyedProcess`` runs per key; subclass it.

    ``process_rows(key, rows, ctx)`` gets the key (a Python value), its rows
    of the batch as dicts (every column, in batch order) and its
    ``KeyContext``; ``on_timer(key, timestamp, ctx)`` is called when a timer
    of the key fires.  Both return the output rows: an iterable of dicts
    (a list, a tuple, a generator; None is no rows).  See the module
    docstring for the contract (state in ``ctx.state`` only, JSON values,
    the same result however a key's rows are cut into calls)."""

    def process_rows(self, key: Any, rows: list[dict[str, Any]], ctx: KeyContext) -> Iterable[dict[str, Any]] | None:
        raise NotImplementedError(f"{type(self).__qualname__} must define process_rows(key, rows, ctx)")

    def on_timer(self, key: Any, timestamp: int, ctx: KeyContext) -> Iterable[dict[str, Any]] | None:
        return ()


class KeyContext:
    """One key's view, handed to one call of ``process_rows`` or ``on_timer``
    and valid only during it.

    ``key``: the key.  ``state``: the key's state, a dict of JSON values
    (``{}``: none); change it in place or assign a new dict.  ``watermark``:
    the operator's watermark in ms (None before the first ``on_watermark``);
    in ``on_timer`` the one that fired the timer.  Timers are event-time
    milliseconds, at most one per timestamp per key."""

    __slots__ = ("key", "state", "watermark", "_timers", "_open")

    def __init__(self, key: Any, state: dict[str, Any], timers: Iterable[int], watermark: int | None):
        self.key = key
        self.state = state
        self.watermark = watermark
        self._timers = set(timers)
        self._open = True

    def register_timer(self, timestamp: int) -> None:
        """Fire ``on_timer`` for this key once the watermark reaches
        ``timestamp`` (ms); registering it twice is one timer."""
        self._timers.add(self._timestamp(timestamp, "register_timer"))

    def delete_timer(self, timestamp: int) -> None:
        """Remove the timer at ``timestamp`` (nothing if there is none)."""
        self._timers.discard(self._timestamp(timestamp, "delete_timer"))

    def timers(self) -> list[int]:
        """The key's timers, earliest first (not the one firing now)."""
        self._check_open("timers")
        return sorted(self._timers)

    def clear(self) -> None:
        """Drop the key's state and all its timers."""
        self._check_open("clear")
        self.state = {}
        self._timers.clear()

    def _timestamp(self, timestamp: object, method: str) -> int:
        self._check_open(method)
        try:
            if isinstance(timestamp, bool) or not isinstance(timestamp, SupportsIndex):
                raise TypeError
            value = _operator.index(timestamp)
        except TypeError:
            raise OperatorError(f"KeyContext.{method}: timestamp must be an int (ms), got {timestamp!r}") from None
        if not _INT64_MIN <= value <= _INT64_MAX:
            raise OperatorError(f"KeyContext.{method}: timestamp {value} does not fit in int64 milliseconds")
        return value

    def _check_open(self, method: str) -> None:
        if not self._open:
            raise OperatorError(
                f"KeyContext.{method}: the context of key {self.key!r} was used after the call it was given to"
            )

    def __repr__(self) -> str:
        return f"KeyContext(key={self.key!r}, state={self.state!r}, timers={sorted(self._timers)})"


FunctionSpec = KeyedProcessFunction | Callable[[], KeyedProcessFunction]


def _function_of(function: object, operator: str) -> KeyedProcessFunction:
    """The function object: ``function`` itself, or what calling it (a class
    or a factory) returns."""
    if isinstance(function, type) or not callable(getattr(function, "process_rows", None)):
        if not callable(function):
            raise OperatorConfigError(
                f"{operator}: function must be a KeyedProcessFunction or a callable returning one, got {function!r}"
            )
        function = function()
    if not callable(getattr(function, "process_rows", None)):
        raise OperatorConfigError(
            f"{operator}: function must be a KeyedProcessFunction (with process_rows), got {function!r}"
        )
    return function  # type: ignore[return-value]


def _key_type_ok(type_: pa.DataType) -> bool:
    """Keys are scalars: their Python values are hashable and ordered."""
    return not pa.types.is_nested(type_)


class KeyedProcess:
    """Runs ``function`` (a ``KeyedProcessFunction``, its class, or a
    factory returning one) per value of ``key``, with per-key state and
    event-time timers; see the module docstring for the rules.

    ``time_column`` (integer ms or a timestamp column): rows behind the
    watermark go to the dead letters as late, rows with a null time as
    ``null_event_time``; without it no row is late.  ``output_schema``: the
    columns and types of the output (rows are converted to it; a column a
    row lacks is null; an empty output still has the columns).  Without
    it, the output's columns are those the rows name, in order of first
    appearance, with the types Arrow infers; an empty output has no columns.
    Keys may be of any scalar Arrow type; state and timers keep it.

    An abandoned cart: a user's cart is reported once 10 s of event time
    pass without an item added.

    >>> import pyarrow as pa
    >>> from operators.process import KeyedProcess, KeyedProcessFunction
    >>> class AbandonedCart(KeyedProcessFunction):
    ...     def process_rows(self, key, rows, ctx):
    ...         for timer in ctx.timers():
    ...             ctx.delete_timer(timer)
    ...         ctx.state["items"] = ctx.state.get("items", 0) + len(rows)
    ...         ctx.state["last"] = max([ctx.state.get("last", rows[0]["t"])] + [row["t"] for row in rows])
    ...         ctx.register_timer(ctx.state["last"] + 10_000)
    ...
    ...     def on_timer(self, key, timestamp, ctx):
    ...         items = ctx.state["items"]
    ...         ctx.clear()
    ...         return [{"user": key, "items": items, "at": timestamp}]
    >>> op = KeyedProcess("user", AbandonedCart, time_column="t")
    >>> op.process(pa.table({"user": ["ann", "bob", "ann"], "t": [1_000, 2_000, 5_000]})).num_rows
    0
    >>> op.on_watermark(12_000).to_pylist()
    [{'user': 'bob', 'items': 1, 'at': 12000}]
    >>> op.process(pa.table({"user": ["ann", "bob"], "t": [13_000, 11_000]})).num_rows
    0
    >>> [(letter.row["user"], letter.reason) for letter in op.dead_letters.drain()]
    [('bob', 'late')]
    >>> op.on_watermark(30_000).to_pylist()
    [{'user': 'ann', 'items': 3, 'at': 23000}]

    State: ``{"state": (key, state as JSON text) per key with state,
    "timers": (key, timestamp) per timer, "watermark": one row, int64 ms or
    null before the first on_watermark}``."""

    STATE = "state"
    TIMERS = "timers"
    WATERMARK = "watermark"
    TIMESTAMP = "timestamp"

    def __init__(
        self,
        key: str,
        function: FunctionSpec,
        *,
        time_column: str | None = None,
        output_schema: pa.Schema | None = None,
        dead_letters: DeadLetters | None = None,
    ):
        name = type(self).__name__
        self.key = key_name(key, name)
        if self.key in (self.STATE, self.TIMESTAMP):
            raise OperatorConfigError(
                f"{name}: key {self.key!r} is reserved for a column of the snapshot tables "
                f"({self.STATE!r}, {self.TIMESTAMP!r}); rename the column"
            )
        if time_column is not None and not (isinstance(time_column, str) and time_column):
            raise OperatorConfigError(
                f"{name}: time_column must be a non-empty column name or None, got {time_column!r}"
            )
        self.time_column = time_column
        if output_schema is not None:
            if not isinstance(output_schema, pa.Schema):
                raise OperatorConfigError(
                    f"{name}: output_schema must be a pyarrow.Schema or None, got {type(output_schema).__name__}"
                )
            if len(set(output_schema.names)) != len(output_schema.names):
                raise OperatorConfigError(f"{name}: output_schema names a column twice: {output_schema.names}")
        self.output_schema = output_schema
        if dead_letters is not None and not isinstance(dead_letters, DeadLetters):
            raise OperatorConfigError(f"{name}: dead_letters must be a DeadLetters collector, got {dead_letters!r}")
        self.dead_letters = dead_letters if dead_letters is not None else DeadLetters()
        self.function = _function_of(function, name)
        self._states: dict[Any, str] = {}  # key -> JSON text of a non-empty dict
        self._timers: dict[Any, frozenset[int]] = {}  # key -> its timers (never empty)
        self._heap: list[tuple[int, Any]] = []  # (timestamp, key), including timers deleted since
        self._live = 0  # timers in _timers
        self._key_type: pa.DataType | None = None  # the type of the keys held; None when none is
        self._watermark: int | None = None

    @property
    def watermark(self) -> int | None:
        """Milliseconds; None until the first ``on_watermark``."""
        return self._watermark

    @property
    def state_keys(self) -> dict[str | None, str]:
        """The column that divides the state (``streaming.api.partitioning``)."""
        return {None: self.key}

    def state_of(self, key: Any) -> dict[str, Any]:
        """The state of ``key`` (a copy; ``{}`` for none)."""
        text = self._states.get(key)
        return json.loads(text) if text is not None else {}

    def timers_of(self, key: Any) -> list[int]:
        """The timers of ``key``, earliest first."""
        return sorted(self._timers.get(key, ()))

    # ---------------------------------------------------------------- processing

    def process(self, batch: pa.Table) -> pa.Table:
        name = type(self).__name__
        require_columns(batch, [self.key, *([self.time_column] if self.time_column else [])], name)
        letters = DeadLetters()  # handed on only when every call succeeded
        batch = split_null_keys(batch, self.key, letters, name)
        batch = self._keys_as_held(batch)
        if self.time_column is not None:
            batch = self._on_time(batch, letters)
        batch = without_origin(batch)  # the function sees the rows as the stage's input has them
        groups: dict[Any, list[dict[str, Any]]] = {}
        for key, row in zip(batch[self.key].to_pylist(), batch.to_pylist()):
            groups.setdefault(key, []).append(row)
        changes: dict[Any, tuple[str | None, frozenset[int]]] = {}
        out: list[dict[str, Any]] = []
        for key, rows in groups.items():
            ctx = self._context(key, changes, self._watermark)
            out += self._rows(self.function.process_rows(key, rows, ctx), "process_rows", key)
            changes[key] = self._settle(ctx, "process_rows")
        table = self._table(out)
        self._commit(changes, batch.schema.field(self.key).type, push=True)
        self.dead_letters.absorb(letters)
        return table

    def on_watermark(self, watermark: int | dt.datetime) -> pa.Table:
        """Move the watermark to ``watermark`` (ms, or a datetime; naive means
        UTC) if that is later, fire every timer at or before the watermark
        and return what they emit."""
        name = type(self).__name__
        if isinstance(watermark, dt.datetime):
            moment = watermark if watermark.tzinfo else watermark.replace(tzinfo=dt.UTC)
            watermark = (moment - _EPOCH) // dt.timedelta(milliseconds=1)
        if isinstance(watermark, bool) or not isinstance(watermark, int):
            raise OperatorConfigError(f"{name}: watermark must be an int (ms) or a datetime, got {watermark!r}")
        now = watermark if self._watermark is None else max(self._watermark, watermark)
        changes: dict[Any, tuple[str | None, frozenset[int]]] = {}
        out: list[dict[str, Any]] = []
        try:
            while self._heap and self._heap[0][0] <= now:
                timestamp, key = heapq.heappop(self._heap)
                before = changes[key][1] if key in changes else self._timers.get(key, frozenset())
                if timestamp not in before:
                    continue  # deleted (or fired) since it was pushed
                ctx = self._context(key, changes, now)
                ctx._timers.discard(timestamp)  # it fires now: once
                out += self._rows(self.function.on_timer(key, timestamp, ctx), "on_timer", key)
                changes[key] = self._settle(ctx, "on_timer")
                for added in changes[key][1] - (before - {timestamp}):
                    heapq.heappush(self._heap, (added, key))  # due ones fire in this call
            table = self._table(out)
        except BaseException:
            self._rebuild_heap()  # timers popped above are still in _timers
            raise
        self._watermark = now
        self._commit(changes, self._key_type, push=False)
        return table

    # ---------------------------------------------------------------- state

    def snapshot(self) -> dict[str, pa.Table]:
        key_type = self._key_type or pa.int64()  # an empty state's key type does not count
        keys = sorted(self._states)
        states = pa.table(
            {
                self.key: pa.array(keys, key_type),
                self.STATE: pa.array([self._states[key] for key in keys], pa.string()),
            }
        )
        timers = sorted((key, timestamp) for key, stamps in self._timers.items() for timestamp in stamps)
        timer_table = pa.table(
            {
                self.key: pa.array([key for key, _ in timers], key_type),
                self.TIMESTAMP: pa.array([timestamp for _, timestamp in timers], pa.int64()),
            }
        )
        return {
            self.STATE: storable(states).replace_schema_metadata({KEYS_METADATA: json.dumps([self.key])}),
            # a key may have several timers: they go with their key
            self.TIMERS: storable(timer_table).replace_schema_metadata({RESCALE_METADATA: rows_by(self.key)}),
            # after a rescale every task starts from the lowest: no timer fires early
            self.WATERMARK: pa.table({self.WATERMARK: pa.array([self._watermark], pa.int64())}).replace_schema_metadata(
                {RESCALE_METADATA: MIN}
            ),
        }

    def savepoint(self) -> Callable[[], None]:
        """The state as it is now, put back when called (``operators.base``,
        ``savepoint()``): copies of the maps of keys (their values, JSON
        text and sets of timers, never change in place), no table made."""
        states, timers, heap = dict(self._states), dict(self._timers), list(self._heap)
        live, key_type, watermark = self._live, self._key_type, self._watermark

        def back() -> None:
            self._states, self._timers, self._heap = dict(states), dict(timers), list(heap)
            self._live, self._key_type, self._watermark = live, key_type, watermark

        return back

    def restore(self, state: Mapping[str, pa.Table]) -> None:
        name = type(self).__name__
        tables = expect_tables(state, [self.STATE, self.TIMERS, self.WATERMARK], name)
        watermark = self._restored_watermark(tables[self.WATERMARK])
        states, state_type = self._restored_states(tables[self.STATE])
        timers, timer_type = self._restored_timers(tables[self.TIMERS])
        if state_type is not None and timer_type is not None and state_type != timer_type:
            raise StateRestoreError(
                f"{name}: snapshot keys of 'state' ({state_type}) and 'timers' ({timer_type}) differ in type"
            )
        self._states = states
        self._timers = timers
        self._live = sum(len(stamps) for stamps in timers.values())
        self._key_type = (state_type or timer_type) if (states or timers) else None
        self._watermark = watermark
        self._rebuild_heap()

    def _restored_watermark(self, marks: pa.Table) -> int | None:
        name = type(self).__name__
        expect_columns(marks, self.WATERMARK, [self.WATERMARK], name)
        if marks.num_rows != 1 or not pa.types.is_integer(marks.schema.field(0).type):
            raise StateRestoreError(
                f"{name}: snapshot table 'watermark' must be one integer row, got {marks.num_rows} of {marks.schema.field(0).type}"
            )
        return marks.column(0)[0].as_py()

    def _restored_states(self, table: pa.Table) -> tuple[dict[Any, str], pa.DataType | None]:
        name = type(self).__name__
        expect_columns(table, self.STATE, [self.key, self.STATE], name)
        if table.num_rows == 0:
            return {}, None
        key_type = self._restored_key_type(table, self.STATE)
        KeyedState([self.key], [self.STATE], operator=name).restore(table, self.STATE)  # null or duplicate keys
        texts = table[self.STATE]
        if not (pa.types.is_string(texts.type) or pa.types.is_large_string(texts.type)):
            raise StateRestoreError(f"{name}: snapshot column 'state' is {texts.type}, expected JSON text (string)")
        if texts.null_count:
            raise StateRestoreError(f"{name}: snapshot table 'state' has null states")
        states: dict[Any, str] = {}
        for key, text in zip(plain(table[self.key]).to_pylist(), texts.to_pylist()):
            try:
                value = json.loads(text)
                canonical = json.dumps(value, allow_nan=False, separators=(",", ":"))
            except ValueError as exc:
                raise StateRestoreError(f"{name}: the state of key {key!r} is not JSON: {exc}") from None
            if not isinstance(value, dict):
                raise StateRestoreError(
                    f"{name}: the state of key {key!r} is a JSON {type(value).__name__}, not an object"
                )
            if value:  # {} is no state
                states[key] = canonical
        return states, key_type

    def _restored_timers(self, table: pa.Table) -> tuple[dict[Any, frozenset[int]], pa.DataType | None]:
        name = type(self).__name__
        expect_columns(table, self.TIMERS, [self.key, self.TIMESTAMP], name)
        if table.num_rows == 0:
            return {}, None
        key_type = self._restored_key_type(table, self.TIMERS)
        stamps = table[self.TIMESTAMP]
        if not pa.types.is_integer(stamps.type):
            raise StateRestoreError(f"{name}: snapshot column 'timestamp' is {stamps.type}, expected int64 ms")
        if table[self.key].null_count or stamps.null_count:
            raise StateRestoreError(f"{name}: snapshot table 'timers' has null keys or timestamps")
        try:
            stamps = stamps.cast(pa.int64())
        except pa.ArrowInvalid:
            raise StateRestoreError(f"{name}: snapshot timers do not fit in int64 milliseconds") from None
        timers: dict[Any, set[int]] = {}
        for key, timestamp in zip(plain(table[self.key]).to_pylist(), stamps.to_pylist()):
            timers.setdefault(key, set()).add(timestamp)
        duplicates = table.num_rows - sum(len(s) for s in timers.values())
        if duplicates:
            raise StateRestoreError(f"{name}: snapshot table 'timers' holds {duplicates} duplicate timer(s)")
        return {key: frozenset(s) for key, s in timers.items()}, key_type

    def _restored_key_type(self, table: pa.Table, table_name: str) -> pa.DataType:
        key_type = plain(table[self.key]).type
        if not _key_type_ok(key_type):
            raise StateRestoreError(
                f"{type(self).__name__}: snapshot table {table_name!r} has keys of type {key_type}; keys are scalars"
            )
        return key_type

    # ---------------------------------------------------------------- the parts

    def _keys_as_held(self, batch: pa.Table) -> pa.Table:
        """``batch`` with its keys of the type of the keys held (a safe cast)."""
        name = type(self).__name__
        keys = batch[self.key]
        if not _key_type_ok(keys.type):
            raise InputSchemaError(f"{name}: key column {self.key!r} is {keys.type}; keys must be scalars")
        if self._key_type is None or keys.type == self._key_type or pa.types.is_null(keys.type):
            return batch
        try:
            cast = keys.cast(self._key_type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError) as exc:
            raise InputSchemaError(
                f"{name}: keys of type {keys.type} do not match the state's {self._key_type}: {exc}"
            ) from None
        return batch.set_column(batch.schema.get_field_index(self.key), self.key, cast)

    def _on_time(self, batch: pa.Table, letters: DeadLetters) -> pa.Table:
        """``batch`` without rows of null or late event time, which go to ``letters``."""
        name = type(self).__name__
        times = batch[self.time_column]
        if not (pa.types.is_integer(times.type) or pa.types.is_timestamp(times.type)):
            raise InputSchemaError(
                f"{name}: time column {self.time_column!r} is {times.type}; expected integer milliseconds or a timestamp"
            )
        if times.null_count:
            letters.add(batch.filter(pc.is_null(times)), Reason.NULL_EVENT_TIME, name)
            batch = batch.filter(pc.is_valid(times))
            times = batch[self.time_column]
        if self._watermark is None or batch.num_rows == 0:
            return batch
        late = pc.less(times.cast(pa.int64()), pa.scalar(self._threshold(self._watermark, times.type), pa.int64()))
        letters.add(batch.filter(late), Reason.LATE, name)
        return batch.filter(pc.invert(late))

    def _threshold(self, watermark: int, time_type: pa.DataType) -> int:
        """The watermark in the time column's units: a time is late when below it
        (for a time finer than ms, when its whole milliseconds are)."""
        if pa.types.is_timestamp(time_type):
            per_ms = _PER_MS[time_type.unit]
            watermark = -(-watermark // 1000) if per_ms is None else watermark * per_ms
        return min(max(watermark, _INT64_MIN), _INT64_MAX)

    def _context(self, key: Any, changes: Mapping[Any, tuple[str | None, frozenset[int]]], watermark: int | None):
        text, timers = changes[key] if key in changes else (self._states.get(key), self._timers.get(key, ()))
        return KeyContext(key, json.loads(text) if text is not None else {}, timers, watermark)

    def _settle(self, ctx: KeyContext, method: str) -> tuple[str | None, frozenset[int]]:
        """What ``ctx`` holds after a call: the state's JSON text (None for no
        state) and the timers; the context is closed."""
        ctx._open = False
        state = ctx.state
        where = f"{type(self).__name__}: {type(self.function).__qualname__}.{method}"
        if not isinstance(state, dict):
            raise OperatorError(f"{where} left the state of key {ctx.key!r} as a {type(state).__name__}, not a dict")
        if not state:
            return None, frozenset(ctx._timers)
        try:
            text = json.dumps(state, allow_nan=False, separators=(",", ":"))
        except (TypeError, ValueError) as exc:
            raise OperatorError(f"{where} left state for key {ctx.key!r} that JSON cannot hold: {exc}") from None
        return text, frozenset(ctx._timers)

    def _rows(self, result: object, method: str, key: Any) -> list[dict[str, Any]]:
        where = f"{type(self).__name__}: {type(self.function).__qualname__}.{method}"
        if result is None:
            return []
        if isinstance(result, Mapping):
            raise OperatorError(f"{where} returned one dict for key {key!r}; return an iterable of dicts ([row])")
        try:
            rows = iter(result)  # type: ignore[call-overload]
        except TypeError:
            raise OperatorError(
                f"{where} returned a {type(result).__name__} for key {key!r}, not an iterable of dicts"
            ) from None
        out = []
        for row in rows:
            if not isinstance(row, Mapping):
                raise OperatorError(f"{where} returned a row of type {type(row).__name__} for key {key!r}, not a dict")
            out.append(row if isinstance(row, dict) else dict(row))
        return out

    def _table(self, rows: Sequence[Mapping[str, Any]]) -> pa.Table:
        name = type(self).__name__
        schema = self.output_schema
        if schema is not None:
            known = set(schema.names)
            extra = sorted({str(column) for row in rows for column in row if column not in known})
            if extra:
                raise OperatorError(f"{name}: output rows have columns {extra} that output_schema lacks")
            try:
                return pa.Table.from_pylist(rows, schema=schema)
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
                raise OperatorError(f"{name}: output rows do not fit output_schema: {exc}") from None
        if not rows:
            return pa.table({})
        names = dict.fromkeys(column for row in rows for column in row)
        if not all(isinstance(column, str) for column in names):
            raise OperatorError(f"{name}: output column names must be strings, got {list(names)}")
        columns = {}
        for column in names:
            try:
                columns[column] = pa.array([row.get(column) for row in rows])
            except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, OverflowError) as exc:
                raise OperatorError(
                    f"{name}: output column {column!r} has values of no one Arrow type ({exc}); give output_schema"
                ) from None
        return pa.table(columns)

    def _commit(
        self, changes: Mapping[Any, tuple[str | None, frozenset[int]]], key_type: pa.DataType | None, *, push: bool
    ) -> None:
        for key, (text, timers) in changes.items():
            before = self._timers.get(key, frozenset())
            if text is None:
                self._states.pop(key, None)
            else:
                self._states[key] = text
            if timers:
                self._timers[key] = timers
            else:
                self._timers.pop(key, None)
            self._live += len(timers) - len(before)
            if push:
                for timestamp in timers - before:
                    heapq.heappush(self._heap, (timestamp, key))
        if not (self._states or self._timers):
            self._key_type = None  # as a restored empty state: the next keys bring their type
            self._heap.clear()
        elif self._key_type is None:
            self._key_type = key_type
        if len(self._heap) > max(2 * self._live, _HEAP_SLACK):
            self._rebuild_heap()

    def _rebuild_heap(self) -> None:
        self._heap = [(timestamp, key) for key, stamps in self._timers.items() for timestamp in stamps]
        heapq.heapify(self._heap)

    def __repr__(self) -> str:
        time = f", time={self.time_column!r}" if self.time_column else ""
        return f"KeyedProcess(key={self.key!r}, function={type(self.function).__qualname__}{time})"
