"""What a restore drill feeds a pipeline and what it checks the output
against (``streaming.tools.drill.run``): ``DrillWorkload``, and the protocol a
pipeline provides it by (``workload_for``).

The protocol: the module that defines a pipeline also defines

    def drill_workload() -> DrillWorkload

which says how to make the pipeline's input without end, how to close it,
and how to compute its expected output independently (in batch, from the
ingress topics).  ``spark-abs drill --pipeline module:attribute`` takes the
workload from there (``--workload module:function`` names another).  The
money pipeline (``spark_abs_examples.money``) provides its own this way, as
does every pipeline of ``examples/`` (``spark_abs_examples.check.drill_workload``
builds theirs from their ``records``, ``REFERENCE`` and ``KEYS``).  A
pipeline's name stands for it (``streaming.api.pipeline.named_pipelines``:
``money``, ``orders``, ...)."""

from __future__ import annotations

import importlib
import random
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pandas as pd

from barriers.headers import DRILL_HEADER
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Pipeline
from streaming.api.producing import MAX_WATERMARK, watermark_record_headers
from streaming.errors import ConfigError

__all__ = [
    "PROTOCOL",
    "POISON_FILTER",
    "DrillWorkload",
    "InputRecord",
    "end_of_input",
    "load_workload",
    "workload_for",
]

# the attribute of a pipeline's module that gives its drill workload
PROTOCOL = "drill_workload"
# what a reference keeps of an ingress topic read by Spark with its headers (includeHeaders): every
# record but those a drill sent to be dead letters (its poison kind, marked with DRILL_HEADER)
# (a record without headers has them null)
POISON_FILTER = f"NOT coalesce(exists(headers, h -> h.key = '{DRILL_HEADER}'), false)"


@dataclass(frozen=True)
class InputRecord:
    topic: str
    partition: int
    value: bytes | None
    headers: tuple[tuple[str, bytes], ...] = ()
    key: bytes | None = None
    malformed: bool = False  # the pipeline must turn it into a dead letter


@dataclass(frozen=True)
class DrillWorkload:
    """What a drill feeds a pipeline and how it checks the output.

    ``records(pipeline, rng)`` yields input records without end (the drill
    sends them at its rate while failures go on), in the order a producer
    sends them; ``end(pipeline)`` the records that close the input (by
    default ``end_of_input``: every ingress partition's watermark to the
    end); ``reference(spark, pipeline, kafka)`` the expected output,
    computed in batch by Spark from the ingress topics, never by the
    pipeline's operators, as a pandas frame with the ``keys`` columns (they
    name a row) and the ``sums`` columns (each compared with the output's
    for every key); when the pipeline conserves something, ``conserved(store,
    checkpoint_id, read_range)`` its total in a checkpoint (zero when
    conserved); ``output(table)`` the committed output (a pyarrow table: an
    object-store sink's rows, or a Kafka sink's JSON values) as a frame
    (default: as it is); ``quarantined`` the reasons (regular expressions,
    searched in a dead letter's reason) of records the pipeline
    quarantines by design from well-formed input (a validation stage that
    refuses some), whose dead letters the drill then expects: the
    reference must leave those records out as well.

    The ``poison`` failure kind needs ``poison_ready``: the reference
    leaves out the records a drill marks with ``DRILL_HEADER``
    (``POISON_FILTER``).  ``poisoned(record)``, given a record the workload
    sent, gives records the pipeline's own code raises on (a value its
    operator or its Spark code does not expect), which the drill sends
    with the hostile records of every other kind."""

    records: Callable[[Pipeline, random.Random], Iterator[InputRecord]]
    reference: Callable[[Any, Pipeline, KafkaAccess], pd.DataFrame]
    keys: tuple[str, ...]
    sums: tuple[str, ...]
    end: Callable[[Pipeline], list[InputRecord]] | None = None
    conserved: Callable[[SnapshotStore, int, Callable], int] | None = None
    output: Callable[[Any], pd.DataFrame] | None = None
    quarantined: tuple[str, ...] = ()
    poison_ready: bool = False
    poisoned: Callable[[InputRecord], list[InputRecord]] | None = None

    def __post_init__(self) -> None:
        if isinstance(self.quarantined, str):
            raise ConfigError(
                f"DrillWorkload quarantined: a tuple of patterns, e.g. ({self.quarantined!r},), not a string "
                "(its characters would each be a pattern)"
            )
        for pattern in self.quarantined:
            try:
                matches_all = re.search(pattern, "") is not None
            except re.error as exc:
                raise ConfigError(f"DrillWorkload quarantined: {pattern!r} is not a regular expression: {exc}") from exc
            if matches_all:
                raise ConfigError(
                    f"DrillWorkload quarantined: {pattern!r} matches an empty reason, so it would accept every dead "
                    "letter; name the reasons the pipeline quarantines by design, e.g. r'^Validate: '"
                )

    def by_design(self, reason: str) -> bool:
        """Whether a dead letter's ``reason`` is one the pipeline quarantines by design."""
        return any(re.search(pattern, reason) for pattern in self.quarantined)

    def closing(self, pipeline: Pipeline) -> list[InputRecord]:
        """The records that close the input."""
        return (self.end or end_of_input)(pipeline)


def end_of_input(pipeline: Pipeline) -> list[InputRecord]:
    """A watermark at the end of time on every partition of every ingress
    topic (as ``streaming.end_input`` sends it)."""
    headers = tuple(watermark_record_headers(MAX_WATERMARK))
    return [InputRecord(i.topic, p, b"", headers) for i in pipeline.ingress for p in range(i.partitions)]


def _call(ref: str, what: str) -> Any:
    module_name, _, attribute = ref.partition(":")
    if not module_name or not attribute:
        raise ConfigError(f"{what} {ref!r}: expected module:function")
    try:
        return getattr(importlib.import_module(module_name), attribute)()
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"{what} {ref!r} cannot be loaded: {exc}") from exc


def _checked(made: Any, ref: str) -> DrillWorkload:
    if not isinstance(made, DrillWorkload):
        raise ConfigError(f"workload {ref!r} returned {type(made).__name__}, not a DrillWorkload")
    return made


def load_workload(ref: str) -> DrillWorkload:
    """``module:function`` returning a ``DrillWorkload``."""
    return _checked(_call(ref, "workload"), ref)


def workload_for(pipeline_ref: str) -> DrillWorkload:
    """The workload the module of ``pipeline_ref`` (``module:attribute``,
    arguments after ``?`` left out) provides by the protocol: its
    ``drill_workload()``."""
    module_name = pipeline_ref.partition("?")[0].partition(":")[0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigError(f"pipeline {pipeline_ref!r} cannot be loaded: {exc}") from exc
    if not callable(getattr(module, PROTOCOL, None)):
        raise ConfigError(
            f"module {module_name} defines no {PROTOCOL}() returning a DrillWorkload, so a drill cannot feed "
            f"{pipeline_ref} or check its output: define one, or name one with --workload module:function"
        )
    return _checked(getattr(module, PROTOCOL)(), f"{module_name}:{PROTOCOL}")
