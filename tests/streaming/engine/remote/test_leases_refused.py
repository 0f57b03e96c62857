"""A remote worker runs only the pipeline its operator named: a lease nobody
signed with the job's key is not even read, and a signed one for another job
or pipeline is refused with the reason; nothing in a lease is imported."""

from __future__ import annotations

import threading

import pytest
from kafka import KafkaProducer

from streaming.adapters.kafka.admin import job_key
from streaming.adapters.kafka.control.events import Lease
from streaming.adapters.kafka.control.transport import ControlTopic, send_event
from streaming.engine.remote.member import check_lease, wait_for_lease
from streaming.errors import LeaseRefused

PIPELINE = "spark_abs_examples.money:pipeline"


def _lease(job: str, pipeline: str = PIPELINE) -> Lease:
    return Lease("runner", 1, None, pipeline, job, "{}", None, {"all": ["legs-0"]}, {}, 10.0)


def test_a_lease_for_another_job_or_pipeline_is_refused_saying_what_to_run():
    check_lease(_lease("orders"), "orders", PIPELINE)
    check_lease(_lease("orders", "money?accounts=10&partitions=2"), "orders", "money?partitions=2&accounts=10")
    with pytest.raises(LeaseRefused, match="lease is for job 'payments', not 'orders'"):
        check_lease(_lease("payments"), "orders", PIPELINE)
    with pytest.raises(LeaseRefused, match=r"runs pipeline 'money\?partitions=3'.*--pipeline 'money'"):
        check_lease(_lease("orders", "money?partitions=3"), "orders", "money")
    with pytest.raises(LeaseRefused, match="runs pipeline 'subprocess:run"):
        check_lease(_lease("orders", 'subprocess:run?args=["touch","x"]'), "orders", PIPELINE)


@pytest.mark.integration
def test_a_worker_waiting_for_its_runner_takes_no_lease_the_jobs_key_did_not_sign(connection, unique_name, tmp_path):
    job, marker = unique_name, tmp_path / "ran"
    control = ControlTopic(connection.kafka, job, job_key(connection, job))
    control.seek_to_end()
    # anyone who can write to the topic: a lease that would run a command, for no job in particular
    forged = _lease("", f'subprocess:run?args=["touch","{marker}"]')
    forger = KafkaProducer(**connection.kafka.client_options())
    forger.send(control.topic, value=forged.encode(), partition=0).get(10)
    forger.close()
    assert wait_for_lease(control, job, PIPELINE, stop=threading.Event(), timeout_s=4) is None
    assert control.rejected == {"unsigned": 1} and not marker.exists()
    # the runner's own lease, for another pipeline than this worker's: refused, nothing run
    runner = KafkaProducer(**connection.kafka.client_options())
    send_event(runner, control.topic, _lease(job, "money?partitions=3"), job_key(connection, job))
    runner.close()
    with pytest.raises(LeaseRefused, match="start it with the runner's pipeline"):
        wait_for_lease(control, job, PIPELINE, stop=threading.Event(), timeout_s=20)
    control.close()
