"""The ACLs a job needs, computed from its pipeline: prefixed on what the job
names (its ``spark-abs.J.`` topics, ``spark-abs.J.`` transactional ids, Spark's
consumer groups), literal on what the pipeline names (ingress and sink topics),
nothing on ``*``.  The secured runtime grants exactly these
(``tests/e2e/test_kafka_sink.py`` runs a job on them)."""

from __future__ import annotations

from spark_abs_examples import money
from streaming.adapters.kafka.acls import Grant, job_grants
from streaming.api.topics import control_topic, transactional_id


def test_a_job_gets_prefixes_of_its_own_and_literal_grants_on_the_topics_its_pipeline_names():
    grants = job_grants(money.kafka_pipeline("j1"))
    by_name = {(g.resource, g.name): g for g in grants}
    assert not [g for g in grants if g.name == "*" or "ALL" in g.operations]
    own = by_name[("TOPIC", "spark-abs.j1.")]
    assert own.prefixed and set(own.operations) == {"CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "READ", "WRITE"}
    assert by_name[("TRANSACTIONAL_ID", "spark-abs.j1.")].prefixed
    # the prefixes cover the job's own names, and not those of a job whose name starts with j1
    for mine in (transactional_id("j1", "windows-0"), control_topic("j1")):
        assert mine.startswith("spark-abs.j1.")
    for theirs in (transactional_id("j1-other", "windows-0"), control_topic("j1-other")):
        assert not theirs.startswith("spark-abs.j1.")
    assert {g.name for g in grants if g.resource == "GROUP"} == {"spark-kafka-source-", "spark-kafka-relation-"}
    ingress = by_name[("TOPIC", "j1.transfers")]
    # the runner appends its barriers to the ingress partitions: it writes there too
    assert not ingress.prefixed and "WRITE" in ingress.operations and "DELETE" not in ingress.operations
    for sink in ("j1.windows", "j1.windows.commits"):
        assert not by_name[("TOPIC", sink)].prefixed and "WRITE" in by_name[("TOPIC", sink)].operations
    assert set(by_name[("CLUSTER", "kafka-cluster")].operations) == {"DESCRIBE", "IDEMPOTENT_WRITE"}
    # another job's prefix is not this one's
    assert ("TOPIC", "spark-abs.j2.") not in by_name
    assert all(
        "DELETE" in g.operations for g in job_grants(money.pipeline("j1"), cleanup=True) if g.resource == "TOPIC"
    )
    assert not [g for g in job_grants(money.pipeline("j1")) if g.name.endswith(".windows")]  # a Parquet sink


def test_a_grant_reads_as_kafka_acls_arguments():
    grant = Grant("TOPIC", "spark-abs.j1.", ("DESCRIBE_CONFIGS", "WRITE"), prefixed=True)
    assert grant.render("job") == (
        "--allow-principal User:job --operation DescribeConfigs --operation Write "
        "--topic spark-abs.j1. --resource-pattern-type prefixed"
    )
    assert (
        Grant("CLUSTER", "kafka-cluster", ("IDEMPOTENT_WRITE",))
        .render("job")
        .endswith("--operation IdempotentWrite --cluster")
    )
