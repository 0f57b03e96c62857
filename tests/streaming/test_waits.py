"""``streaming.waits``: every bounded wait of spark-abs, on a clock and a
sleep of the test's own where it can; and the rule that keeps it the only
place that waits: no module under ``streaming/`` but ``streaming/waits.py``
imports tenacity, computes a deadline from ``time.monotonic()`` by hand or
loops on ``time.monotonic()`` (docs/architecture/invariants.md, "every wait
has a bound")."""

from __future__ import annotations

import ast
import logging
import math
import pathlib
import threading

import pytest

from streaming.errors import KafkaUnavailableError, SparkAbsError, StoreError
from streaming.waits import Deadline, WaitTimeout, call_within, join_within, poll_until, retry

ROOT = pathlib.Path(__file__).resolve().parents[2]
WAITS = ROOT / "streaming" / "waits.py"


class Clock:
    """A monotonic clock moved on by ``sleep`` alone."""

    def __init__(self) -> None:
        self.now = 100.0
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += seconds


# ---- Deadline


def test_a_deadline_says_what_is_left_and_when_it_passed():
    clock = Clock()
    deadline = Deadline(2.5, clock)
    assert (deadline.left(), deadline.left_ms(), deadline.passed(), deadline.at) == (2.5, 2500, False, 102.5)
    clock.now += 2.0
    assert deadline.left() == pytest.approx(0.5) and not deadline.passed()
    clock.now += 1.0
    # past it: nothing left, and a client's timeout is never 0 ("for ever" to some clients)
    assert (deadline.left(), deadline.left_ms(), deadline.left_ms(least=0), deadline.passed()) == (0.0, 1, 0, True)


def test_a_deadline_of_infinity_never_passes():
    clock = Clock()
    deadline = Deadline(math.inf, clock)
    clock.now += 1e9
    assert not deadline.passed() and deadline.left() == math.inf


# ---- poll_until


def test_poll_until_returns_the_first_truthy_answer_asking_every_every_s():
    clock = Clock()
    answers = iter([None, 0, "", "ready", "later"])
    assert poll_until(lambda: next(answers), 10, "the thing", every_s=0.5, clock=clock, sleep=clock.sleep) == "ready"
    assert clock.slept == [0.5, 0.5, 0.5]


def test_poll_until_names_what_and_the_bound_when_it_passes_asking_once_more_at_the_bound():
    clock = Clock()
    asked: list[float] = []

    def never() -> bool:
        asked.append(clock.now - 100.0)
        return False

    with pytest.raises(WaitTimeout, match=r"^the topic appearing did not happen within 1 s \(TOPIC_BOUND_S\)$"):
        poll_until(
            never, 1.0, "the topic appearing", bound="TOPIC_BOUND_S", every_s=0.4, clock=clock, sleep=clock.sleep
        )
    # its last pause is cut to the bound, and it is asked there once more
    assert asked == pytest.approx([0.0, 0.4, 0.8, 1.0]) and clock.slept == pytest.approx([0.4, 0.4, 0.2])


def test_poll_until_raises_the_callers_error_and_lets_the_conditions_own_through():
    clock = Clock()
    with pytest.raises(KafkaUnavailableError, match="^Kafka: the topic did not happen within 0.5 s$"):
        poll_until(
            lambda: False,
            0.5,
            "the topic",
            error=lambda message: KafkaUnavailableError(f"Kafka: {message}"),
            clock=clock,
            sleep=clock.sleep,
        )

    def refused() -> bool:
        raise StoreError("refused")

    with pytest.raises(StoreError, match="refused"):
        poll_until(refused, 5.0, "the store", clock=clock, sleep=clock.sleep)


def test_a_wait_timeout_is_a_spark_abs_error():
    assert issubclass(WaitTimeout, SparkAbsError)


# ---- retry


def _failing(*failures: BaseException, value: str = "done"):
    calls: list[int] = []

    def call() -> str:
        calls.append(1)
        if len(calls) <= len(failures):
            raise failures[len(calls) - 1]
        return value

    return call, calls


def test_retry_tries_again_with_growing_pauses_each_logged_in_one_format(caplog):
    clock = Clock()
    call, calls = _failing(StoreError("refused"), StoreError("refused again"), StoreError("still"))
    logger = logging.getLogger("test_waits")
    with caplog.at_level(logging.WARNING, logger="test_waits"):
        value = retry(
            call,
            60.0,
            "reading the job",
            retry_on=StoreError,
            bound="STORE_BOUND_S",
            first_s=1.0,
            max_s=3.0,
            cause="the store looks unreachable",
            logger=logger,
            sleep=clock.sleep,
        )
    assert value == "done" and len(calls) == 4
    assert clock.slept == [1.0, 2.0, 3.0]  # doubled, up to max_s
    assert [r.getMessage() for r in caplog.records] == [
        "reading the job: refused; the store looks unreachable, trying again in 1 s (for up to 60 s, STORE_BOUND_S)",
        "reading the job: refused again; the store looks unreachable, trying again in 2 s (for up to 60 s, "
        "STORE_BOUND_S)",
        "reading the job: still; the store looks unreachable, trying again in 3 s (for up to 60 s, STORE_BOUND_S)",
    ]
    assert {r.levelno for r in caplog.records} == {logging.WARNING}


def test_retry_raises_a_failure_it_does_not_accept_at_once():
    clock = Clock()
    call, calls = _failing(ValueError("a bug"))
    with pytest.raises(ValueError, match="a bug"):
        retry(call, 60.0, "reading", retry_on=StoreError, sleep=clock.sleep)
    assert len(calls) == 1 and clock.slept == []


def test_retry_takes_a_predicate():
    clock = Clock()
    call, calls = _failing(StoreError("away"), StoreError("missing"))
    with pytest.raises(StoreError, match="missing"):
        retry(call, 60.0, "reading", retry_on=lambda exc: "away" in str(exc), sleep=clock.sleep)
    assert len(calls) == 2


def test_retry_bounded_by_attempts_names_them_and_the_last_failure_which_is_its_cause(caplog):
    clock = Clock()
    last = StoreError("lost the race")
    call, calls = _failing(StoreError("lost"), StoreError("lost"), last)
    with caplog.at_level(logging.INFO, logger="streaming.waits"), pytest.raises(WaitTimeout) as raised:
        retry(
            call,
            None,
            "committing epoch 3",
            retry_on=StoreError,
            attempts=3,
            bound="ATTEMPTS",
            first_s=0.1,
            max_s=1.0,
            jitter_s=0.05,
            level=logging.INFO,
            sleep=clock.sleep,
        )
    assert str(raised.value) == (
        "committing epoch 3 did not happen in 3 attempts (ATTEMPTS): StoreError: lost the race"
    )
    assert raised.value.__cause__ is last and len(calls) == 3
    # two pauses, each growing and a random part of up to jitter_s longer
    assert len(clock.slept) == 2
    assert 0.1 <= clock.slept[0] <= 0.15 and 0.2 <= clock.slept[1] <= 0.25
    assert [r.levelno for r in caplog.records] == [logging.INFO, logging.INFO]
    assert caplog.records[0].getMessage().endswith("(for up to 3 attempts, ATTEMPTS)")


def test_retry_bounded_in_time_raises_the_callers_error_from_the_last_failure():
    clock = Clock()
    last = StoreError("timed out")
    call, _ = _failing(last, StoreError("never reached"))
    with pytest.raises(KafkaUnavailableError, match="^Kafka did not take it: is the broker reachable") as raised:
        retry(
            call,
            0.0,  # passed at the first failure
            "Kafka taking it",
            retry_on=StoreError,
            error=lambda message: KafkaUnavailableError("Kafka did not take it: is the broker reachable?"),
            sleep=clock.sleep,
        )
    assert raised.value.__cause__ is last and clock.slept == []


def test_the_message_of_a_retry_in_time_names_the_bound():
    call, _ = _failing(StoreError("refused"), StoreError("refused"))
    with pytest.raises(
        WaitTimeout, match=r"^reading did not happen within 0 s \(STORE_BOUND_S\): StoreError: refused$"
    ):
        retry(call, 0.0, "reading", retry_on=StoreError, bound="STORE_BOUND_S", sleep=Clock().sleep)


def test_a_retry_without_any_bound_is_refused():
    with pytest.raises(ValueError, match="needs a bound"):
        retry(lambda: None, None, "reading", retry_on=StoreError)


# ---- call_within, join_within


def test_call_within_returns_the_value_or_raises_what_the_call_raised():
    assert call_within(lambda: 42, 5.0, "answering") == 42

    def refused() -> int:
        raise StoreError("refused")

    with pytest.raises(StoreError, match="refused"):
        call_within(refused, 5.0, "answering")


def test_call_within_gives_up_on_a_call_past_its_bound_with_the_callers_error():
    release = threading.Event()
    try:
        with pytest.raises(WaitTimeout, match=r"^committing did not happen within 0.05 s \(the delivery timeout\)$"):
            call_within(release.wait, 0.05, "committing", bound="the delivery timeout")
        with pytest.raises(KafkaUnavailableError, match="committing did not finish"):
            call_within(
                release.wait,
                0.05,
                "committing",
                error=lambda message: KafkaUnavailableError(message.replace("happen", "finish")),
            )
    finally:
        release.set()


def test_join_within_says_whether_the_thread_ended_warning_or_raising_when_not(caplog):
    done = threading.Thread(target=lambda: None)
    done.start()
    assert join_within(done, 5.0, "a quick thread") is True
    release = threading.Event()
    stuck = threading.Thread(target=release.wait, daemon=True)
    stuck.start()
    try:
        with caplog.at_level(logging.WARNING, logger="streaming.waits"):
            assert join_within(stuck, 0.05, "the replay", bound="REPLAY_BOUND_S") is False
        assert [r.getMessage() for r in caplog.records] == [
            "the replay did not happen within 0.05 s (REPLAY_BOUND_S); left running"
        ]
        with pytest.raises(KafkaUnavailableError, match="^the write did not happen within 0.05 s$"):
            join_within(stuck, 0.05, "the write", error=KafkaUnavailableError)
    finally:
        release.set()
        stuck.join(5)


# ---- the rule: every wait goes through streaming.waits


def _is_monotonic_call(node: ast.AST) -> bool:
    """``time.monotonic()`` (or ``monotonic()``, imported from time)."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    if isinstance(func, ast.Attribute):
        return func.attr == "monotonic" and isinstance(func.value, ast.Name) and func.value.id == "time"
    return isinstance(func, ast.Name) and func.id == "monotonic"


def hand_written_waits(source: str, where: str) -> list[str]:
    """``where:line: what`` for each wait of ``source`` not written with
    ``streaming.waits``: an import of tenacity, a deadline computed by hand
    (``time.monotonic() + ...``), a ``while`` loop on ``time.monotonic()``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import) and any(a.name.split(".")[0] == "tenacity" for a in node.names):
            found.append(f"{where}:{node.lineno}: imports tenacity (use streaming.waits.retry)")
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "tenacity":
            found.append(f"{where}:{node.lineno}: imports from tenacity (use streaming.waits.retry)")
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            if _is_monotonic_call(node.left) or _is_monotonic_call(node.right):
                found.append(f"{where}:{node.lineno}: a deadline computed by hand (use streaming.waits.Deadline)")
        elif isinstance(node, ast.While) and any(_is_monotonic_call(n) for n in ast.walk(node.test)):
            found.append(
                f"{where}:{node.lineno}: a while loop on time.monotonic() (use streaming.waits.poll_until or Deadline)"
            )
    return sorted(found, key=lambda line: int(line.split(":")[1]))


def test_the_rule_finds_each_kind_of_hand_written_wait():
    source = """
import time
import tenacity
from tenacity import Retrying

deadline = time.monotonic() + 5
while time.monotonic() < deadline:
    time.sleep(0.1)
started = time.monotonic()
while not done() and time.monotonic() - started < 5:
    pass
limit = 3 + time.monotonic()
took = time.monotonic() - started  # a duration: no wait
"""
    assert [line.split(": ", 1)[0] for line in hand_written_waits(source, "m.py")] == [
        "m.py:3",
        "m.py:4",
        "m.py:6",
        "m.py:7",
        "m.py:10",
        "m.py:12",
    ]


def test_every_wait_under_streaming_goes_through_streaming_waits():
    found = []
    for path in sorted((ROOT / "streaming").rglob("*.py")):
        if path == WAITS:
            continue
        found += hand_written_waits(path.read_text(), path.relative_to(ROOT).as_posix())
    assert not found, "hand-written waits (docs/architecture/invariants.md):\n" + "\n".join(found)
