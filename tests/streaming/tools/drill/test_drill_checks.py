"""The drill's great-expectations suites on small tables: each passes on
good data and each expectation fails, naming itself, on data made to
violate it."""

from __future__ import annotations

import functools

import pandas as pd
import pytest

from streaming.tools.drill import checks as drill_checks

KEYS = ["account", "window_start"]
REFERENCE = pd.DataFrame(
    {"account": ["a", "a", "b"], "window_start": [0, 1000, 0], "net": [5, -2, 7], "legs": [1, 2, 3]}
)


def _output_suite(output: pd.DataFrame):
    frame = drill_checks.output_frame(output, REFERENCE, KEYS)
    suite = functools.partial(drill_checks.output_suite, expected_rows=len(REFERENCE), keys=KEYS, sums=["net", "legs"])
    (result,) = drill_checks.validate({"output": (suite, frame)}, {"output": KEYS})
    return result


def _failed(result) -> set[str]:
    return {o.expectation for o in result.outcomes if not o.success}


def test_the_output_suite_passes_on_the_reference_itself():
    result = _output_suite(REFERENCE.sample(frac=1, random_state=3))
    assert result.success, result.outcomes
    assert len(result.outcomes) == 6 and result.gx_json["success"] is True


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        # a record lost: a window's sums fall short
        (
            lambda f: f.assign(net=[5, -2, 6], legs=[1, 2, 2]),
            {"net equal to the reference for every key", "legs equal to the reference for every key"},
        ),
        # a window missing altogether
        (lambda f: f.iloc[:2], {"no key of the reference missing", "as many output rows as the reference"}),
        # a window written twice
        (lambda f: pd.concat([f, f.iloc[[2]]]), {"no output key twice", "as many output rows as the reference"}),
        # a window the reference does not have
        (
            lambda f: pd.concat([f, pd.DataFrame({"account": ["c"], "window_start": [0], "net": [1], "legs": [1]})]),
            {"no output key that the reference lacks", "as many output rows as the reference"},
        ),
    ],
    ids=["lost", "missing", "duplicate", "extra"],
)
def test_the_output_suite_fails_on_output_made_to_violate_it(change, expected):
    result = _output_suite(change(REFERENCE.copy()))
    assert not result.success
    assert _failed(result) == expected
    observed = {o.expectation: o.observed for o in result.outcomes if not o.success}
    assert all(observed.values()), observed  # what GX saw is reported with every failure
    # the rows at fault are named by their key
    assert all("account=" in o or o.isdigit() for o in observed.values()), observed


def _checkpoints(frame: pd.DataFrame, conserved: bool = True):
    suite = functools.partial(drill_checks.checkpoint_suite, conserved=conserved)
    (result,) = drill_checks.validate({"checkpoints": (suite, frame)})
    return result


def test_the_checkpoint_suite_accepts_deliberate_damage_and_rejects_loss_and_money_made():
    good = pd.DataFrame(
        {"checkpoint": [1, 2, 3], "state": ["verifies", "damaged by the drill", "verifies"], "total": [0, None, 0]}
    )
    assert _checkpoints(good).success
    lost = good.assign(state=["verifies", "damaged by the drill", "chk-00000003: _MANIFEST.json is missing"])
    assert _failed(_checkpoints(lost)) == {"no completed checkpoint lost"}
    money = good.assign(total=[0, None, 40])
    assert _failed(_checkpoints(money)) == {"every verified checkpoint conserves money (balances + in flight = 0)"}
    assert _failed(_checkpoints(good.iloc[0:0])) == {"checkpoints completed"}
    # without a conserved quantity there is no money expectation
    assert len(_checkpoints(good.drop(columns=["total"]), conserved=False).outcomes) == 2


def test_the_output_suite_takes_a_key_of_one_column():
    reference = pd.DataFrame({"payment_id": ["p1", "p2", "p3"], "amount": [5, 7, 9]})

    def check(output):
        frame = drill_checks.output_frame(output, reference, ["payment_id"])
        suite = functools.partial(drill_checks.output_suite, expected_rows=3, keys=["payment_id"], sums=["amount"])
        (result,) = drill_checks.validate({"output": (suite, frame)}, {"output": ["payment_id"]})
        return result

    assert check(reference).success
    assert _failed(check(pd.concat([reference, reference.iloc[[1]]]))) == {
        "no output key twice",
        "as many output rows as the reference",
    }


def test_the_dead_letter_suite_wants_one_letter_with_a_reason_for_every_malformed_record_and_no_other():
    good = pd.DataFrame(
        {
            "source": ["t:0", "t:1"],
            "offset": [4, 9],
            "letters": [1, 1],
            "reason": ["not JSON", "x"],
            "made_malformed": [True, True],
            "expected": [True, True],
        }
    )
    (result,) = drill_checks.validate({"dead_letters": (drill_checks.dead_letter_suite, good)})
    assert result.success
    dropped = good.assign(letters=[1, 0], reason=["not JSON", None])
    (result,) = drill_checks.validate({"dead_letters": (drill_checks.dead_letter_suite, dropped)})
    assert _failed(result) == {
        "every malformed record became a dead letter with its reason",
        "every malformed record is one dead letter, not none, not two",
    }
    twice = good.assign(letters=[1, 2])
    (result,) = drill_checks.validate({"dead_letters": (drill_checks.dead_letter_suite, twice)})
    assert _failed(result) == {"every malformed record is one dead letter, not none, not two"}
    # a record the pipeline quarantined on its own (late for its window): the output lacks it
    late = pd.concat(
        [
            good,
            pd.DataFrame(
                {
                    "source": ["s.enriched:1"],
                    "offset": [-1],
                    "letters": [1],
                    "reason": ["TumblingWindowAggregate: late"],
                    "made_malformed": [False],
                    "expected": [False],
                }
            ),
        ],
        ignore_index=True,
    )
    (result,) = drill_checks.validate(
        {"dead_letters": (drill_checks.dead_letter_suite, late)}, {"dead_letters": ["source", "offset", "reason"]}
    )
    assert _failed(result) == {
        "no record quarantined but those the drill made malformed or the workload quarantines by design"
    }
    (outcome,) = [o for o in result.outcomes if not o.success]
    assert "1 of 3 unexpected" in outcome.observed and "reason=TumblingWindowAggregate: late" in outcome.observed
    # one the workload quarantines by design (DrillWorkload.quarantined) is expected
    (result,) = drill_checks.validate({"dead_letters": (drill_checks.dead_letter_suite, late.assign(expected=True))})
    assert result.success


def test_the_dead_letter_table_expects_the_letters_of_records_made_malformed_and_those_quarantined_by_design():
    from streaming.tools.drill.verify import dead_letter_frame

    seen = {
        ("t:0", 4): ["value is not JSON"],  # made malformed by the drill
        ("v:1", 7): ["Validate: amount below zero"],  # refused on purpose by the pipeline
        ("e:1", 9): ["TumblingWindowAggregate: late", "TumblingWindowAggregate: late"],  # lost by the pipeline
    }
    frame = dead_letter_frame([("t:0", 4), ("t:1", 5)], seen, lambda reason: reason.startswith("Validate: "))
    rows = frame.to_dict("records")
    assert rows[0] == {
        "source": "t:0",
        "offset": 4,
        "letters": 1,
        "reason": "value is not JSON",
        "made_malformed": True,
        "expected": True,
    }
    assert (rows[1]["source"], rows[1]["letters"], rows[1]["made_malformed"], rows[1]["expected"]) == (
        "t:1",
        0,
        True,
        True,
    )
    assert pd.isna(rows[1]["reason"])  # no dead letter came for it
    others = {(r["source"], r["reason"], r["expected"]) for r in rows[2:]}
    assert others == {("v:1", "Validate: amount below zero", True), ("e:1", "TumblingWindowAggregate: late", False)}
    assert len(rows) == 5  # each late letter a row of its own
    (result,) = drill_checks.validate({"dead_letters": (drill_checks.dead_letter_suite, frame)})
    assert _failed(result) == {
        "every malformed record became a dead letter with its reason",
        "every malformed record is one dead letter, not none, not two",
        "no record quarantined but those the drill made malformed or the workload quarantines by design",
    }
    nothing_by_design = dead_letter_frame([("t:0", 4)], seen, lambda reason: False)
    assert nothing_by_design["expected"].tolist() == [True, False, False, False]
