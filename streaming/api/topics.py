"""Every Kafka topic name the engine makes, built and taken apart here only
(as Quix Streams' ``TopicManager`` owns its internal topics):

- ``spark-abs.<job>.<stage>``: a stage's output read by the next stage
  (``stage_topic``), ``spark-abs.<job>.<stage>.g<n>`` once a rescale or a
  pipeline change moved that edge to a topic of generation ``n``;
- ``spark-abs.<job>.control``: the job's control topic (``control_topic``);
- ``spark-abs.<job>.dead-letters``: the job's dead letters
  (``dead_letter_topic``);
- ``<topic>.commits``: a Kafka sink's commit markers, beside the sink's
  own topic (``commits_topic``).

A Kafka sink task's transactional id is named the same way,
``spark-abs.<job>.<task>`` (``transactional_id``): a job's name has no dot,
so the prefix ``spark-abs.<job>.`` (``job_prefix``) an ACL grants covers
the job's own topics and transactional ids and no other job's.

Ingress topics and a Kafka sink's topic are the user's, named in the
pipeline."""

from __future__ import annotations

__all__ = [
    "PREFIX",
    "commits_topic",
    "control_topic",
    "control_topic_job",
    "dead_letter_topic",
    "job_prefix",
    "stage_topic",
    "transactional_id",
    "writer_of",
]

# every topic of a job's own starts with this, then the job's name and a dot
PREFIX = "spark-abs."
_CONTROL = ".control"
_GENERATION = ".g"


def job_prefix(job: str) -> str:
    """What every topic and transactional id of job ``job``'s own starts with."""
    return f"{PREFIX}{job}."


def transactional_id(job: str, task: str) -> str:
    """The transactional id of job ``job``'s Kafka sink task ``task``."""
    return f"{job_prefix(job)}{task}"


def stage_topic(job: str, stage: str, generation: int | None = None) -> str:
    """The topic of ``stage``'s output in job ``job``; with ``generation``,
    the one a rescale or a change made in that generation."""
    base = f"{job_prefix(job)}{stage}"
    return base if generation is None else f"{base}{_GENERATION}{generation}"


def writer_of(topic: str, job: str) -> str | None:
    """The stage whose output ``topic`` is (``stage_topic``'s either form);
    None for a topic of no stage (an ingress topic)."""
    prefix = job_prefix(job)
    if not topic.startswith(prefix):
        return None
    name = topic[len(prefix) :]
    head, dot, tail = name.rpartition(_GENERATION)
    if dot and tail.isdigit():
        name = head
    return name


def control_topic(job: str) -> str:
    """Job ``job``'s control topic."""
    return f"{PREFIX}{job}{_CONTROL}"


def control_topic_job(topic: str) -> str | None:
    """The job whose control topic ``topic`` is, or None when it is none."""
    if topic.startswith(PREFIX) and topic.endswith(_CONTROL) and len(topic) > len(PREFIX) + len(_CONTROL):
        return topic[len(PREFIX) : -len(_CONTROL)]
    return None


def dead_letter_topic(job: str) -> str:
    """Job ``job``'s dead-letter topic."""
    return f"{job_prefix(job)}dead-letters"


def commits_topic(sink_topic: str) -> str:
    """The commit markers' topic of a Kafka sink writing to ``sink_topic``."""
    return f"{sink_topic}.commits"
