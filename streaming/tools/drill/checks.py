"""What a restore drill checks, as great-expectations suites run on the real
output and checkpoints (``spark-abs drill``, ``streaming.tools.drill.run``).

Three suites, each on one table the drill builds:

- ``output``: the committed output joined on its key columns with the
  reference (the same output computed in batch by Spark from the ingress
  topics): as many rows as the reference, no key twice, no key of the
  reference missing, none that the reference lacks, and every summed column
  equal to the reference's for every key;
- ``checkpoints``: one row per checkpoint a coordinator reported complete:
  each still verifies (or was damaged on purpose by the drill), and, where
  the workload can say it (the money pipeline: balances plus legs in flight),
  each conserves what it must (its ``total`` is zero);
- ``dead_letters``: one row per record the workload made malformed, joined
  with the dead letters naming it: every one is there once, with a reason; and
  one per other dead letter, which must be one the workload quarantines by
  design (``DrillWorkload.quarantined``).

``validate`` runs them with an ephemeral GX context (nothing written to a
project directory; no usage statistics) and returns GX's results, which the
drill writes as JSON next to its report."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import pandas as pd

__all__ = ["SuiteResult", "checkpoint_suite", "dead_letter_suite", "output_frame", "output_suite", "validate"]

os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")

REFERENCE_SUFFIX = "_reference"
# the checkpoint states a completed checkpoint may be in at the end of a drill
CHECKPOINT_OK = ("verifies", "damaged by the drill", "records deleted by the drill")


@dataclass(frozen=True)
class ExpectationOutcome:
    """One expectation's verdict, as the report shows it."""

    suite: str
    expectation: str
    column: str
    success: bool
    observed: str


@dataclass(frozen=True)
class SuiteResult:
    name: str
    success: bool
    outcomes: tuple[ExpectationOutcome, ...]
    gx_json: dict[str, Any]


def output_frame(output: pd.DataFrame, reference: pd.DataFrame, keys: Sequence[str]) -> pd.DataFrame:
    """The output and the reference side by side, one row per key of either
    (an outer join), with ``_in_output`` / ``_in_reference`` flags; the
    reference's columns carry ``REFERENCE_SUFFIX``.  A key the output holds
    twice appears twice."""
    left = output.assign(_in_output=True)
    right = reference.rename(columns={c: c + REFERENCE_SUFFIX for c in reference.columns if c not in keys})
    right = right.assign(_in_reference=True)
    joined = left.merge(right, on=list(keys), how="outer")
    for flag in ("_in_output", "_in_reference"):
        joined[flag] = joined[flag].astype("boolean").fillna(False).astype(bool)
    joined["_output_rows"] = joined["_in_output"].astype(int)
    return joined


def output_suite(gx, *, expected_rows: int, keys: Sequence[str], sums: Sequence[str]):
    """The ``output`` suite for an ``output_frame``."""
    e = gx.expectations
    suite = gx.ExpectationSuite(name="output")
    # rows the output holds: the join keeps every output row (duplicates included), plus one per missing key
    suite.add_expectation(
        e.ExpectColumnValuesToBeInSet(
            column="_in_reference",
            value_set=[True],
            meta={"means": "no output key that the reference lacks"},
        )
    )
    suite.add_expectation(
        e.ExpectColumnValuesToBeInSet(
            column="_in_output", value_set=[True], meta={"means": "no key of the reference missing"}
        )
    )
    twice = {"means": "no output key twice"}
    suite.add_expectation(
        e.ExpectCompoundColumnsToBeUnique(column_list=list(keys), meta=twice)
        if len(keys) > 1
        else e.ExpectColumnValuesToBeUnique(column=keys[0], meta=twice)  # GX's compound form wants two columns
    )
    suite.add_expectation(
        e.ExpectColumnSumToBeBetween(
            column="_output_rows",
            min_value=expected_rows,
            max_value=expected_rows,
            meta={"means": "as many output rows as the reference"},
        )
    )
    for column in sums:
        suite.add_expectation(
            e.ExpectColumnPairValuesToBeEqual(
                column_A=column,
                column_B=column + REFERENCE_SUFFIX,
                ignore_row_if="either_value_is_missing",
                meta={"means": f"{column} equal to the reference for every key"},
            )
        )
    return suite


def checkpoint_suite(gx, *, conserved: bool):
    """The ``checkpoints`` suite: one row per completed checkpoint with
    ``state`` (and ``total`` when the workload says what is conserved)."""
    e = gx.expectations
    suite = gx.ExpectationSuite(name="checkpoints")
    suite.add_expectation(e.ExpectTableRowCountToBeBetween(min_value=1, meta={"means": "checkpoints completed"}))
    suite.add_expectation(
        e.ExpectColumnValuesToBeInSet(
            column="state", value_set=list(CHECKPOINT_OK), meta={"means": "no completed checkpoint lost"}
        )
    )
    if conserved:
        suite.add_expectation(
            e.ExpectColumnValuesToBeBetween(
                column="total",
                min_value=0,
                max_value=0,
                meta={"means": "every verified checkpoint conserves money (balances + in flight = 0)"},
            )
        )
    return suite


def dead_letter_suite(gx):
    """The ``dead_letters`` suite: one row per record made malformed, with the
    ``reason`` of its dead letter (missing when none came), and one per dead
    letter of a record the drill did not make malformed (``made_malformed``
    false: a record the pipeline quarantined, late for its window say, which
    the output then lacks), ``expected`` only when the workload quarantines
    records for that reason by design (``DrillWorkload.quarantined``)."""
    e = gx.expectations
    suite = gx.ExpectationSuite(name="dead_letters")
    suite.add_expectation(
        e.ExpectColumnValuesToNotBeNull(
            column="reason", meta={"means": "every malformed record became a dead letter with its reason"}
        )
    )
    suite.add_expectation(
        e.ExpectColumnValuesToBeBetween(
            column="letters",
            min_value=1,
            max_value=1,
            # a letter a restore's replay sent again supersedes the first (``read_dead_letters``)
            meta={"means": "every malformed record is one dead letter, not none, not two"},
        )
    )
    suite.add_expectation(
        e.ExpectColumnValuesToBeInSet(
            column="expected",
            value_set=[True],
            meta={
                "means": "no record quarantined but those the drill made malformed or the workload quarantines by design"
            },
        )
    )
    return suite


def validate(
    frames: dict[str, tuple[Any, pd.DataFrame]], index: Mapping[str, Sequence[str]] | None = None
) -> list[SuiteResult]:
    """Run each ``name -> (suite factory, frame)``: the factory gets the GX
    module and returns an ``ExpectationSuite``.  ``index`` names, per suite,
    the columns that say which row an unexpected value is in (the output's
    key, a checkpoint id): the report shows them for the first few."""
    import logging

    import great_expectations as gx
    from great_expectations.data_context.types.base import ProgressBarsConfig

    # some GX modules set their loggers to INFO themselves (a line about a temporary docs directory)
    for name in [n for n in logging.root.manager.loggerDict if n.startswith("great_expectations")]:
        logging.getLogger(name).setLevel(logging.WARNING)

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas("drill")
    results = []
    for name, (make_suite, frame) in frames.items():
        suite = context.suites.add(make_suite(gx))
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe(name)
        definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        result_format: dict[str, Any] = {"result_format": "SUMMARY"}
        if index and index.get(name):
            result_format["unexpected_index_column_names"] = list(index[name])
        run = definition.run(batch_parameters={"dataframe": frame}, result_format=result_format)
        outcomes = []
        for result in run.results:
            config = result.expectation_config
            if config is None:  # great_expectations sets it on every result of a run
                raise RuntimeError(f"suite {name}: great_expectations gave a result without its expectation")
            kwargs = config.kwargs
            column = kwargs.get("column") or ", ".join(
                kwargs.get("column_list") or [kwargs.get(k) for k in ("column_A", "column_B") if kwargs.get(k)]
            )
            outcomes.append(
                ExpectationOutcome(
                    suite=name,
                    expectation=str(config.meta.get("means") or config.type),
                    column=column or "",
                    success=bool(result.success),
                    observed=_observed(result.result, result.exception_info, (index or {}).get(name, ())),
                )
            )
        results.append(SuiteResult(name, bool(run.success), tuple(outcomes), run.to_json_dict()))
    return results


def _plain(value: Any) -> Any:
    """numpy scalars (and tuples and dicts of them) as plain Python values, for reading."""
    if isinstance(value, tuple | list):
        return type(value)(_plain(v) for v in value)
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    item = getattr(value, "item", None)
    return item() if callable(item) else value


def _observed(result: dict, exception: Any, index: Sequence[str] = ()) -> str:
    """What GX saw, in a few words."""
    raised = exception.get("raised_exception") if isinstance(exception, dict) else False
    if raised:
        return f"error: {exception.get('exception_message')}"
    if "observed_value" in result:
        return str(_plain(result["observed_value"]))
    unexpected = result.get("unexpected_count")
    if unexpected is None:
        return ""
    rows = result.get("partial_unexpected_index_list") or []
    sample = [_row(r, index) for r in rows[:3] if isinstance(r, dict)] or [
        str(_plain(s)) for s in (result.get("partial_unexpected_list") or [])[:3]
    ]
    text = f"{unexpected} of {result.get('element_count')} unexpected"
    if sample:
        text += f", e.g. {'; '.join(sample)}"
    return text


def _row(row: Mapping[str, Any], index: Sequence[str]) -> str:
    """An unexpected row as ``column=value`` pairs, the ``index`` columns first
    (the flags are left out)."""
    names = [k for k in index if k in row] + [k for k in row if k not in index and not k.startswith("_")]
    return " ".join(f"{k}={_plain(row[k])}" for k in names)
