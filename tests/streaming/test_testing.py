import itertools

import pytest

from streaming.testing import assert_eventually


def test_returns_once_the_value_appears():
    counter = itertools.count()
    assert assert_eventually(lambda: next(counter) >= 3, True, timeout=5, interval=0.01) is True


def test_fails_with_the_last_value_seen():
    with pytest.raises(AssertionError, match="last seen: 'stuck'"):
        assert_eventually(lambda: "stuck", "done", timeout=0.2, interval=0.05)


def test_reports_an_exception_that_was_the_last_thing_seen():
    def boom():
        raise ValueError("broker gone")

    with pytest.raises(AssertionError, match="broker gone"):
        assert_eventually(boom, 1, timeout=0.2, interval=0.05)
