"""The runner's side of remote worker groups (``streaming.engine.remote.leases``):
``RemoteMembers``'s lease, what its heartbeats change, why the job must
restore and the pause around a rescale, with the lease's publisher
(``new_renewal``) recorded and the membership on a clock of the test's own.

``LeaseRenewal`` (a thread publishing on a Kafka producer) and ``pause``
without a ``poll`` (a control topic of its own) need a broker: the
integration tests run them."""

from __future__ import annotations

import itertools
import logging
from types import SimpleNamespace

import pytest

from streaming.adapters.kafka.control.events import Heartbeat, Lease, Trigger
from streaming.api.config import KafkaAccess
from streaming.engine.remote import leases
from streaming.engine.remote.leases import RemoteMembers
from streaming.engine.remote.membership import HEARTBEAT_INTERVAL_S, WAITING_NOTICE_S, RemoteGroups

GROUPS = {"legs": ["legs-0"], "accounts": ["accounts-0", "accounts-1"]}
TIMEOUT_S = 10.0
RUNNER = "runner:1:abc"


class Clock:
    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


class Renewals:
    """What ``new_renewal`` made: every lease renewed, and the last one."""

    def __init__(self) -> None:
        self.made = 0
        self.renewed: list[Lease] = []
        self.ended: list[Lease] = []

    def __call__(self) -> Renewals:
        self.made += 1
        return self

    def renew(self, lease: Lease) -> None:
        self.renewed.append(lease)

    def end(self, lease: Lease) -> None:
        self.ended.append(lease)


def _members(clock: Clock | None = None, groups=GROUPS) -> tuple[RemoteMembers, Renewals]:
    renewals = Renewals()
    members = RemoteMembers(
        RUNNER,
        "spark_abs_examples.money:pipeline",
        "money",
        '{"store": "file:///x"}',
        TIMEOUT_S,
        groups,
        renewals,
    )
    if clock is not None:  # the membership's decisions on the test's clock
        members.groups = RemoteGroups(dict(groups), TIMEOUT_S, clock=clock, runner=members.runner)
    return members, renewals


_BEATS = itertools.count(1)


def _beat(group: str, who: str, running: int | None, sequence: int | None = None, runner=RUNNER) -> Heartbeat:
    """``who``'s heartbeat answering ``runner``'s lease, numbered after every one before unless ``sequence``."""
    number = next(_BEATS) if sequence is None else sequence
    return Heartbeat(group, who, who.split(":")[0], running, number, runner=runner)


def _own_lease(members: RemoteMembers) -> Lease:
    """A lease this runner published, read back from the control topic."""
    return members.lease()


def test_the_lease_says_the_generation_its_checkpoint_the_groups_and_their_members():
    members, renewals = _members()
    members.start_generation(2, 7, {"legs": ["legs-0", "legs-1"]}, {"legs": 2})
    members.observe([_beat("legs", "h:1:aaa", None)])
    lease = members.lease()
    assert (lease.runner, lease.generation, lease.checkpoint, lease.pipeline, lease.job) == (
        "runner:1:abc",
        2,
        7,
        "spark_abs_examples.money:pipeline",
        "money",
    )
    assert lease.settings == '{"store": "file:///x"}' and lease.scale == {"legs": 2} and lease.timeout_s == TIMEOUT_S
    assert lease.groups == {"legs": ["legs-0", "legs-1"]} and lease.members == {"legs": "h:1:aaa"}
    assert not lease.ended and lease.note == ""
    last = members.lease(ended=True)
    assert last.ended and last.members == {} and last.generation == 2
    # the lease is a copy: what it holds does not move with the membership
    lease.groups["legs"].append("legs-9")
    assert members.lease().groups == {"legs": ["legs-0", "legs-1"]}
    assert renewals.made == 1


def test_the_publisher_is_made_at_the_first_renewal_and_ends_with_the_last_lease():
    members, renewals = _members()
    members.end()  # nothing was ever published: nothing to end
    assert (renewals.made, renewals.ended) == (0, [])
    members.start_generation(1, None, GROUPS, None)
    members.renew()
    assert renewals.made == 1 and [lease.generation for lease in renewals.renewed] == [1, 1]
    members.end()
    ((last,),) = (renewals.ended,)
    assert last.ended and last.members == {} and last.generation == 1
    members.end()  # once only
    assert len(renewals.ended) == 1
    members.renew()  # a runner that goes on publishes on a publisher of its own again
    assert renewals.made == 2


def test_a_worker_that_joins_is_named_in_a_lease_at_once_and_a_second_waits_unnamed():
    members, renewals = _members()
    members.start_generation(1, 3, GROUPS, None)
    before = len(renewals.renewed)
    events = [_beat("legs", "h:1:aaa", None), Trigger(checkpoint_id=4, generation=1)]
    assert members.observe(events) is events  # on their way to the coordinator, all of them
    assert renewals.renewed[before:] and renewals.renewed[-1].members == {"legs": "h:1:aaa"}
    published = len(renewals.renewed)
    members.observe([_beat("legs", "h:2:bbb", None), _beat("legs", "h:1:aaa", 1)])  # a standby; the member runs
    assert len(renewals.renewed) == published and members.groups.standby == {"legs": "h:2:bbb"}
    assert members.groups.missing() == ["accounts"]


def test_a_member_that_stopped_its_tasks_makes_the_job_restore_and_its_standby_takes_over():
    members, _ = _members()
    members.start_generation(1, 3, GROUPS, None)
    members.observe([_beat("legs", "h:1:aaa", None), _beat("legs", "h:2:bbb", None), _beat("legs", "h:1:aaa", 1)])
    assert members.restore_reason() is None
    members.observe([_beat("legs", "h:1:aaa", None)])  # it ran generation 1's tasks, and no longer does
    assert members.restore_reason() == "worker group legs stopped its tasks"
    assert members.groups.members["legs"] == "h:2:bbb"
    members.start_generation(2, 5, GROUPS, None)  # the restore: a new generation, the standby its member
    assert members.restore_reason() is None
    assert members.lease().members == {"legs": "h:2:bbb"}


def test_a_member_silent_while_the_runner_reads_its_own_leases_back_is_dropped_with_the_reason():
    clock = Clock()
    members, _ = _members(clock)
    members.start_generation(1, 3, GROUPS, None)
    own = _own_lease(members)
    members.observe([_beat("legs", "h:1:aaa", None), own])
    for _ in range(12):  # the runner's leases come back every second; the member says nothing
        clock.now += 1.0
        members.observe([own])
    assert members.restore_reason() == (
        "worker group legs (h:1:aaa) went silent: no heartbeat for 12 s (heartbeat_timeout_s 10)"
    )
    assert "legs" not in members.groups.members


def test_silence_during_an_outage_restores_nobody_and_another_runners_lease_is_not_ones_own():
    clock = Clock()
    members, _ = _members(clock)
    members.start_generation(1, 3, GROUPS, None)
    members.observe([_beat("legs", "h:1:aaa", None)])
    members.observe([_own_lease(members)])
    other = Lease("runner:2:def", 1, None, "p", "money", "{}", None, GROUPS, {}, TIMEOUT_S)
    for _ in range(30):  # only another runner's leases are read: this runner's own do not come back
        clock.now += 1.0
        members.observe([other])
    assert members.restore_reason() is None
    assert members.groups.members == {"legs": "h:1:aaa"}


@pytest.fixture
def monotonic(monkeypatch):
    """The module's monotonic clock, moved on by the test (and by each ``poll``)."""
    clock = Clock()
    monkeypatch.setattr(leases, "time", SimpleNamespace(monotonic=clock))
    return clock


def test_the_groups_nobody_runs_yet_are_named_now_and_then(monotonic, caplog):
    members, _ = _members()
    members.start_generation(1, None, GROUPS, None)
    caplog.set_level(logging.INFO, logger=leases.__name__)
    assert members.restore_reason() is None
    monotonic.now += WAITING_NOTICE_S - 1
    members.restore_reason()
    waiting = [r.getMessage() for r in caplog.records if "waiting for remote worker group" in r.getMessage()]
    assert waiting == [
        "waiting for remote worker group(s) accounts, legs: start `spark-abs worker --job money --group GROUP` "
        "on any host that reaches Kafka and the store"
    ]
    monotonic.now += 1
    members.observe([_beat("legs", "h:1:aaa", None)])
    members.restore_reason()
    assert "group(s) accounts:" in caplog.records[-1].getMessage()
    assert len([r for r in caplog.records if "waiting for" in r.getMessage()]) == 2


def _pause(members: RemoteMembers, monotonic: Clock, heard) -> list[float]:
    """``members.pause`` on a ``poll`` that hears ``heard(seconds since the pause began)``."""
    began, polls = monotonic.now, []

    def poll(timeout_s: float) -> list:
        monotonic.now += timeout_s
        polls.append(monotonic.now - began)
        return members.observe(heard(monotonic.now - began))

    members.pause(4, "checkpoint 7 is being rescaled to accounts=3", poll, KafkaAccess("127.0.0.1:9"), None)
    return polls


def test_a_pause_names_no_member_until_every_worker_said_its_tasks_stopped(monotonic, caplog):
    groups = {**GROUPS, "orders": ["orders-0"]}
    members, renewals = _members(groups=groups)
    members.start_generation(3, 7, groups, None)
    members.observe([_beat("legs", "h:1:aaa", 3), _beat("accounts", "h:2:bbb", 3)])
    published = len(renewals.renewed)

    def heard(elapsed: float) -> list:
        if elapsed < 1.0:
            return [_beat("legs", "h:1:aaa", 3), _beat("accounts", "h:2:bbb", 3)]
        if elapsed < 1.5:  # a worker of the group nobody ran joins meanwhile: it is told to pause too
            return [_beat("legs", "h:1:aaa", None), _beat("orders", "h:3:ccc", None)]
        return [_beat("legs", "h:1:aaa", None), _beat("accounts", "h:2:bbb", None)]

    with caplog.at_level(logging.WARNING, logger=leases.__name__):
        polls = _pause(members, monotonic, heard)
    pause = renewals.renewed[published]
    assert (pause.generation, pause.checkpoint, pause.members, pause.note) == (
        4,
        None,
        {},
        "checkpoint 7 is being rescaled to accounts=3",
    )
    assert len(renewals.renewed) == published + 2  # the pause, and at once when orders joined
    assert all(lease.members == {} for lease in renewals.renewed[published:])
    # it listened at least a few heartbeats long, and stopped once every member had said it stopped
    assert 2.5 * HEARTBEAT_INTERVAL_S <= polls[-1] < 2.5 * HEARTBEAT_INTERVAL_S + 0.5
    assert members.paused is None and members.groups.still_running() == []
    assert not [r for r in caplog.records if "rescaling anyway" in r.getMessage()]
    lease = members.lease()  # the next lease names them again
    assert (lease.generation, lease.checkpoint) == (3, 7)
    assert lease.members == {"legs": "h:1:aaa", "accounts": "h:2:bbb", "orders": "h:3:ccc"}


def test_a_pause_gives_up_on_a_worker_that_never_says_it_stopped_after_the_heartbeat_timeout(monotonic, caplog):
    members, _ = _members()
    members.start_generation(3, 7, GROUPS, None)
    members.observe([_beat("legs", "h:1:aaa", 3), _beat("accounts", "h:2:bbb", 3)])

    def heard(elapsed: float) -> list:
        return [_beat("legs", "h:1:aaa", None), _beat("accounts", "h:2:bbb", 3)]

    with caplog.at_level(logging.WARNING, logger=leases.__name__):
        polls = _pause(members, monotonic, heard)
    assert TIMEOUT_S + 5 <= polls[-1] < TIMEOUT_S + 5 + 0.5
    assert members.paused is None
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning == "remote worker group(s) accounts did not say their tasks stopped; rescaling anyway"


def test_a_pause_whose_poll_fails_is_over_all_the_same(monotonic):
    members, renewals = _members()
    members.start_generation(3, 7, GROUPS, None)

    def heard(elapsed: float) -> list:
        raise ConnectionError("the broker went away")

    with pytest.raises(ConnectionError):
        _pause(members, monotonic, heard)
    assert members.paused is None and members.lease().generation == 3
