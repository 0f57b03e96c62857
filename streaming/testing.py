"""Helpers for tests of pipelines built with spark-abs: poll until a value
comes (``assert_eventually``), keep what the library logs (``LineCollector``)
and read a metrics endpoint (``scrape``)."""

from __future__ import annotations

import logging
import urllib.request
from collections.abc import Callable
from typing import TypeVar, cast

from streaming.waits import poll_until

__all__ = ["LineCollector", "assert_eventually", "Scrape", "scrape"]

T = TypeVar("T")


def assert_eventually(fn: Callable[[], T], expected: T, timeout: float = 30.0, interval: float = 0.1) -> T:
    """Poll ``fn`` until it returns ``expected``; after ``timeout`` seconds fail
    with the last value seen (or the last exception raised)."""
    last: object = "<not called>"

    def seen() -> bool:
        nonlocal last
        try:
            last = fn()
            return bool(last == expected)
        except Exception as exc:  # keep polling; report it if it is the last thing seen
            last = exc
            return False

    poll_until(
        seen,
        timeout,
        f"{expected!r}",
        every_s=interval,
        error=lambda message: AssertionError(f"expected {expected!r} within {timeout:.1f} s; last seen: {last!r}"),
    )
    return cast(T, last)


class LineCollector(logging.Handler):
    """Keeps what the library logs (INFO and up, the ``streaming`` loggers:
    what ``spark-abs run`` prints) as lines in ``lines``, from ``attach``
    until ``detach``."""

    def __init__(self, lines: list[str] | None = None, logger: str = "streaming"):
        super().__init__(logging.INFO)
        self.lines: list[str] = [] if lines is None else lines
        self._logger = logging.getLogger(logger)

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def attach(self) -> LineCollector:
        if self._logger.getEffectiveLevel() > logging.INFO:
            self._logger.setLevel(logging.INFO)
        self._logger.addHandler(self)
        return self

    def detach(self) -> None:
        self._logger.removeHandler(self)


class Scrape(dict[tuple[str, tuple[tuple[str, str], ...]], float]):
    """The samples of one scrape of a metrics endpoint: (name, labels as
    sorted pairs) -> value."""

    def total(self, name: str, **labels: str) -> float:
        """The sum of the samples called ``name`` whose labels include ``labels``."""
        wanted = set(labels.items())
        return sum(value for (sample, pairs), value in self.items() if sample == name and wanted <= set(pairs))


def scrape(url: str, timeout: float = 5.0) -> Scrape:
    """What a Prometheus endpoint (``http://host:port/metrics``) serves now."""
    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode()
    return Scrape(
        ((sample.name, tuple(sorted(sample.labels.items()))), sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    )
