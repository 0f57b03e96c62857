"""The comparison's bookkeeping (pure): ratios taken round by round against
the baseline variant, the table, and arguments checked before anything starts."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from streaming.errors import ConfigError
from streaming.tools.compare import Comparison, RoundResult, check_arguments


def _round(variant: str, round_: int, seconds: float, **metrics) -> RoundResult:
    task = {
        "kind": variant,
        "alignment_s": 0.0,
        "held_bytes_max": 0,
        "in_flight_records_referenced": 0,
        "state_bytes": 100,
        **metrics,
    }
    return RoundResult.from_metrics(variant, round_, round_, 500 * round_, seconds, task)


def _comparison() -> Comparison:
    c = Comparison(["aligned", "unaligned"], slow_ms=2.0)
    c.rounds += [
        _round("aligned", 1, 4.0, alignment_s=3.5, held_bytes_max=900),
        _round("unaligned", 1, 0.5, in_flight_records_referenced=800),
        _round("aligned", 2, 8.0, alignment_s=7.0, held_bytes_max=1200),
        _round("unaligned", 2, 0.4, in_flight_records_referenced=900),
        _round("aligned", 3, 6.0, alignment_s=5.0),
        _round("unaligned", 3, 1.2, in_flight_records_referenced=700),
    ]
    return c


def test_ratios_are_taken_within_each_round():
    c = _comparison()
    assert c.ratios("aligned") == [1.0, 1.0, 1.0]
    assert c.ratios("unaligned") == pytest.approx([0.125, 0.05, 0.2])


def test_a_round_without_the_baseline_gives_no_ratio():
    c = _comparison()
    c.rounds = [r for r in c.rounds if not (r.variant == "aligned" and r.round == 2)]
    assert c.ratios("unaligned") == pytest.approx([0.125, 0.2])


def test_the_tables_show_each_round_side_by_side_and_the_medians():
    lines = _comparison().render().splitlines()
    per_round = [line.split() for line in lines if line.strip()[:1].isdigit()]
    # round, backlog, aligned s, unaligned s, unaligned/aligned
    assert per_round == [
        ["1", "500", "4.00", "0.50", "0.125"],
        ["2", "1000", "8.00", "0.40", "0.05"],
        ["3", "1500", "6.00", "1.20", "0.2"],
    ]
    aligned = next(line for line in lines if line.startswith("aligned "))
    unaligned = next(line for line in lines if line.startswith("unaligned "))
    # rounds, first barrier, alignment (median 5.00), held bytes (max 1200), in flight, copied, state bytes
    assert aligned.split()[1:8] == ["3", "0.00", "5.00", "1200", "0", "0", "100"]
    assert unaligned.split()[1:8] == ["3", "0.00", "0.00", "0", "800", "0", "100"]
    assert (
        lines[-1] == "unaligned took 0.125 x the time of aligned (median over 3 round(s), each measured side by side)"
    )


def test_a_round_one_variant_missed_shows_a_dash():
    c = _comparison()
    c.rounds = [r for r in c.rounds if not (r.variant == "unaligned" and r.round == 2)]
    row = next(line.split() for line in c.render().splitlines() if line.strip().startswith("2 "))
    assert row == ["2", "1000", "8.00", "-", "-"]


def test_a_variant_with_no_round_says_so():
    c = Comparison(["aligned", "at-least-once"], slow_ms=2.0, rounds=[_round("aligned", 1, 1.0)])
    assert "at-least-once" in c.render() and "(no completed checkpoint)" in c.render()


def test_every_round_goes_to_json():
    data = json.loads(_comparison().to_json())
    assert data["variants"] == ["aligned", "unaligned"] and len(data["rounds"]) == 6
    assert data["rounds"][1]["in_flight_records"] == 800


@pytest.mark.parametrize(
    "variants, backlogs, named",
    [
        (["aligned", "sideways"], [10], "sideways"),
        ([], [10], "(none)"),
        (["aligned", "aligned"], [10], "each at most once"),
        (["aligned"], [], "--backlogs (none)"),
        (["aligned"], [10, -5], "--backlogs 10,-5"),
    ],
)
def test_bad_arguments_are_named(variants, backlogs, named):
    with pytest.raises(ConfigError, match=named.replace("(", r"\(").replace(")", r"\)")):
        check_arguments(variants, backlogs)


def test_cli_help_and_a_bad_variant_before_anything_starts(tmp_path):
    run = lambda *a: subprocess.run(  # noqa: E731
        [sys.executable, "-m", "streaming.tools.cli", "--home", str(tmp_path), *a],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "compare" in run("--help").stdout
    help_text = run("compare", "--help")
    assert help_text.returncode == 0 and "--variants" in help_text.stdout and "side by side" in help_text.stdout
    bad = run("compare", "--variants", "aligned,sideways")
    assert bad.returncode == 2 and "sideways" in bad.stderr and "Traceback" not in bad.stderr
    not_numbers = run("compare", "--backlogs", "10,many")
    assert not_numbers.returncode == 2 and "--backlogs 10,many" in not_numbers.stderr
    # nothing was started for either: no runtime in the home
    assert not (tmp_path / "runtime").exists()
