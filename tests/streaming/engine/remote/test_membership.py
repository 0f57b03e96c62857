"""Remote worker groups' membership and liveness (``streaming.engine.remote.membership``),
on a clock of the test's own: who joins, who waits, who is taken for dead,
and why a broker outage restores nobody."""

from __future__ import annotations

import dataclasses
import itertools
import json
import logging

import pytest

from streaming.adapters.kafka.control.events import ControlEvent, ControlKind
from streaming.engine.remote.membership import (
    ActionKind,
    Heartbeat,
    HeartbeatOutcome,
    Lease,
    Membership,
    PeerSilence,
    RemoteGroups,
)


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float, *, own: PeerSilence | RemoteGroups | Membership | None = None) -> None:
        """Let ``seconds`` pass, reading back one's own events each second when ``own`` is given."""
        for _ in range(int(seconds)):
            self.now += 1.0
            if own is not None:
                own.own()
        self.now += seconds - int(seconds)


_NUMBERS = itertools.count(1)


def beat(group, incarnation, host, running, sequence=None, *, runner="") -> Heartbeat:
    """A heartbeat answering ``runner`` (a ``RemoteGroups``' own is "" unless given), numbered after every one before."""
    return Heartbeat(group, incarnation, host, running, next(_NUMBERS) if sequence is None else sequence, runner)


def lease(generation=1, members=None, *, groups=None, ended=False, timeout_s=10.0, job="money") -> Lease:
    """The runner's lease, numbered after every one before (a copy of one is no news)."""
    return Lease(
        runner="host:1:abc",
        generation=generation,
        checkpoint=7 if generation else None,
        pipeline="spark_abs_examples.money:pipeline",
        job=job,
        settings='{"store": "file:///tmp/x"}',
        scale=None,
        groups=groups if groups is not None else {"legs": ["legs-0"], "accounts": ["accounts-0", "accounts-1"]},
        members=members or {},
        timeout_s=timeout_s,
        ended=ended,
        sequence=next(_NUMBERS),
    )


def test_silence_counts_only_while_one_reads_back_ones_own_events():
    clock = Clock()
    liveness = PeerSilence(10.0, clock=clock)
    liveness.watch("a")
    liveness.own()
    clock.advance(9, own=liveness)
    assert liveness.silent() == []
    clock.advance(2, own=liveness)
    assert liveness.silent() == ["a"]
    liveness.heard("a")
    assert liveness.silent() == []


def test_an_outage_silences_everyone_and_restores_nobody():
    clock = Clock()
    liveness = PeerSilence(10.0, clock=clock)
    liveness.watch("a")
    liveness.own()
    clock.advance(60)  # nothing read back: the broker (or this process) is away
    assert liveness.silent() == []
    liveness.own()  # back: the peer's silence starts over
    assert liveness.silent() == []
    clock.advance(9, own=liveness)
    assert liveness.silent() == []
    clock.advance(2, own=liveness)
    assert liveness.silent() == ["a"]


def test_lease_and_heartbeat_round_trip_through_control_events():
    original = lease(3, {"legs": "w1"})
    event = ControlEvent.decode(original.encode())
    assert event.kind is ControlKind.LEASE
    assert event == original
    heartbeat = beat("legs", "w1", "host-a", 3, runner="host:1:abc")
    assert ControlEvent.decode(heartbeat.encode()) == heartbeat


@pytest.mark.parametrize(
    "payload",
    [{}, {"generation": "x", "pipeline": "p", "job": "j", "settings": "{}", "groups": {}, "timeout_s": 1}],
)
def test_a_malformed_lease_is_a_clear_error(payload):
    with pytest.raises(ValueError, match="malformed lease from 'r'"):
        ControlEvent.decode(json.dumps({"kind": "lease", "checkpoint_id": 0, "task": "r", "payload": payload}).encode())


def test_a_group_runs_once_a_generation_a_second_worker_waits_as_standby(caplog):
    caplog.set_level(logging.INFO, logger="streaming")
    clock = Clock()
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=clock)
    assert groups.missing() == ["legs"]
    assert groups.on_heartbeat(beat("legs", "w1", "a", None), 1) is HeartbeatOutcome.JOINED
    assert groups.members == {"legs": "w1"}
    assert groups.on_heartbeat(beat("legs", "w2", "b", None), 1) is None
    assert groups.members == {"legs": "w1"} and groups.standby == {"legs": "w2"}
    assert any("standby" in line for line in caplog.messages)
    groups.drop("legs")  # w1 taken for dead: its standby runs the group
    assert groups.members == {"legs": "w2"} and groups.standby == {}


def test_a_silent_member_is_named_and_a_new_generation_restarts_its_clock():
    clock = Clock()
    groups = RemoteGroups({"legs": ["legs-0"], "accounts": ["accounts-0"]}, 10.0, clock=clock)
    groups.on_heartbeat(beat("legs", "w1", "a", None), 1)
    groups.on_heartbeat(beat("accounts", "w2", "b", None), 1)
    groups.own()
    for _ in range(11):
        clock.advance(1, own=groups)
        groups.on_heartbeat(beat("accounts", "w2", "b", 1), 1)
    assert groups.silent() == ["legs"]
    groups.drop("legs")
    groups.new_generation({"legs": ["legs-0"], "accounts": ["accounts-0", "accounts-1"]})
    assert groups.members == {"accounts": "w2"} and groups.missing() == ["legs"]
    assert groups.silent() == []


def test_a_member_that_stopped_the_generations_tasks_is_lost():
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=Clock())
    groups.on_heartbeat(beat("legs", "w1", "a", None), 4)
    assert groups.on_heartbeat(beat("legs", "w1", "a", None), 4) is None  # not started yet
    assert groups.on_heartbeat(beat("legs", "w1", "a", 4), 4) is None
    assert groups.on_heartbeat(beat("legs", "w1", "a", None), 4) is HeartbeatOutcome.LOST
    # restoring in place into the next generation is not a loss
    assert groups.on_heartbeat(beat("legs", "w1", "a", 4), 5) is None


def test_a_copy_of_an_earlier_heartbeat_is_no_news():
    """Someone who can write to the control topic appends a member's earlier
    heartbeat again: it says neither that the member stopped its tasks (the
    job would restore) nor that a silent one is alive."""
    clock = Clock()
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=clock)
    idle = beat("legs", "w1", "a", None, 1)
    groups.on_heartbeat(idle, 4)
    running = beat("legs", "w1", "a", 4, 2)
    assert groups.on_heartbeat(running, 4) is None
    assert groups.on_heartbeat(idle, 4) is None  # the copy: not LOST
    groups.own()
    clock.advance(11, own=groups)
    assert groups.on_heartbeat(running, 4) is None  # the copy again: the member stays silent
    assert groups.liveness.silent() == ["legs"]
    # its next heartbeat, stopped, is news
    assert groups.on_heartbeat(beat("legs", "w1", "a", None, 3), 4) is HeartbeatOutcome.LOST


def test_heartbeats_of_a_group_the_job_does_not_run_remotely_are_refused_once(caplog):
    caplog.set_level(logging.INFO, logger="streaming")
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=Clock())
    assert groups.on_heartbeat(beat("windows", "w9", "c", None), 1) is None
    assert groups.on_heartbeat(beat("windows", "w9", "c", None), 1) is None
    assert groups.members == {} and len(caplog.messages) == 1 and "'windows'" in caplog.messages[0]


def test_a_worker_starts_when_the_lease_names_it_and_restores_in_place_on_a_newer_generation():
    member = Membership("money", "legs", "w1", clock=Clock())
    assert member.on_lease(lease(1)) is None  # not a member yet: it waits (its heartbeats ask to join)
    action = member.on_lease(lease(1, {"legs": "w1"}))
    assert action is not None and action.kind is ActionKind.START and action.lease.generation == 1
    member.running = 1
    assert member.on_lease(lease(1, {"legs": "w1"})) is None
    action = member.on_lease(lease(2, {"legs": "w1"}))
    assert action.kind is ActionKind.START and action.lease.generation == 2


def test_tasks_stopped_in_a_generation_never_start_again_in_it():
    clock = Clock()
    member = Membership("money", "legs", "w1", clock=clock)
    assert member.on_lease(lease(1, {"legs": "w1"}, timeout_s=5.0)).kind is ActionKind.START
    member.running = 1
    member.own()
    clock.advance(6, own=member)
    assert member.check().kind is ActionKind.STOP  # the lease lapsed (the runner was away)
    member.running = None
    # the runner is back, still in generation 1: the others went on without these tasks, so they
    # stay stopped (the heartbeat says so, and the runner restores into generation 2)
    assert member.on_lease(lease(1, {"legs": "w1"}, timeout_s=5.0)) is None
    assert member.on_lease(lease(2, {"legs": "w1"}, timeout_s=5.0)).kind is ActionKind.START


@pytest.mark.parametrize(
    ("next_lease", "why"),
    [
        (lease(2, {"legs": "w2"}), "w2 runs group legs"),
        (lease(2), "no member yet"),
        (lease(2, ended=True), "the job runner stopped"),
        (dataclasses.replace(lease(2), note="checkpoint 5 is being rescaled"), "checkpoint 5 is being rescaled"),
        (lease(2, {"legs": "w1"}, groups={"all": ["legs-0"]}), "runs no group legs"),
    ],
)
def test_a_worker_that_is_no_longer_the_member_stops_its_tasks(next_lease, why):
    member = Membership("money", "legs", "w1", clock=Clock())
    member.running = 1
    action = member.on_lease(next_lease)
    assert action is not None and action.kind is ActionKind.STOP and why in action.reason


def test_a_worker_stops_its_tasks_when_the_runners_lease_lapses_while_the_topic_works():
    clock = Clock()
    member = Membership("money", "legs", "w1", clock=clock)
    member.on_lease(lease(1, {"legs": "w1"}, timeout_s=10.0))
    member.running = 1
    member.own()
    clock.advance(30)  # a broker outage: nothing read back, no lapse
    assert member.check() is None
    member.own()
    clock.advance(9, own=member)
    assert member.check() is None
    clock.advance(2, own=member)
    action = member.check()
    assert action is not None and action.kind is ActionKind.STOP and "no lease from the job runner" in action.reason


def test_a_copy_of_an_earlier_lease_is_no_news():
    """Copies of the runner's leases appended again by another writer: an
    ended one of an earlier generation stops nothing, and the current one
    again does not keep a lapsed runner alive."""
    clock = Clock()
    member = Membership("money", "legs", "w1", clock=clock)
    first = dataclasses.replace(lease(1, {"legs": "w1"}, ended=True), sequence=9)
    current = dataclasses.replace(lease(2, {"legs": "w1"}), sequence=3)
    assert member.on_lease(current).kind is ActionKind.START
    member.running = 2
    assert member.on_lease(first) is None  # an ended lease of generation 1: not this runner's end
    member.own()
    clock.advance(11, own=member)
    assert member.on_lease(current) is None  # the same lease again: no renewal
    assert member.check().kind is ActionKind.STOP
    # the runner's own next renewal is
    assert member.on_lease(dataclasses.replace(current, sequence=4)) is None and member.check() is None


def test_leases_of_another_job_are_not_followed():
    member = Membership("money", "legs", "w1", clock=Clock())
    assert member.on_lease(lease(1, {"legs": "w1"}, job="other")) is None
    assert member.lease is None


def test_a_worker_knows_when_the_job_runs_no_group_of_its_name():
    member = Membership("money", "sums", "w1", clock=Clock())
    member.on_lease(lease(1))
    assert member.unknown_group
    member.on_lease(lease(2, ended=True))  # a stopped runner's last lease names no groups to judge by
    assert not member.unknown_group


def test_the_runner_knows_when_every_member_stopped_its_tasks():
    groups = RemoteGroups({"legs": ["legs-0"], "accounts": ["accounts-0"]}, 10.0, clock=Clock())
    groups.on_heartbeat(beat("legs", "w1", "a", None), 1)
    groups.on_heartbeat(beat("accounts", "w2", "b", None), 1)
    groups.on_heartbeat(beat("legs", "w1", "a", 1), 1)
    groups.forget_reports()  # a pause asked for: nobody has answered yet
    assert groups.still_running() == ["accounts", "legs"]
    groups.on_heartbeat(beat("legs", "w1", "a", 1), 1)
    groups.on_heartbeat(beat("accounts", "w2", "b", None), 1)
    assert groups.still_running() == ["legs"]
    groups.on_heartbeat(beat("legs", "w1", "a", None), 1)
    assert groups.still_running() == []


def test_a_worker_of_the_runner_before_counts_as_running_until_it_answers_this_runner_stopped():
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=Clock(), runner="r2")
    groups.forget_reports()  # a new runner about to rescale: it pauses whoever is out there
    # still following the runner before, running its generation 3: no member, but the pause waits for it
    assert groups.on_heartbeat(beat("legs", "w1", "a", 3, runner="r1"), 0) is None
    assert groups.members == {} and groups.still_running() == ["legs"]
    # it heard this runner's lease and stopped: it answers this runner, joins, and runs nothing
    assert groups.on_heartbeat(beat("legs", "w1", "a", None, runner="r2"), 0) is HeartbeatOutcome.JOINED
    assert groups.still_running() == []


def test_after_a_runner_restarts_a_dead_workers_old_heartbeats_appended_again_are_no_news(caplog):
    """Runner r1 ran group legs on w1, which died with it.  Someone who can
    write to the control topic appends w1's old heartbeats again, in order,
    once runner r2 started.  Before heartbeats answered a runner, the first
    made w1 the member: w2, alive, waited as its standby, and the copies,
    numbered higher each time, kept w1 from going silent: no restore, no
    checkpoint, for good.  They answer r1, so r2 takes none of them."""
    caplog.set_level(logging.INFO, logger="streaming")
    old = [beat("legs", "w1", "a", 4, sequence=n, runner="r1") for n in range(1, 40)]
    clock = Clock()
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=clock, runner="r2")
    groups.own()
    assert [groups.on_heartbeat(copy, 5) for copy in old[:3]] == [None] * 3
    assert groups.members == {}
    assert groups.on_heartbeat(beat("legs", "w2", "b", None, sequence=1, runner="r2"), 5) is HeartbeatOutcome.JOINED
    assert groups.members == {"legs": "w2"} and groups.standby == {}
    for copy in old[3:]:
        clock.advance(1, own=groups)
        assert groups.on_heartbeat(copy, 5) is None
        assert groups.members == {"legs": "w2"}
    assert groups.silent() == ["legs"]  # w2 said nothing since: the copies kept no one alive
    # one line for the worker that answers another runner, not one per copy
    assert sum("answers runner r1" in line for line in caplog.messages) == 1


def test_a_heartbeat_or_lease_numbered_0_is_no_news():
    """Senders number from 1: a record numbered 0 (a copy with its number
    taken off, or a writer's own) is never news."""
    groups = RemoteGroups({"legs": ["legs-0"]}, 10.0, clock=Clock())
    assert groups.on_heartbeat(beat("legs", "w1", "a", None, sequence=0), 1) is None
    assert groups.members == {}
    member = Membership("money", "legs", "w1", clock=Clock())
    current = lease(2, {"legs": "w1"})
    assert member.on_lease(current).kind is ActionKind.START
    member.running = 2
    assert member.on_lease(dataclasses.replace(current, members={}, sequence=0)) is None  # not a STOP
