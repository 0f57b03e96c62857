"""What the runner shows of a dead worker's log: its last lines ending with
the exception, not the tail of a Java stack trace."""

from __future__ import annotations

import subprocess

from streaming.engine.job.supervisor import WorkerProcess, last_words

PYTHON_THEN_JAVA = """\
[worker] worker g0: tasks legs-0, windows-0 running
26/11/27 09:12:40 INFO MicroBatchExecution: Streaming query made progress
Traceback (most recent call last):
  File "/app/streaming/engine/worker/worker.py", line 540, in main
    worker.serve()
  File "/app/operators/keyed.py", line 91, in merge_partials
    raise ValueError("amount is not a number: 'lots'")
ValueError: amount is not a number: 'lots'
26/11/27 09:12:42 ERROR Utils: Uncaught exception in thread shutdown-hook-0
java.lang.InterruptedException
\tat java.base/java.lang.Object.wait(Native Method)
\tat org.apache.spark.util.Utils$.tryLogNonFatalError(Utils.scala:1300)
\tat jdk.proxy3/jdk.proxy3.$Proxy58.call(Unknown Source)
\t... 12 more
"""


def test_the_last_lines_end_with_the_last_exception_without_java_frames():
    words = last_words(PYTHON_THEN_JAVA.splitlines(), 4)
    assert words == [
        "[worker] worker g0: tasks legs-0, windows-0 running",
        "...",
        "    raise ValueError(\"amount is not a number: 'lots'\")",
        "ValueError: amount is not a number: 'lots'",
        "26/11/27 09:12:42 ERROR Utils: Uncaught exception in thread shutdown-hook-0",
        "java.lang.InterruptedException",
    ]
    assert not any(line.lstrip().startswith(("at ", "... ")) for line in last_words(PYTHON_THEN_JAVA.splitlines()))


def test_lines_after_the_exception_are_counted_and_a_log_without_one_shows_its_end():
    lines = ["[worker] starting", "Traceback (most recent call last):", "KeyError: 'k'", "a", "b"]
    assert last_words(lines, 2) == [
        "[worker] starting",
        "...",
        "Traceback (most recent call last):",
        "KeyError: 'k'",
        "(2 more line(s) after it in the log)",
    ]
    assert last_words(lines, 8) == [*lines[:3], "(2 more line(s) after it in the log)"]
    quiet = ["[worker] tasks running", "26/11/27 INFO progress", "26/11/27 INFO progress"]
    assert last_words(quiet, 2) == ["[worker] tasks running", "...", "26/11/27 INFO progress", "26/11/27 INFO progress"]


def test_a_dead_workers_tail_reads_its_log(tmp_path):
    log = tmp_path / "worker-all-g0.log"
    log.write_text(PYTHON_THEN_JAVA)
    process = subprocess.Popen(["true"])
    process.wait()
    tail = WorkerProcess("all", ["legs-0"], process, log).tail(3)
    assert tail.splitlines()[-1] == "  | java.lang.InterruptedException"
    assert WorkerProcess("all", [], process, tmp_path / "missing.log").tail() == "  (no log)"


def test_what_the_worker_said_after_the_exception_ends_its_last_words():
    lines = [
        "[worker] worker g1: tasks legs-0 running",
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired",
        "26/11/27 09:12:42 INFO SparkContext: Invoking stop()",
        "26/11/27 09:12:42 INFO SparkContext: Successfully stopped SparkContext",
        "worker: Kafka answered no send to spark-abs.money.control in 120 s (delivery_timeout_s)",
        "worker: exiting with status 1; the job runner restores the job",
    ]
    words = last_words(lines, 2)
    assert words == [
        "[worker] worker g1: tasks legs-0 running",
        "org.apache.kafka.common.errors.TimeoutException: Timeout of 60000ms expired",
        "...",
        "worker: Kafka answered no send to spark-abs.money.control in 120 s (delivery_timeout_s)",
        "worker: exiting with status 1; the job runner restores the job",
        "(2 more line(s) after it in the log)",
    ]


def test_a_python_traceback_ends_at_its_exception_whatever_its_class():
    lines = [
        "Traceback (most recent call last):",
        '  File "/app/streaming/engine/job/coordinator.py", line 10, in complete',
        "    raise ManifestNotWritten(why)",
        "streaming.errors.ManifestNotWritten: checkpoint 7: the store refused the manifest",
        "26/11/27 09:12:42 INFO ShutdownHookManager: Shutdown hook called",
    ]
    assert last_words(lines, 2) == [
        "    raise ManifestNotWritten(why)",
        "streaming.errors.ManifestNotWritten: checkpoint 7: the store refused the manifest",
        "(1 more line(s) after it in the log)",
    ]
