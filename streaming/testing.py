"""Helpers for tests of pipelines built with spark-abs (and for its own tests)."""

from __future__ import annotations

import time
from typing import Callable, TypeVar

__all__ = ["assert_eventually"]

T = TypeVar("T")


def assert_eventually(fn: Callable[[], T], expected: T, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll ``fn`` until it returns ``expected``; after ``timeout`` seconds fail
    with the last value seen (or the last exception raised)."""
    deadline = time.monotonic() + timeout
    last: object = "<not called>"
    while True:
        try:
            last = fn()
            if last == expected:
                return last
        except Exception as exc:  # keep polling; report it if it is the last thing seen
            last = exc
        if time.monotonic() >= deadline:
            raise AssertionError(f"expected {expected!r} within {timeout:.1f} s; last seen: {last!r}")
        time.sleep(interval)
