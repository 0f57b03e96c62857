"""Every topic name the engine makes (``streaming.api.topics``): built and
taken apart in one place, each the way back of the other."""

from __future__ import annotations

import pytest

from streaming.api.topics import (
    commits_topic,
    control_topic,
    control_topic_job,
    dead_letter_topic,
    stage_topic,
    writer_of,
)


def test_a_stages_topic_names_its_job_and_stage_and_a_generation_when_one_made_it():
    assert stage_topic("money", "legs") == "spark-abs.money.legs"
    assert stage_topic("money", "legs", 3) == "spark-abs.money.legs.g3"
    for generation in (None, 0, 3, 12):
        assert writer_of(stage_topic("money", "legs", generation), "money") == "legs"


@pytest.mark.parametrize(
    ("topic", "job", "writer"),
    [
        ("transfers", "money", None),  # an ingress topic
        ("spark-abs.other.legs", "money", None),  # another job's
        ("spark-abs.money.legs.gx", "money", "legs.gx"),  # not a generation: part of the stage's name
        ("spark-abs.money.a.g.b", "money", "a.g.b"),
    ],
)
def test_a_topic_of_no_stage_of_the_job_has_no_writer(topic, job, writer):
    assert writer_of(topic, job) == writer


def test_the_control_topic_names_its_job_and_gives_it_back():
    assert control_topic("money") == "spark-abs.money.control"
    assert control_topic_job(control_topic("money-demo-1a2b")) == "money-demo-1a2b"
    for other in ("spark-abs.money.legs", "money.control", "spark-abs..control", dead_letter_topic("money")):
        assert control_topic_job(other) is None


def test_dead_letters_and_a_sinks_commits():
    assert dead_letter_topic("money") == "spark-abs.money.dead-letters"
    assert commits_topic("money.balances") == "money.balances.commits"
