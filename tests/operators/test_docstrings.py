"""The runnable examples in the operators' docstrings run and print what
they say (``docs/operators.md`` points users to them)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = [
    "operators.windows",
    "operators.session_windows",
    "operators.joins",
    "operators.interval_join",
    "operators.dedup",
    "operators.process",
]


@pytest.mark.parametrize("name", MODULES)
def test_the_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.failed == 0
    if name != "operators.joins":
        assert result.attempted > 0, f"{name} has no example"
