"""The job runner's worker processes: started with the job's pipeline,
settings and generation, told to restore in place on stdin, watched for
death, and stopped (SIGTERM, then SIGKILL of the whole process group, so a
worker's Spark JVM goes with it)."""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from streaming.api.config import MetricsSettings
from streaming.api.pipeline import Scale
from streaming.api.settings import JobSettings
from streaming.engine.worker.worker import EXIT_PIPELINE_ERROR, WORKER_PREFIX
from streaming.errors import ConfigError, JobFailed, SparkAbsError, failed_at
from streaming.waits import Deadline

__all__ = ["WorkerProcess", "WorkerSupervisor", "last_words"]


@dataclass
class WorkerProcess:
    name: str
    tasks: list[str]
    process: subprocess.Popen
    log_path: Path

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    @property
    def pipeline_error(self) -> bool:
        """Whether it stopped on an error in the pipeline, which no restore fixes."""
        return self.process.returncode == EXIT_PIPELINE_ERROR

    def exit_text(self) -> str:
        code = self.process.returncode
        if code is not None and code < 0:
            return f"signal {signal.Signals(-code).name}"
        if self.pipeline_error:
            return f"status {code} (an error in the pipeline)"
        return f"status {code}"

    def tail(self, lines: int = 8) -> str:
        """The last words of the worker's log (``last_words``), indented for a message."""
        try:
            with open(self.log_path, "rb") as log_file:
                log_file.seek(max(0, log_file.seek(0, os.SEEK_END) - _TAIL_BYTES))
                text = log_file.read().decode(errors="replace").splitlines()
        except OSError:
            return "  (no log)"
        return "\n".join(f"  | {line}" for line in last_words(text, lines))


# how much of the end of a worker's log its last words are looked for in
_TAIL_BYTES = 256 << 10
# what starts a line the worker itself said: its log's, or its last words on stderr
_WORKER_SAID = (WORKER_PREFIX, "worker: ")
# a line of a Java stack trace: "\tat org.apache...(File.java:12)", "\t... 12 more"
_JAVA_FRAME = re.compile(r"^\s+(at \S.*|\.\.\. \d+ more)$")
# an exception: Python's last traceback line, Java's first line of a trace or its cause
_EXCEPTION = re.compile(
    r"^([A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*|Exception in thread .*|Caused by: .*|: [\w.]+Exception.*)$"
)


def last_words(lines: list[str], count: int = 8) -> list[str]:
    """What a person needs of a dead worker's log: its last ``count``
    lines up to and ending with the last exception (Python's, whatever its
    class, or Java's; Java stack frames left out), after the last line the
    worker itself said when that is further up, and then what the worker
    itself said after it (``worker: <why>``, ``worker: exiting ...``),
    counting the other lines that followed."""
    kept = [line for line in lines if not _JAVA_FRAME.match(line)]
    raised = _exceptions(kept)
    end = raised[-1] + 1 if raised else len(kept)
    start = max(0, end - count)
    before = next((i for i in range(start - 1, -1, -1) if kept[i].startswith(_WORKER_SAID)), None)
    after = [i for i in range(end, len(kept)) if kept[i].startswith(_WORKER_SAID)][-3:]
    shown = ([kept[before], "..."] if before is not None else []) + kept[start:end]
    if after:
        shown += (["..."] if after[0] > end else []) + [kept[i] for i in after]
    rest = len(kept) - end - len(after)
    return shown + ([f"({rest} more line(s) after it in the log)"] if rest else [])


def _exceptions(lines: list[str]) -> list[int]:
    """Where ``lines`` say an exception: Java's first line of a trace or a
    cause, a line that names an ...Error or ...Exception, and the line that
    ends a Python traceback (its first line not indented), whatever the class."""
    found = []
    in_traceback = False
    for i, line in enumerate(lines):
        if line.startswith("Traceback (most recent call last):"):
            in_traceback = True
        elif in_traceback and line and not line[0].isspace():
            in_traceback = False
            found.append(i)
        elif _EXCEPTION.match(line):
            found.append(i)
    return found


class WorkerSupervisor:
    """The worker processes of one job: ``groups`` maps a worker's name to
    the tasks it runs; logs go to ``log_dir/worker-<name>-g<generation>.log``.
    Each serves its metrics as ``metrics.for_worker`` (its index) says."""

    def __init__(
        self,
        pipeline_ref: str,
        job: str,
        groups: Mapping[str, list[str]],
        settings: JobSettings,
        log_dir: Path,
        *,
        scale: Scale | None = None,
        metrics: MetricsSettings | None = None,
    ):
        self.pipeline_ref = pipeline_ref
        self.job = job
        self.groups = dict(groups)
        self.settings = settings
        self.log_dir = log_dir
        # task counts and topics other than the pipeline declares (a rescaled job)
        self.scale = scale
        self.metrics = metrics or MetricsSettings.off()
        if self.groups and self.metrics.port and self.metrics.port + len(self.groups) > 65535:
            raise ConfigError(
                f"run --metrics-port {self.metrics.port}: its {len(self.groups)} worker(s) take the ports after it, "
                f"past 65535; give a lower port, or 0 for free ones"
            )
        self.workers: dict[str, WorkerProcess] = {}

    def launch(self, generation: int, checkpoint_id: int | None, env: Mapping[str, str]) -> None:
        """Every group in ``generation`` from ``checkpoint_id``: a worker that
        still runs restores in place (its Spark stays up); the others start."""
        live = {name: w for name, w in self.workers.items() if w.alive}
        self.workers = {}
        for index, (name, tasks) in enumerate(self.groups.items()):
            if name in live and _tell(live[name].process, f"restore {generation} {checkpoint_id or 'none'}"):
                self.workers[name] = live[name]
                continue
            log_path = self.log_dir / f"worker-{name}-g{generation}.log"
            command = [
                sys.executable,
                "-m",
                "streaming.engine.worker.worker",
                "--pipeline",
                self.pipeline_ref,
                "--job",
                self.job,
                "--tasks",
                ",".join(tasks),
                "--settings",
                self.settings.to_json(),
                "--generation",
                str(generation),
                "--runner-pipe",  # the worker stops when this process ends and the pipe closes
            ]
            if checkpoint_id is not None:
                command += ["--restore", str(checkpoint_id)]
            if self.scale is not None:
                command += ["--scale", json.dumps(self.scale.to_json())]
            command += _metrics_options(self.metrics.for_worker(index))
            with open(log_path, "wb") as log_file:
                process = subprocess.Popen(
                    command,
                    stdin=subprocess.PIPE,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env=dict(env),
                    start_new_session=True,
                )
            self.workers[name] = WorkerProcess(name, tasks, process, log_path)

    def dead(self) -> list[WorkerProcess]:
        return [w for w in self.workers.values() if not w.alive]

    def death(self, job: str, log: logging.Logger | logging.LoggerAdapter) -> str | None:
        """Why the job must restore when one of its workers died (its exit and
        last lines logged), None while all live; a ``JobFailed`` when it
        stopped on an error in the pipeline, which every restore would meet
        again."""
        dead = self.dead()
        if not dead:
            return None
        worker = dead[0]
        log.info(
            "worker %s (tasks %s) exited with %s; last lines of %s:\n%s",
            worker.name,
            ", ".join(worker.tasks),
            worker.exit_text(),
            worker.log_path,
            worker.tail(),
        )
        if worker.pipeline_error:  # every restore would stop on it again
            raise JobFailed(
                f"job {job}: worker {worker.name} (tasks {', '.join(worker.tasks)}) stopped on an error "
                f"in the pipeline, which no restore can fix; fix it and run the job again "
                f"(its log: {worker.log_path}):\n{worker.tail(4)}"
            )
        # where a task failed, when it said (the runner stops a job failing there restore after restore)
        place = failed_at(worker.tail(40))
        if place is None:
            return f"worker {worker.name} died"
        task, channel, first, last, error = place
        return f"worker {worker.name} died: task {task} failed on {channel} offsets {first}..{last}: {error}"

    def worker_of(self, name: str) -> WorkerProcess:
        """The worker called ``name``, or the one running the task or stage ``name``."""
        if name in self.workers:
            return self.workers[name]
        for worker in self.workers.values():
            if any(task == name or task.rsplit("-", 1)[0] == name for task in worker.tasks):
                return worker
        raise SparkAbsError(
            f"no worker, task or stage called {name!r} (workers: {', '.join(sorted(self.workers)) or 'none'})"
        )

    def kill(self, name: str) -> None:
        """SIGKILL a worker (by its name, or a task or stage it runs) and its Spark JVM (a drill)."""
        _kill_group(self.worker_of(name).process)

    def kill_all(self) -> None:
        """SIGKILL every worker and its Spark JVM: a frozen or stuck worker
        takes no SIGTERM and no restore in place."""
        for worker in self.workers.values():
            _kill_group(worker.process)

    def stop_all(self, timeout_s: float = 15.0) -> None:
        for worker in self.workers.values():
            if worker.alive:
                # the worker stops its queries and its Spark JVM goes with it
                worker.process.send_signal(signal.SIGTERM)
        deadline = Deadline(timeout_s)
        for worker in self.workers.values():
            try:
                worker.process.wait(max(0.1, deadline.left()))
            except subprocess.TimeoutExpired:
                pass
            _kill_group(worker.process)
        self.workers.clear()


def _metrics_options(settings: MetricsSettings) -> list[str]:
    """A worker's command-line options for its metrics endpoint."""
    if settings.port is None:
        return ["--no-metrics"]
    return ["--metrics-host", settings.host, "--metrics-port", str(settings.port)]


def _tell(process: subprocess.Popen, command: str) -> bool:
    """Send a command line to a worker; False when it cannot take it (it died)."""
    if process.poll() is not None or process.stdin is None:
        return False
    try:
        process.stdin.write(f"{command}\n".encode())
        process.stdin.flush()
        return True
    except (BrokenPipeError, OSError):
        return False


def _kill_group(process: subprocess.Popen) -> None:
    """SIGKILL the worker and its Spark JVM (its own process group)."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()
