"""``spark-abs simulate``: the narration of a run, its options and errors."""

from __future__ import annotations

import io

import pytest

from barriers.simulation import narrate


def tell(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    status = narrate.main(list(argv), out=out)
    return status, out.getvalue()


def test_default_tells_seed_001_and_its_snapshot():
    status, text = tell()
    assert status == 0
    assert "P1 records its own state: {A, B}" in text
    assert "P3 records its own state: {I}; marks C13 empty" in text
    assert "C21 = [the message sent at H]" in text
    snapshot = text[text.index("Snapshot 1:") :]
    for line in ("P1 = {A, B}", "P2 = {F, G, H}", "P3 = {I}", "C12, C13, C23, C31, C32: empty"):
        assert line in snapshot
    assert "consistent cut + reachability (EWD 864a): holds" in text


def test_main_prints_to_stdout_by_default(capsys):
    assert narrate.main([]) == 0
    assert "P2 = {F, G, H}" in capsys.readouterr().out


@pytest.mark.parametrize(
    "argv",
    [
        ("--example", "money", "--seed", "7", "--processes", "4"),
        ("--example", "dataflow", "--mode", "aligned"),
        ("--example", "dataflow", "--mode", "unaligned", "--processes", "3"),
        ("--example", "dataflow", "--mode", "aligned-timeout", "--seed", "3"),
        ("--example", "dataflow", "--mode", "at-least-once"),
    ],
)
def test_other_examples_tell_and_check(argv):
    status, text = tell(*argv)
    assert status == 0, text
    assert "Snapshot " in text and "holds" in text


def test_money_says_conservation_holds():
    status, text = tell("--example", "money", "--seed", "2")
    assert status == 0
    assert "+ conservation: holds" in text and "in transit:" in text


@pytest.mark.parametrize(
    "argv, message",
    [
        (("--example", "nope"), "invalid choice"),
        (("--mode", "aligned"), "unaligned snapshot"),
        (("--example", "seed-001", "--processes", "4"), "exactly 3"),
        (("--example", "dataflow", "--processes", "2"), "3 to 9"),
        (("--seed", "x"), "invalid int"),
        (("--processes", "0"), "not positive"),
    ],
)
def test_bad_arguments_are_argparse_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_info:
        narrate.main(list(argv))
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_help_explains_the_options(capsys):
    with pytest.raises(SystemExit) as exit_info:
        narrate.main(["--help"])
    assert exit_info.value.code == 0
    text = capsys.readouterr().out
    for word in ("--example", "--seed", "--mode", "--processes", "aligned-timeout", "seed-001", "examples:"):
        assert word in text


def test_a_leading_separator_is_accepted():
    status, text = tell("--", "--example", "money", "--seed", "1")
    assert status == 0 and "Money:" in text
