"""What a command shows of the log: spark-abs's INFO lines (and its
warnings) on stdout after the command's prefix, everything else on stderr
with its time, level and logger; installed once, the prefix changed by a
second call, and the lines still reaching the root logger (caplog)."""

from __future__ import annotations

import logging
import subprocess
import sys

import pytest

from streaming import console

SCRIPT = """
import logging, sys
from streaming import console
console.install("[t] ", verbose="-v" in sys.argv)
console.install("[u] ")
logging.getLogger("streaming.tools.demo.run").info("checkpoint %d: done", 3)
logging.getLogger("benchmarks").warning("a run failed")
logging.getLogger("streaming.engine.task.stage_task").debug("a channel blocked")
logging.getLogger("kafka.conn").warning("connection refused")
logging.getLogger("py4j").info("not for the person")
"""


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", SCRIPT, *args], capture_output=True, text=True, timeout=60)


def test_spark_abs_lines_go_to_stdout_after_the_prefix_and_the_rest_to_stderr():
    done = _run()
    assert done.returncode == 0, done.stderr
    assert done.stdout == "[u] checkpoint 3: done\n[u] a run failed\n"
    assert "WARNING kafka.conn: connection refused" in done.stderr
    for shown_or_hidden in ("checkpoint 3", "a run failed", "not for the person", "a channel blocked"):
        assert shown_or_hidden not in done.stderr


def test_verbose_logs_every_debug_line_on_stderr_and_stdout_stays_the_same():
    done = _run("-v")
    assert done.stdout == "[u] checkpoint 3: done\n[u] a run failed\n"
    assert "DEBUG streaming.engine.task.stage_task: a channel blocked" in done.stderr
    assert "INFO py4j: not for the person" in done.stderr
    assert "checkpoint 3" not in done.stderr


@pytest.fixture
def installed():
    loggers = [logging.getLogger(name) for name in console.LOGGERS]
    before = [(logger, list(logger.handlers), logger.level) for logger in loggers]
    yield
    for logger, handlers, level in before:
        logger.handlers[:] = handlers
        logger.setLevel(level)


def test_installed_twice_a_line_shows_once_with_the_last_prefix_and_caplog_still_sees_it(installed, capsys, caplog):
    console.install("[spark-abs] ")
    console.install("[drill] ")
    caplog.set_level(logging.INFO, logger="streaming")
    logging.getLogger("streaming.tools.drill.run").info("job up")
    assert capsys.readouterr().out == "[drill] job up\n"
    assert [r.getMessage() for r in caplog.records] == ["job up"]
