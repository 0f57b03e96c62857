"""The command line as a user meets it: help that explains, and one clear line
(no traceback) when something is wrong."""

from __future__ import annotations

import os
import subprocess
import sys

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
    assert "fetch" in local.stdout and "--purge" in local.stdout
    worker = _run("worker", "--help")
    assert "--group" in worker.stdout and "standby" in worker.stdout and "lease" in worker.stdout
    run = _run("run", "--help")
    assert "--remote-workers" in run.stdout and "--heartbeat-timeout" in run.stdout


def test_status_of_a_runtime_never_started(tmp_path):
    done = _run("--home", str(tmp_path), "local", "status")
    assert done.returncode == 1
    assert "stopped" in done.stdout and "spark-abs local up" in done.stdout


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
    import pytest

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
