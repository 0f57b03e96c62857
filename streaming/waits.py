"""Every bounded wait of spark-abs, in one place: nothing waits for ever,
and every error of a wait names what it waited for and the bound that
passed (docs/architecture/invariants.md, "every wait has a bound").

- ``Deadline``: a bound started now, for code that hands the time left to
  a client call (``left()``, ``left_ms()``) or checks it between steps of
  its own (``passed()``);
- ``poll_until``: a condition asked again until it holds;
- ``retry``: a call tried again with growing pauses while it fails in a
  way that may pass (an unreachable broker, store or registry, a commit
  that lost a race), each pause logged in one format;
- ``call_within``: a call that takes no timeout, waited for on a thread of
  its own;
- ``join_within``: a thread waited for.

When a bound passes each raises ``error(message)`` when the caller gives an
``error`` (a ``KafkaUnavailableError``, a ``StoreError``: the caller's
domain), else a ``WaitTimeout``; the message names ``what`` and the bound.
A caller whose own wording names the last failure of a ``retry`` catches
the ``WaitTimeout`` and finds that failure in its ``__cause__``.

This is the only module that computes a deadline from the clock, loops on
the clock or imports tenacity: ``tests/streaming/test_waits.py`` fails on a
hand-written one anywhere else under ``streaming/``."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import tenacity

from streaming.errors import SparkAbsError

__all__ = ["Deadline", "WaitTimeout", "call_within", "join_within", "poll_until", "retry"]

log = logging.getLogger(__name__)

T = TypeVar("T")
ErrorFactory = Callable[[str], BaseException]


class WaitTimeout(SparkAbsError):
    """A bounded wait whose bound passed (its message names what and which bound)."""


def _said(what: str, limit: str, bound: str | None) -> str:
    named = f" ({bound})" if bound else ""
    return f"{what} did not happen {limit}{named}"


def _within(bound_s: float) -> str:
    return f"within {bound_s:g} s"


def _raise(error: ErrorFactory | None, message: str) -> BaseException:
    return (error or WaitTimeout)(message)


def _seconds(pause: float) -> str:
    """A pause as a log line says it: to a tenth of a second, no trailing zeros."""
    return f"{round(pause, 1):g}"


class Deadline:
    """``bound_s`` from now on ``clock``: how much of it is left.  ``at`` is
    that moment on ``clock`` (``math.inf`` as ``bound_s``: it never passes)."""

    __slots__ = ("bound_s", "clock", "at")

    def __init__(self, bound_s: float, clock: Callable[[], float] = time.monotonic):
        self.bound_s = bound_s
        self.clock = clock
        self.at = clock() + bound_s

    def left(self) -> float:
        """Seconds left, never below 0."""
        return max(0.0, self.at - self.clock())

    def left_ms(self, least: int = 1) -> int:
        """Milliseconds left, at least ``least`` (a client's timeout of 0 may mean "for ever")."""
        return max(least, int(self.left() * 1000))

    def passed(self) -> bool:
        return self.clock() >= self.at


def poll_until(
    condition: Callable[[], T | None],
    bound_s: float,
    what: str,
    *,
    bound: str | None = None,
    every_s: float = 0.2,
    error: ErrorFactory | None = None,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``condition()`` asked every ``every_s`` until it returns something
    truthy, which is returned; when ``bound_s`` passes first, ``error`` (or
    ``WaitTimeout``) naming ``what`` and ``bound``.  ``condition`` is asked
    at least once, and once more at the bound; what it raises goes through
    at once.  A caller to whom the bound passing is no failure (it goes on,
    saying so) catches the ``WaitTimeout``."""
    deadline = Deadline(bound_s, clock)
    while True:
        value = condition()
        if value:
            return value
        if deadline.passed():
            raise _raise(error, _said(what, _within(bound_s), bound))
        sleep(min(every_s, max(deadline.left(), 0.001)))


def retry(
    call: Callable[[], T],
    bound_s: float | None,
    what: str,
    *,
    retry_on: type[BaseException] | tuple[type[BaseException], ...] | Callable[[BaseException], bool],
    attempts: int | None = None,
    bound: str | None = None,
    first_s: float = 0.5,
    max_s: float = 8.0,
    jitter_s: float = 0.0,
    cause: str | None = None,
    level: int = logging.WARNING,
    error: ErrorFactory | None = None,
    logger: logging.Logger | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> T:
    """``call()`` tried again while it raises what ``retry_on`` accepts (an
    exception type, types, or a predicate), with pauses growing from
    ``first_s`` to ``max_s`` (each plus a random part of up to ``jitter_s``,
    so that rivals do not try again in step), for at most ``bound_s``
    (None: no time bound) and at most ``attempts`` calls (None: no count;
    one of the two is given); its value.  Each pause is logged on
    ``logger`` at ``level`` as ``"<what>: <failure>; <cause>, trying again
    in <pause> s (for up to <bound>)"``.  When the bound passes, ``error``
    (or ``WaitTimeout``) naming ``what``, ``bound`` and the last failure,
    raised from it.  A failure ``retry_on`` does not accept is raised as it
    is, at once."""
    if bound_s is None and attempts is None:
        raise ValueError(f"{what}: a retry needs a bound (bound_s, attempts or both)")
    matches: Callable[[BaseException], bool]
    if isinstance(retry_on, (type, tuple)):
        types = retry_on

        def matches(exc: BaseException) -> bool:
            return isinstance(exc, types)

    else:
        matches = retry_on
    say = logger or log
    limits = ([f"{bound_s:g} s"] if bound_s is not None else []) + ([f"{attempts} attempts"] if attempts else [])
    up_to = " or ".join(limits)

    def before_sleep(state: tenacity.RetryCallState) -> None:
        failure = state.outcome.exception() if state.outcome else None
        say.log(
            level,
            "%s: %s; %strying again in %s s (for up to %s%s)",
            what,
            failure,
            f"{cause}, " if cause else "",
            _seconds(state.next_action.sleep if state.next_action else 0.0),
            up_to,
            f", {bound}" if bound else "",
        )

    stops: list[tenacity.stop.stop_base] = []
    if bound_s is not None:
        stops.append(tenacity.stop_after_delay(bound_s))
    if attempts is not None:
        stops.append(tenacity.stop_after_attempt(attempts))
    pauses: tenacity.wait.wait_base = tenacity.wait_exponential(multiplier=first_s, max=max_s)
    if jitter_s:
        pauses = pauses + tenacity.wait_random(0, jitter_s)
    retrying = tenacity.Retrying(
        retry=tenacity.retry_if_exception(matches),
        stop=tenacity.stop_any(*stops),
        wait=pauses,
        before_sleep=before_sleep,
        sleep=sleep,
        reraise=True,
    )
    try:
        return retrying(call)
    except BaseException as exc:
        if not matches(exc):
            raise
        limit = " or ".join(
            ([_within(bound_s)] if bound_s is not None else []) + ([f"in {attempts} attempts"] if attempts else [])
        )
        raise _raise(error, f"{_said(what, limit, bound)}: {type(exc).__name__}: {exc}") from exc


def call_within(
    call: Callable[[], T],
    bound_s: float,
    what: str,
    *,
    bound: str | None = None,
    error: ErrorFactory | None = None,
) -> T:
    """``call()`` waited for at most ``bound_s``, for calls that take no
    timeout.  It runs on a daemon thread of its own; when the bound passes,
    ``error`` (or ``WaitTimeout``) naming ``what`` and ``bound``, and the call
    is left to end on its own (whoever called fails, and the job restores)."""
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread
            outcome["error"] = exc

    thread = threading.Thread(target=run, name=f"spark-abs {what}", daemon=True)
    thread.start()
    thread.join(bound_s)
    if thread.is_alive():
        raise _raise(error, _said(what, _within(bound_s), bound))
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]


def join_within(
    thread: threading.Thread,
    bound_s: float,
    what: str,
    *,
    bound: str | None = None,
    error: ErrorFactory | None = None,
) -> bool:
    """``thread`` joined for at most ``bound_s``: whether it ended.  When it
    did not, ``error(message)`` naming ``what`` and the bound when the caller
    gives an ``error`` (it stops the thread's work itself), else a warning
    saying so and False (the thread is left running)."""
    thread.join(bound_s)
    if not thread.is_alive():
        return True
    message = _said(what, _within(bound_s), bound)
    if error is not None:
        raise error(message)
    log.warning("%s; left running", message)
    return False
