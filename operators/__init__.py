"""Operators users write stages with: stateless transforms over Arrow
batches, keyed state, and the built-in stateful operators, each handing all
its state to ``snapshot()`` and taking it back in ``restore()``.

- ``base``: the contract every operator keeps, and ``Chain``;
- ``stateless``: batch-at-a-time transforms (map, filter, flat map, passthrough);
- ``state``: keyed state, one row per key, indexed;
- ``aggregations``: the aggregation specs (``count``, ``sum_``, ...);
- ``keyed``: the keyed aggregate;
- ``windows``: tumbling and sliding event-time windows;
- ``session_windows``: session windows;
- ``joins``: ``Union`` and the stream-table ``LatestValueJoin``;
- ``interval_join``: the event-time interval join;
- ``dedup``: deduplication within an event-time bound;
- ``process``: ``KeyedProcess``, keyed state with event-time timers of one's own;
- ``dead_letters``: rows an operator will not process, with their reason;
- ``isolation``: the rows an operator raises on, found alone after it raised on a batch;
- ``rescale``: how state tables divide among a new number of tasks;
- ``errors``: the operators' errors, under ``OperatorError``;
- ``testing``: helpers for testing operators, users' and our own;
- ``_arrow`` and ``_time``: private Arrow and event-time helpers.

``require_columns`` and ``row_index`` help write operators of one's own
(the demo's, ``spark_abs_examples.money``, use them); ``concat`` puts the
outputs of several ``process()`` calls together, as a task does."""

from operators._arrow import concat, require_columns, row_index
from operators.aggregations import AggregateFunction, Aggregation, count, max_, min_, sum_
from operators.base import Chain, MultiInputOperator, Operator, Stateless, WatermarkAware
from operators.dead_letters import DeadLetter, DeadLetterBatch, DeadLetters, Reason
from operators.dedup import Deduplicate
from operators.errors import InputSchemaError, OperatorConfigError, OperatorError, StateRestoreError
from operators.interval_join import IntervalJoin
from operators.joins import LatestValueJoin, Union, Unmatched
from operators.keyed import KeyedAggregate
from operators.process import KeyContext, KeyedProcess, KeyedProcessFunction
from operators.session_windows import SESSION_END, SESSION_START, SessionWindowAggregate
from operators.state import KeyedState, latest_per_key
from operators.stateless import (
    FilterRows,
    FlatMap,
    MapBatches,
    Passthrough,
    filter_rows,
    flat_map,
    map_batches,
    select,
    with_column,
)
from operators.windows import WINDOW_END, WINDOW_START, SlidingWindowAggregate, TumblingWindowAggregate

__all__ = [
    # the contract
    "Operator",
    "MultiInputOperator",
    "WatermarkAware",
    "Stateless",
    "Chain",
    # writing operators
    "require_columns",
    "row_index",
    "concat",
    # stateless
    "Passthrough",
    "MapBatches",
    "FilterRows",
    "FlatMap",
    "map_batches",
    "filter_rows",
    "flat_map",
    "select",
    "with_column",
    # keyed state and aggregates
    "KeyedState",
    "latest_per_key",
    "Aggregation",
    "AggregateFunction",
    "count",
    "sum_",
    "min_",
    "max_",
    "KeyedAggregate",
    "Deduplicate",
    "TumblingWindowAggregate",
    "SlidingWindowAggregate",
    "SessionWindowAggregate",
    "WINDOW_START",
    "WINDOW_END",
    "SESSION_START",
    "SESSION_END",
    # keyed state and event-time timers of one's own
    "KeyedProcess",
    "KeyedProcessFunction",
    "KeyContext",
    # two inputs
    "Union",
    "LatestValueJoin",
    "Unmatched",
    "IntervalJoin",
    # dead letters and errors
    "DeadLetters",
    "DeadLetter",
    "DeadLetterBatch",
    "Reason",
    "OperatorError",
    "OperatorConfigError",
    "InputSchemaError",
    "StateRestoreError",
]
