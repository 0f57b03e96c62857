"""The Kafka sink end to end, on the secured runtime (``local up --secure``:
SASL_SSL, SCRAM, ACLs on; the job as user ``spark-abs``, every client and
Spark's Kafka source given its credentials, and granted only the ACLs the
docs list for this job, prefixed on its own topics and transactional ids:
``local grant``; the input produced as another user; the windows written as
Avro whose schema the sink registers in the runtime's registry, which takes
only the runtime's user): a runner stopped before its first checkpoint
(the next one restores from the beginning, as generation 1: what generation
0 wrote is stale), windows committed in Kafka transactions, a worker killed
after the first checkpoint, and read_committed readers see every window
exactly once, as Spark SQL's reference says.  A fresh start under the same job name with another store is
refused: Kafka holds the job's earlier run.  And `spark-abs ui` of the
running job, in headless Chromium, shows its completed checkpoints, new ones
as they complete, one checkpoint's per-task detail as `checkpoints show`
computes it, and the generations its restores started.  The job's password
appears nowhere the job printed, logged or stored (its output, the
runtime's and the workers' logs, the store, the metrics page, the UI's
pages, Spark's event logs of every worker)."""

from __future__ import annotations

import dataclasses
import io
import json
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path

import fastavro
import pytest
from kafka import KafkaConsumer, TopicPartition
from selenium.webdriver.common.by import By
from ui_browser import chromium, rows, screenshot, section, served, wait, xpath_rows

from spark_abs_examples import money
from streaming.adapters.kafka.admin import create_topic, end_offsets, job_key
from streaming.adapters.serde.schema_registry import SchemaRegistry, registry_of
from streaming.api.config import KafkaAccess
from streaming.api.settings import JobSettings
from streaming.engine.job.operations import kill_worker, run_until_caught_up
from streaming.engine.job.runner import JobRunner, RunOptions
from streaming.errors import ConfigError, KafkaAccessError
from streaming.local import LocalRuntime
from streaming.local.kafka_security import ADMIN
from streaming.tools.checkpoints.inspection import Checkpoints
from streaming.tools.tables import path_table
from streaming.tools.ui.app import JobSource, create_app
from streaming.tools.ui.live import ControlWatch

pytestmark = pytest.mark.integration


def _committed(kafka: KafkaAccess, topic: str, registry: SchemaRegistry) -> list[dict]:
    """The committed windows, each value an Avro record in the Confluent wire format whose
    writer schema the registry gives by its id."""
    consumer = KafkaConsumer(
        **kafka.client_options(),
        isolation_level="read_committed",
        enable_auto_commit=False,
        consumer_timeout_ms=3000,
    )
    tp = TopicPartition(topic, 0)
    consumer.assign([tp])
    consumer.seek_to_beginning(tp)
    values = [r.value for r in consumer]
    consumer.close()
    rows = []
    for value in values:
        assert value[0] == 0, "the Confluent wire format: magic byte 0, then the schema's id"
        writer = fastavro.parse_schema(json.loads(registry.schema(int.from_bytes(value[1:5], "big"))))
        rows.append(fastavro.schemaless_reader(io.BytesIO(value[5:]), writer, None))
    return rows


def test_kafka_sink_is_exactly_once_across_a_restore(
    secure_connection, secure_runtime_settings, spark, unique_name, tmp_path, lines, capfd, monkeypatch
):
    connection = secure_connection
    job = f"ks-{unique_name[-8:]}"
    runtime = LocalRuntime(secure_runtime_settings)
    runtime.grant(money.kafka_pipeline(job, avro=True))
    assert connection.schema_registry and connection.schema_registry_user
    # the job user has what this job needs, nothing more: not another job's topics
    with pytest.raises(KafkaAccessError, match="did not authorize user 'spark-abs'"):
        create_topic(connection.kafka, f"spark-abs.other-{job}.control", 1)
    producer_access = runtime.services.kafka_security().access(connection.kafka.servers, ADMIN)
    # every worker's Spark writes an event log, as spark-defaults.conf tells the JVMs they launch
    conf_dir, events = tmp_path / "spark-conf", tmp_path / "events"
    conf_dir.mkdir()
    events.mkdir()
    (conf_dir / "spark-defaults.conf").write_text(
        f"spark.eventLog.enabled true\nspark.eventLog.dir file://{events}\nspark.eventLog.compress false\n"
    )
    monkeypatch.setenv("SPARK_CONF_DIR", str(conf_dir))
    settings = JobSettings(store=f"file://{tmp_path}/store", interval_s=0.7, max_records_per_batch=200)

    def job_runner(settings: JobSettings) -> JobRunner:
        return JobRunner(
            "spark_abs_examples.money:kafka_pipeline?avro=true",
            settings,
            connection,
            job=job,
            options=RunOptions(
                workers={"all": [t.name for t in money.kafka_pipeline(job, avro=True).tasks()]},
                log_dir=tmp_path / "runs",
            ),
        )

    kafka = connection.kafka
    runner = job_runner(dataclasses.replace(settings, interval_s=3600))
    topic, partitions = runner.pipeline.ingress[0].topic, runner.pipeline.ingress[0].partitions
    data = money.make_transfers(1000)
    try:
        runner.prepare()
        money.produce_transfers(producer_access, topic, data[:500], partitions, end=False)
        runner.start()
        # generation 0 writes records to every internal topic, then its runner stops before any checkpoint
        deadline = time.monotonic() + 180
        internal = runner.pipeline.internal_topics()
        while not all(sum(end_offsets(kafka, t, n).values()) for t, n in internal.items()):
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step()
    finally:
        runner.close()
    with pytest.raises(ConfigError, match=f"Kafka holds an earlier run of this job .* store file://{tmp_path}/other"):
        job_runner(dataclasses.replace(settings, store=f"file://{tmp_path}/other")).start()

    runner = job_runner(settings)
    try:
        runner.start()
        assert "restoring generation 1 from the beginning (no complete checkpoint) (restart)" in lines
        deadline = time.monotonic() + 180
        while not any(r.committed for r in runner.coordinator.completed()):
            assert time.monotonic() < deadline, "\n".join(lines)
            runner.step()
        kill_worker(runner, "all")
        money.produce_transfers(producer_access, topic, data[500:], partitions, end=True)
        run_until_caught_up(runner, 240)
        pages = _the_ui_shows_the_running_job(runner, settings.store, connection)
        assert runner.endpoints.server is not None
        with urllib.request.urlopen(f"http://{runner.endpoints.server.address}/metrics", timeout=10) as page:
            pages.append(page.read().decode())
    finally:
        runner.close()
    assert [r.generation for r in runner.restores] == [1, 2]
    rows = _committed(connection.kafka, f"{job}.windows", registry_of(connection))
    assert money.normalise_rows(rows) == money.expected_output(data)
    # and Spark SQL's reference, read from the secured broker as the job's user
    reference = money.money_reference(spark, runner.pipeline, connection.kafka)
    assert money.normalise_rows(rows) == money.normalise_rows(reference.to_dict("records"))
    printed = capfd.readouterr()
    # neither Kafka's password, nor the job secret its key comes from, nor the registry's password
    for secret in (
        connection.kafka.client_options()["sasl_plain_password"],
        secure_runtime_settings.job_secret_file.read_text().strip(),
        Path(connection.schema_registry_password_file).read_text().strip(),
    ):
        _the_password_is_nowhere(
            secret,
            texts=[printed.out, printed.err, "\n".join(lines), *pages],
            dirs=[tmp_path / "runs", tmp_path / "store", secure_runtime_settings.runtime_dir / "logs", events],
        )
    assert len(list(events.iterdir())) >= 2, "every generation's worker writes an event log"


def _the_password_is_nowhere(password: str, texts: list[str], dirs: list[Path]) -> None:
    """Neither ``texts`` nor any file under ``dirs`` holds ``password``."""
    assert len(password) >= 16
    assert all(password not in text for text in texts)
    files = [f for d in dirs for f in d.rglob("*") if f.is_file()]
    assert len(files) > 10, files
    holding = [f for f in files if password.encode() in f.read_bytes()]
    assert not holding, holding


@contextmanager
def _stepping(runner: JobRunner) -> Iterator[None]:
    """The runner stepped on a thread of its own while inside: the job goes on checkpointing."""
    stop, failed = threading.Event(), []

    def step() -> None:
        try:
            while not stop.is_set():
                runner.step()
        except Exception as exc:
            failed.append(exc)

    thread = threading.Thread(target=step, name="runner", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(60)
    assert not failed, failed


def _complete(history: list[list[str]]) -> set[int]:
    """The checkpoints the history shows complete and verifying."""
    return {int(row[0]) for row in history if row[7].startswith("yes")}


def _the_ui_shows_the_running_job(runner: JobRunner, store: str, connection) -> list[str]:
    """`spark-abs ui` of the job (live: its store and control topic) in headless Chromium; the pages it showed."""
    job = runner.job
    newest = max(r.checkpoint_id for r in runner.coordinator.completed())
    watch, pages = ControlWatch(connection.kafka, job, job_key(connection, job)), []
    app = create_app(JobSource(store, job, connection), refresh_s=2, watch=watch)
    with closing(watch), served(app) as url, chromium() as browser:
        # the history: every checkpoint the store holds complete, the runner's newest among them, charted
        browser.get(url + "/")
        history = rows(browser, "#history tbody tr")
        with Checkpoints.open(store, job) as checkpoints:
            complete = _complete(history)
            assert complete == set(checkpoints.store.completed()) and newest in complete, history
        assert browser.find_elements(By.CSS_SELECTOR, "#history-chart .main-svg"), "plotly drew no chart"
        # live: the page reloads itself and shows the checkpoints completed since
        with _stepping(runner):
            wait(
                browser,
                lambda d: max(_complete(rows(d, "#history tbody tr"))) > newest,
                90,
                what=f"a checkpoint completed after {newest}",
            )
        wait(browser, lambda d: d.find_elements(By.CSS_SELECTOR, "#history-chart .main-svg"))
        screenshot(browser, "ui-checkpoints.png")
        pages.append(browser.page_source)
        # one checkpoint's per-task detail, opened from the history: its tasks, and the barrier's
        # path through each as `checkpoints show` computes it
        shown = max(_complete(rows(browser, "#history tbody tr")))
        wait(browser, lambda d: d.find_element(By.CSS_SELECTOR, f"#history a[href='/checkpoints/{shown}']")).click()
        wait(browser, lambda d: d.find_elements(By.ID, "detail"))
        assert f"checkpoint {shown} of job {job}: generation 2" in browser.find_element(By.ID, "detail").text
        tasks = xpath_rows(browser, section("tasks"))
        assert [t[0] for t in tasks] == sorted(t.name for t in runner.pipeline.tasks())
        path = xpath_rows(browser, section("barrier path"))
        with Checkpoints.open(store, job) as checkpoints:
            computed = path_table(checkpoints.detail(shown))
        assert computed is not None and path == [[str(v) for v in row] for row in computed.rows]
        seen, acked = (computed.columns.index(c) for c in ("seen", "acked"))
        assert all(0 <= float(row[seen]) <= float(row[acked]) for row in path), path
        screenshot(browser, "ui-checkpoint-detail.png")
        pages.append(browser.page_source)
        # the generations: the fresh start, the restart before any checkpoint, the restore after the kill
        browser.get(url + "/generations")
        generations = rows(browser, "#generations tbody tr")
        pages.append(browser.page_source)
        assert [(g[0], g[2].split(" (")[0], g[4]) for g in generations] == [
            ("0", "fresh start", "-"),
            ("1", "restored from the beginning", "a runner started on the job"),
            ("2", f"restored from checkpoint {runner.restores[-1].checkpoint_id}", "a worker process died"),
        ], generations
    return pages
