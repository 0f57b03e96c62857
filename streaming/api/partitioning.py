"""A pipeline checked before it runs (``check``; the job runner calls it,
tests and tools may too): every input
reaches the tasks that need it, rows of one key meet in one task, and
event-time operators have event time to follow.

What each stage's operator keeps is read from a fresh instance: an operator
is stateless when it is a ``Stateless`` or its ``snapshot()`` is empty, and
a keyed operator names the column that divides its state per input in
``state_keys`` (``{None: column}`` for one input; the built-in operators
do).  The problems, each naming the stage, the input and the fix:

- a stateful stage reading an ingress topic with fewer partitions than it
  has tasks (some tasks never see that input: a join's table side, say);
- a stateful stage with several tasks reading an ingress topic whose
  producers do not partition it by the stage's key (``Ingress(key=...)``),
  or that is not co-partitioned with the stage's other inputs: a key's
  records could reach any task;
- a stateful stage with several tasks whose upstream stage routes its rows
  by another column than the one the state is kept by;
- one stage keeping state by two different keys with several tasks;
- event-time operators (windows, timers, ...) in a stage none of whose
  inputs carries event time.

``Stage(trust_partitioning=True)`` is the explicit opt-in for a layout that
is legitimate but cannot be seen from here (producers that keep one key's
records in one partition by a key the operator does not declare)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from operators.base import Chain, Stateless
from streaming.api.pipeline import Ingress, Pipeline, Stage
from streaming.errors import ConfigError

__all__ = ["StageState", "state_of", "check"]


def _parts(operator: Any) -> Iterator[Any]:
    if isinstance(operator, Chain):
        for part in operator.operators:
            yield from _parts(part)
    else:
        yield operator


def _stateful(operator: Any) -> bool:
    if isinstance(operator, Stateless):
        return False
    try:
        return bool(operator.snapshot())
    except Exception:  # noqa: BLE001 - an operator that cannot say is taken as stateful
        return True


@dataclass(frozen=True)
class StageState:
    """What a stage's operator keeps: whether it has state, the column that
    divides it for each input (None: the operator does not say), keys in
    conflict, and whether it follows event time."""

    stateful: bool
    keys: Mapping[str, str] | None
    conflict: tuple[str, str] | None
    event_time: bool


def state_of(stage: Stage) -> StageState:
    """Read from a fresh operator of ``stage``."""
    operator = stage.make_operator()
    parts = list(_parts(operator))
    event_time = any(callable(getattr(p, "on_watermark", None)) for p in parts)
    stateful = [p for p in parts if _stateful(p)]
    if not stateful:
        return StageState(False, {}, None, event_time)
    declared: list[Mapping[str | None, str]] = []
    for p in stateful:
        state_keys = getattr(p, "state_keys", None)
        if state_keys is None:
            return StageState(True, None, None, event_time)
        declared.append(state_keys)
    keys: dict[str, str] = {}
    conflict = None
    for by_input in declared:
        if set(by_input) == {None}:  # one input: the rows as they reach it
            column = by_input[None]
            seen = set(keys.values())
            if seen and column not in seen:
                conflict = (sorted(seen)[0], column)
            for name in stage.inputs:
                keys.setdefault(name, column)
        else:
            for named, column in by_input.items():
                if named is not None:  # a None among named inputs names none of them
                    keys.setdefault(named, column)
    return StageState(True, keys, conflict, event_time)


def check(pipeline: Pipeline) -> None:
    """Raise ``ConfigError`` listing every problem of ``pipeline``'s layout
    (see the module docstring); return when there is none."""
    problems: list[str] = []
    for stage in pipeline.stages:
        state = state_of(stage)
        problems += _event_time(pipeline, stage, state)
        if state.stateful:
            problems += _reach(pipeline, stage)
            if stage.parallelism > 1 and not stage.trust_partitioning:
                problems += _keys(pipeline, stage, state)
    if problems:
        listed = "\n".join(f"  - {p}" for p in problems)
        raise ConfigError(f"pipeline {pipeline.job} cannot run as declared:\n{listed}")


def _event_time(pipeline: Pipeline, stage: Stage, state: StageState) -> list[str]:
    if not state.event_time or any(pipeline.carries_event_time(name) for name in stage.inputs):
        return []
    ingress = [name for name in _ingress_above(pipeline, stage.name)]
    where = f" (ingress upstream: {', '.join(ingress)})" if ingress else ""
    return [
        f"stage {stage.name}: its operator follows event time, but none of its inputs "
        f"({', '.join(stage.inputs)}) carries event time{where}. Fix: name the event-time column "
        f"where the data enters, Ingress(..., event_time='<column>')"
    ]


def _ingress_above(pipeline: Pipeline, name: str) -> list[str]:
    if pipeline.ingress_named(name) is not None:
        return [name]
    return [i for upstream in pipeline.stage(name).inputs for i in _ingress_above(pipeline, upstream)]


def _reach(pipeline: Pipeline, stage: Stage) -> list[str]:
    problems = []
    for name in stage.inputs:
        ingress = pipeline.ingress_named(name)
        if ingress is not None and ingress.partitions < stage.parallelism:
            problems.append(
                f"stage {stage.name}: input {name} has {ingress.partitions} partition(s) for "
                f"{stage.parallelism} tasks, so tasks {ingress.partitions}..{stage.parallelism - 1} never see it "
                f"and their state is wrong. Fix: give {name} at least {stage.parallelism} partitions, "
                f"route it through a stage keyed by the state's key, or run {stage.name} with "
                f"parallelism={ingress.partitions}"
            )
    return problems


def _keys(pipeline: Pipeline, stage: Stage, state: StageState) -> list[str]:
    if state.conflict is not None:
        first, second = state.conflict
        return [
            f"stage {stage.name}: its operators keep state by {first!r} and by {second!r}, but its "
            f"{stage.parallelism} tasks can each hold only some keys of one of them. Fix: split it into "
            f"two stages, the first with key={second!r}, or run it with parallelism=1"
        ]
    problems = []
    ingress_inputs = [i for n in stage.inputs if (i := pipeline.ingress_named(n)) is not None]
    for name in stage.inputs:
        column = None if state.keys is None else state.keys.get(name)
        ingress = pipeline.ingress_named(name)
        if ingress is not None:
            problems += _keyed_ingress(stage, name, column, ingress, ingress_inputs)
        elif column is not None and pipeline.stage(name).key != column:
            upstream = pipeline.stage(name)
            problems.append(
                f"stage {stage.name}: input {name} routes its rows by {upstream.key!r}, but {stage.name} "
                f"keeps state by {column!r} with {stage.parallelism} tasks. Fix: Stage({name!r}, ..., "
                f"key={column!r})"
            )
    return problems


def _keyed_ingress(
    stage: Stage, name: str, column: str | None, ingress: Ingress, ingress_inputs: list[Ingress]
) -> list[str]:
    by = f"by {column!r}" if column else "by key"
    fix = (
        f"Fix: route {name} through a stage keyed {by} (a Stage reading {name} with key="
        f"{column or '<the key>'!r}), declare Ingress({name!r}, key={column or '<the key>'!r}) if its "
        f"producers partition it {by}, run {stage.name} with parallelism=1, or opt in with "
        f"Stage(..., trust_partitioning=True) if records of one key reach one task anyway"
    )
    if column is None:
        return [
            f"stage {stage.name}: reads ingress {name} by partition with {stage.parallelism} tasks and keeps "
            f"state whose key it does not declare (no state_keys), so a key's records may reach any task. {fix}"
        ]
    if ingress.key != column:
        said = (
            f"says producers partition it by {ingress.key!r}" if ingress.key else "does not say how it is partitioned"
        )
        return [
            f"stage {stage.name}: keeps state by {column!r} with {stage.parallelism} tasks but reads ingress "
            f"{name} by partition, and {name} {said}: a key's records may reach any task. {fix}"
        ]
    others = [i for i in ingress_inputs if i.topic != name]
    if len(ingress_inputs) != len(stage.inputs) or any(i.partitions != ingress.partitions for i in others):
        return [
            f"stage {stage.name}: reads ingress {name} by partition beside inputs routed otherwise (another "
            f"stage, or a topic with other partitions), so one key's rows from the two sides reach different "
            f"tasks. Fix: route {name} through a stage keyed by {column!r}"
        ]
    return []
