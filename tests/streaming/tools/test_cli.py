"""The command line as a user meets it: help that explains, and one clear line
(no traceback) when something is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from streaming.adapters.snapshots import UNSIGNED
from streaming.local.processes import free_port


def _run(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streaming.tools.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def test_help_explains_the_commands():
    done = _run("--help")
    assert done.returncode == 0
    for word in ("local", "smoke", "simulate", "connection.json"):
        assert word in done.stdout
    local = _run("local", "--help")
    assert "fetch" in local.stdout and "--purge" in local.stdout and "--registry" in local.stdout
    worker = _run("worker", "--help")
    assert "--group" in worker.stdout and "standby" in worker.stdout and "lease" in worker.stdout
    run = _run("run", "--help")
    assert "--remote-workers" in run.stdout and "--heartbeat-timeout" in run.stdout


def test_status_of_a_runtime_never_started(tmp_path):
    done = _run("--home", str(tmp_path), "local", "status")
    assert done.returncode == 1
    assert "stopped" in done.stdout and "spark-abs local up" in done.stdout
    # the schema registry is started on demand: never built here, and not a service that is down
    assert "not built" in done.stdout and "local up --registry" in done.stdout


def test_an_unreachable_broker_is_one_clear_line(tmp_path):
    closed = free_port()
    env = {
        "SPARK_ABS_KAFKA_BOOTSTRAP": f"127.0.0.1:{closed}",
        "SPARK_ABS_S3_ENDPOINT": "http://127.0.0.1:9",
        "SPARK_ABS_S3_ACCESS_KEY": "a",
        "SPARK_ABS_S3_SECRET_KEY": "b",
        "SPARK_ABS_S3_BUCKET": "bucket",
    }
    done = _run("--home", str(tmp_path), "smoke", env=env)
    assert done.returncode == 2
    assert f"no Kafka broker answers at 127.0.0.1:{closed}" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_malformed_setting_is_named(tmp_path):
    env = {
        "SPARK_ABS_KAFKA_BOOTSTRAP": "h:1",
        "SPARK_ABS_S3_ENDPOINT": "not-a-url",
        "SPARK_ABS_S3_ACCESS_KEY": "a",
        "SPARK_ABS_S3_SECRET_KEY": "b",
        "SPARK_ABS_S3_BUCKET": "x",
    }
    done = _run("--home", str(tmp_path), "smoke", env=env)
    assert done.returncode == 2
    assert "SPARK_ABS_S3_ENDPOINT" in done.stderr and "Traceback" not in done.stderr


def test_the_job_options_default_to_the_job_settings_defaults():
    from streaming.api.settings import JobSettings
    from streaming.tools.cli import build_parser

    defaults = JobSettings(store="file:///s")
    args = build_parser().parse_args(["run", "orders:orders", "--store", "file:///s"])
    assert JobSettings(store=args.store, mode=args.mode, in_flight=args.in_flight) == defaults
    assert (args.interval, args.retain) == (defaults.interval_s, defaults.retain)
    assert (args.segment_ms, args.state_memory) == (defaults.segment_ms, defaults.state_memory_bytes)
    gc = build_parser().parse_args(["checkpoints", "gc", "--store", "file:///s", "--job", "orders"])
    assert gc.retain == defaults.retain


def test_a_memory_budget_or_segment_time_that_cannot_work_is_refused_with_its_name():

    from streaming.api.settings import JobSettings
    from streaming.errors import ConfigError

    with pytest.raises(ConfigError, match="state_memory_bytes must be at least 1"):
        JobSettings(store="file:///s", state_memory_bytes=0)
    for bad in (0, float("inf"), float("nan")):
        with pytest.raises(ConfigError, match="segment_ms must be positive and finite"):
            JobSettings(store="file:///s", segment_ms=bad)


def test_runs_are_paced_in_time_only_where_checkpoints_are_announced():
    from streaming.api.settings import JobSettings
    from streaming.engine.worker.wiring import segment_budget_ms

    paced = {
        mode: segment_budget_ms(
            JobSettings(
                store="file:///s",
                mode=mode,
                segment_ms=25,
                **({"alignment_timeout_ms": 100} if mode == "aligned-timeout" else {}),
            )
        )
        for mode in ("aligned", "unaligned", "aligned-timeout", "at-least-once")
    }
    assert paced == {"aligned": None, "unaligned": 25, "aligned-timeout": 25, "at-least-once": None}


def _store_with_jobs(tmp_path, *jobs: str) -> str:
    from streaming.adapters.objects import open_store
    from streaming.adapters.snapshots import SnapshotStore

    uri = f"file://{tmp_path}/store"
    for job in jobs:
        with SnapshotStore(open_store(uri), job, key=UNSIGNED) as store:
            store.first_generation()
    return uri


def test_a_job_the_store_does_not_have_is_an_error_that_lists_the_jobs_it_has(tmp_path):
    uri = _store_with_jobs(tmp_path, "orders", "payments")
    for command in (("checkpoints", "list"), ("checkpoints", "verify"), ("checkpoints", "gc"), ("state", "1")):
        done = _run("--home", str(tmp_path), *command, "--store", uri, "--job", "ordres")
        assert done.returncode == 2, (command, done.stdout, done.stderr)
        assert "job 'ordres' has no history or checkpoints" in done.stderr
        assert (
            "jobs in the store: orders, payments" in done.stderr
            and "did you mean 'orders'?" in done.stderr
            and "Traceback" not in done.stderr
        )
    assert not (tmp_path / "store" / "ordres").exists()
    assert _run("--home", str(tmp_path), "checkpoints", "list", "--store", uri, "--job", "orders").returncode == 0


def test_a_store_that_does_not_exist_is_an_error_and_is_not_made(tmp_path):
    missing = tmp_path / "no-such-store"
    done = _run("--home", str(tmp_path), "checkpoints", "list", "--store", f"file://{missing}", "--job", "orders")
    assert done.returncode == 2
    assert f"there is no directory {missing}" in done.stderr and "--store" in done.stderr
    assert not missing.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    done = _run("--home", str(tmp_path), "checkpoints", "verify", "--store", f"file://{empty}", "--job", "orders")
    assert done.returncode == 2 and "it holds no job at all (is --store right?)" in done.stderr


def test_file_scheme_with_two_slashes_is_refused_with_the_fix(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "streaming.tools.cli", "--home", str(tmp_path), "checkpoints", "list"]
        + ["--store", "file://mystore", "--job", "orders"],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,  # where file://mystore would have put it
        env={**os.environ, "PYTHONPATH": os.pathsep.join((os.getcwd(), os.environ.get("PYTHONPATH", "")))},
    )
    assert done.returncode == 2
    assert "'mystore' is not read as a directory" in done.stderr
    assert "file:///path/to/mystore" in done.stderr and "Traceback" not in done.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing made in the current directory


def test_job_settings_refuse_a_file_store_that_names_a_host():

    from streaming.api.settings import JobSettings
    from streaming.errors import ConfigError

    with pytest.raises(ConfigError, match="three slashes"):
        JobSettings(store="file://checkpoints")
    assert JobSettings(store="file://localhost/tmp/x").store == "file://localhost/tmp/x"
    assert JobSettings(store="file:///tmp/x").store == "file:///tmp/x"


@pytest.mark.integration
def test_a_worker_whose_runner_never_comes_gives_up_after_its_bound_and_leaves_no_topic(connection, unique_name):
    from streaming.adapters.kafka.control.transport import control_jobs
    from streaming.api.topics import control_topic

    job = f"typo-{unique_name}"
    done = _run(
        "worker",
        "--job",
        job,
        "--pipeline",
        "support.pipelines:bad_spark_pipeline",
        "--group",
        "all",
        "--wait-for-runner",
        "3",
        env=connection.as_env(),
    )
    assert done.returncode == 2, done.stderr
    said = done.stdout + done.stderr
    assert f"job {job!r} has no control topic on this Kafka" in said
    assert "waiting up to 3 s (--wait-for-runner)" in said
    assert f"no runner of job {job!r} published its lease on {control_topic(job)} in 3 s" in done.stderr
    assert "Traceback" not in said
    # the wait made the control topic, and took it away again (Kafka deletes a topic in the background)
    deadline = time.monotonic() + 30
    while job in control_jobs(connection.kafka) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert job not in control_jobs(connection.kafka)
    negative = _run("worker", "--job", job, "--pipeline", "x:y", "--group", "all", "--wait-for-runner", "-1")
    assert negative.returncode == 2 and "--wait-for-runner -1: give seconds >= 0" in negative.stderr


def test_gc_deletes_nothing_without_the_jobs_secret_and_says_how_to_give_it(tmp_path):
    from streaming.adapters.objects import open_store
    from streaming.adapters.snapshots import SnapshotStore
    from streaming.api.job_key import JobKey

    secret = "a-job-secret-of-more-than-32-characters"
    uri = f"file://{tmp_path}/store"
    with SnapshotStore(open_store(uri), "orders", key=JobKey.store_key(secret, "orders")) as store:
        store.first_generation()
    gc = ("checkpoints", "gc", "--store", uri, "--job", "orders")
    unset = {"SPARK_ABS_JOB_SECRET": "", "SPARK_ABS_JOB_SECRET_FILE": ""}
    done = _run("--home", str(tmp_path), *gc, env=unset)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert "without the job's secret" in done.stderr and "SPARK_ABS_JOB_SECRET_FILE" in done.stderr
    assert "--dry-run" in done.stderr
    done = _run("--home", str(tmp_path), *gc, env={**unset, "SPARK_ABS_JOB_SECRET": secret})
    assert done.returncode == 0, done.stderr
