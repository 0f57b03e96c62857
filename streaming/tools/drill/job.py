"""The job a restore drill runs (``streaming.tools.drill.run``): its ``spark-abs
run`` process (``DrilledJob``: started, checked, drained, stopped), what its
snapshot store says (generation, restores, checkpoints completed), and the
processes of its workers on this machine (from /proc); on the local
cluster its remote worker groups, ``spark-abs worker`` processes the drill
runs, starting one again for a group it left with none, as a host's
process manager would (``WorkerHosts``)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore
from streaming.adapters.snapshots.format import GenerationStart
from streaming.adapters.snapshots.signing import UNSIGNED
from streaming.api.config import Connection, default_home
from streaming.api.settings import Mode, StateSnapshots
from streaming.engine import faults
from streaming.errors import ConfigError, SparkAbsError, parse_choice
from streaming.tools.drill.settings import DrillSettings
from streaming.waits import Deadline, WaitTimeout, poll_until

__all__ = [
    "processes_left",
    "DRILL_RETAIN",
    "MAX_RESTARTS",
    "RESTART_WINDOW_S",
    "REMOTE_HEARTBEAT_TIMEOUT_S",
    "DrilledJob",
    "WorkerHosts",
    "is_running",
    "job_processes",
    "job_worker_pids",
    "kill_group",
    "pid_of",
    "tail",
]

# checkpoints a drilled job keeps (``--retain``): see ``DrilledJob.start_runner``
DRILL_RETAIN = 10_000
# a drilled job's remote groups: silent this long is dead (tests/cluster's, against 15 s by default: a group
# killed costs its restore 7 s less)
REMOTE_HEARTBEAT_TIMEOUT_S = 8.0
# how often the drill starts a worker again for a remote group it left with none, at most, within RESTART_WINDOW_S
# (once per failure that struck the group; more is a worker that dies as it starts)
MAX_RESTARTS = 3
RESTART_WINDOW_S = 120.0


class DrilledJob:
    """The job under drill: its runner process (``spark-abs run``, its output
    in ``runner_log``), its fault file and its snapshot store.  ``settings``
    are its drill phase's (``DrillSettings``: the pipeline as
    ``module:attribute``, one mode, the store and the report directory
    resolved); ``remote_groups`` are run by ``spark-abs worker`` processes
    the drill starts (the local cluster)."""

    def __init__(
        self,
        connection: Connection,
        job: str,
        settings: DrillSettings,
        *,
        max_restores: int,
        remote_groups: Sequence[str] = (),
        heartbeat_timeout_s: float = REMOTE_HEARTBEAT_TIMEOUT_S,
        problems: list[str] | None = None,
    ):
        store_uri, report_dir = settings.store_uri, settings.report_dir
        if store_uri is None or report_dir is None:
            raise ConfigError("a drilled job needs its store and its report directory")
        self.connection = connection
        self.pipeline_ref = settings.pipeline
        self.job = job
        self.mode = parse_choice(Mode, settings.mode, "mode")
        self.interval_s = settings.interval_s
        self.state_snapshots = parse_choice(StateSnapshots, settings.state_snapshots, "state snapshots")
        self.delivery_timeout_s = settings.delivery_timeout_s
        self.store_uri = store_uri
        self.max_restores = max_restores
        # signed with the job's key (a unit test drives one without a connection)
        key = connection.store_key(job) if connection is not None else UNSIGNED
        self.store = SnapshotStore(open_store(store_uri, connection), job, key=key)
        self.log_dir = default_home() / "runs" / job
        report_dir.mkdir(parents=True, exist_ok=True)
        self.fault_file = report_dir / "faults"
        faults.arm(str(self.fault_file), [])
        self.runner: subprocess.Popen | None = None
        self.runner_log = report_dir / "runner.log"
        self._completed: list[int] = []  # checkpoints seen complete, ascending (completed)
        # remote groups (the local cluster): the runner starts no worker, the drill runs one per group
        self.heartbeat_timeout_s = heartbeat_timeout_s
        # how the job's tasks are grouped (`spark-abs run --workers`): per-stage or one
        self.workers = settings.workers or "per-stage"
        self.hosts: WorkerHosts | None = None
        if remote_groups:
            env = {**connection.as_env(), faults.FILE_ENV: str(self.fault_file)}
            self.hosts = WorkerHosts(
                job, self.pipeline_ref, remote_groups, env, report_dir / "workers", problems=problems
            )

    # ---- the runner process

    def start_runner(self, *extra: str) -> None:
        """Start ``spark-abs run`` for the job (``runner``); it restores when
        the store holds a checkpoint of the job."""
        command = self.runner_command(*extra)
        env = {
            **os.environ,
            **self.connection.as_env(),
            faults.FILE_ENV: str(self.fault_file),
            "PYTHONUNBUFFERED": "1",
        }
        with open(self.runner_log, "ab") as log:
            log.write(f"\n--- {time.strftime('%H:%M:%S')} {' '.join(command[2:])}\n".encode())
            log.flush()
            self.runner = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )

    def runner_command(self, *extra: str) -> list[str]:
        """The ``spark-abs run`` command line of the job; with remote groups it
        starts no worker (``--remote-workers``, the groups of ``workers``);
        with a delivery timeout of the drill's, that one."""
        remote = []
        if self.hosts is not None:
            remote = [
                "--workers",
                self.workers,
                "--remote-workers",
                "--heartbeat-timeout",
                f"{self.heartbeat_timeout_s:g}",
            ]
        return [
            sys.executable,
            "-m",
            "streaming.tools.cli",
            "run",
            self.pipeline_ref,
            "--store",
            self.store_uri,
            "--job",
            self.job,
            "--mode",
            self.mode,
            "--state-snapshots",
            self.state_snapshots,
            "--interval",
            str(self.interval_s),
            # every checkpoint of a drill of up to ~2.7 h (at 1 s) stays, so the drill can check that
            # none was lost; no more, or an unaligned job would copy its channel state instead of
            # keeping offset ranges (the default users get): Kafka's 7-day retention could not
            # promise to keep ranges for 100,000 checkpoints (TaskFactory._must_copy)
            "--retain",
            str(DRILL_RETAIN),
            # a fault during a restore makes two restores of one failure
            "--max-restores",
            str(self.max_restores),
            *remote,
            *([] if self.delivery_timeout_s is None else ["--delivery-timeout", f"{self.delivery_timeout_s:g}"]),
            *extra,
        ]

    def start_workers(self) -> None:
        """With remote groups: a ``spark-abs worker`` for each (they wait for the runner's lease)."""
        if self.hosts is not None:
            for group in self.hosts.groups:
                self.hosts.start(group)

    def tend(self) -> None:
        """What the drill does at every poll: fail when the runner exited; with
        remote groups, start a worker for a group the drill left with none, as
        a host's process manager would (``WorkerHosts.supervise``)."""
        self.check_runner()
        if self.hosts is not None:
            self.hosts.supervise()

    def worker_pids(self) -> list[int]:
        """The job's worker processes here: the runner's, or the remote groups' (each leads its process group)."""
        return self.hosts.pids() if self.hosts is not None else job_worker_pids(self.job)

    def check_runner(self) -> None:
        """Raise when the runner exited (it must run through the whole drill)."""
        if self.runner is not None and self.runner.poll() is not None:
            raise SparkAbsError(
                f"the job runner exited with status {self.runner.returncode} during the drill; "
                f"see {self.runner_log}:\n{tail(self.runner_log)}"
            )

    def drain(self) -> None:
        """Drain the running job (SIGUSR1): no restart, no new generation; it
        exits once every input record is processed and committed."""
        if self.runner is None:
            raise SparkAbsError(f"job {self.job}: no job runner to drain: the drill did not start one")
        self.runner.send_signal(signal.SIGUSR1)
        code = self.runner.wait(600)
        if code != 0:
            raise SparkAbsError(
                f"draining the job failed (status {code}); see {self.runner_log}:\n{tail(self.runner_log)}"
            )
        self.runner = None

    def stop(self) -> None:
        """Stop whatever of the job still runs: the runner (SIGINT, SIGKILL
        after 60 s), the remote workers (SIGTERM: each stops its Spark
        application) and every worker's process group."""
        if self.runner is not None and self.runner.poll() is None:
            self.runner.send_signal(signal.SIGINT)
            try:
                self.runner.wait(60)
            except subprocess.TimeoutExpired:
                self.runner.kill()
        if self.hosts is not None:
            self.hosts.stop()
        for pid in job_worker_pids(self.job):
            kill_group(pid)

    # ---- what the store says

    def generation(self) -> int:
        meta = self.quietly(self.store.read_job)
        return meta.generation if meta else 0

    def generation_of(self, checkpoint_id: int) -> int | None:
        """The generation that completed ``checkpoint_id`` (its manifest's; None while the store is down)."""
        manifest = self.quietly(lambda: self.store.read_manifest(checkpoint_id))
        return manifest.generation if manifest else None

    def restores(self) -> list[GenerationStart]:
        """Every generation's start the store records (none while it is down)."""
        meta = self.quietly(self.store.read_job)
        return list(meta.restores) if meta else []

    def completed(self) -> list[int]:
        """Checkpoints that have a manifest, ascending: those seen before, and
        of the checkpoints after the newest of them those whose manifest is
        there now.  One listing and a look at a few manifests, however many
        checkpoints the drill has made (``SnapshotStore.completed`` looks at
        every manifest, which a long drill polling twice a second cannot
        afford); the drill deletes no manifest.  While the store is down:
        those seen before."""
        newest = self._completed[-1] if self._completed else 0
        try:
            later = [c for c in self.quietly(self.store.checkpoints) or [] if c > newest]
            if later:
                fs = self.store.location.filesystem
                infos = fs.get_file_info([self.store.layout.manifest(c) for c in later])
                self._completed += [c for c, info in zip(later, infos) if info.type == pafs.FileType.File]
        except OSError:  # the S3 server down (a store outage)
            pass
        return list(self._completed)

    def quietly(self, read: Callable[[], Any]) -> Any:
        """A read of the store that may fail while it is down (a store outage)."""
        try:
            return read()
        except SparkAbsError:
            return None


# ---- the remote worker groups (the local cluster)


class WorkerHosts:
    """The job's remote worker groups as hosts would run them: ``spark-abs
    worker --job JOB --group GROUP`` processes, each in a session of its own
    (its Spark driver JVM in it), its output in ``log_dir/<group>-<n>.log``.
    A second process of a group waits as its standby.  ``supervise`` starts
    a process for a group the drill left with none (it killed the last, or
    a fault it armed did), as a host's process manager (systemd,
    Kubernetes) would, up to ``MAX_RESTARTS`` times a group within
    ``RESTART_WINDOW_S``; any other exit
    is a problem (in ``problems``, with the end of its log), and the group
    is not started again.  ``spawn`` starts one (a test's stand-in: command,
    log path, environment -> a ``Popen``)."""

    def __init__(
        self,
        job: str,
        pipeline_ref: str,
        groups: Sequence[str],
        env: Mapping[str, str],
        log_dir: Path,
        spawn: Callable[[list[str], Path, dict[str, str]], subprocess.Popen] | None = None,
        problems: list[str] | None = None,
    ):
        self.job = job
        self.pipeline_ref = pipeline_ref
        self.groups = list(groups)
        self.env = {**env, "PYTHONUNBUFFERED": "1"}
        self.log_dir = log_dir
        self.spawn = spawn or _spawn
        self.problems = [] if problems is None else problems
        self.processes: dict[str, list[subprocess.Popen]] = {g: [] for g in self.groups}
        self.logs: dict[int, Path] = {}  # pid -> its output
        self.killed: set[subprocess.Popen] = set()  # the workers the drill SIGKILLed
        self.seen: set[subprocess.Popen] = set()  # the workers whose exit supervise took in
        self.restarts: dict[str, list[float]] = {g: [] for g in self.groups}  # when each group was started again
        self.stopping = False

    def start(self, group: str) -> subprocess.Popen:
        """A worker for ``group``: its member when the group has none, else its standby."""
        started = self.processes[group]
        log_path = self.log_dir / f"{group}-{len(started) + 1}.log"
        command = [sys.executable, "-m", "streaming.tools.cli", "worker", "--job", self.job]
        command += ["--pipeline", self.pipeline_ref, "--group", group]
        process = self.spawn(command, log_path, {**os.environ, **self.env})
        started.append(process)
        self.logs[process.pid] = log_path
        return process

    def alive(self, group: str | None = None) -> list[subprocess.Popen]:
        """The processes still running, of ``group`` or of every group."""
        groups = self.groups if group is None else [group]
        return [p for g in groups for p in self.processes[g] if p.poll() is None]

    def pids(self) -> list[int]:
        return [p.pid for p in self.alive()]

    def process(self, incarnation: str) -> subprocess.Popen | None:
        """The running process whose incarnation (``host:pid:…``) that is, when it runs here."""
        pid = pid_of(incarnation)
        return next((p for p in self.alive() if p.pid == pid), None)

    def supervise(self) -> list[str]:
        """Take in the workers that exited since the last call: start one for
        each group the drill left with none (``_drills``), up to
        ``MAX_RESTARTS`` times a group within ``RESTART_WINDOW_S``; any
        other exit is a problem, with the end of its log.  The groups
        started again."""
        if self.stopping:
            return []
        started = []
        for group in self.groups:
            exited = [p for p in self.processes[group] if p not in self.seen and p.poll() is not None]
            self.seen.update(exited)
            for process in exited:
                if not self._drills(process):
                    self.problems.append(
                        f"worker {process.pid} of group {group} exited (status {process.returncode}) and the drill "
                        f"did not kill it; the end of {self.logs[process.pid]}:\n{tail(self.logs[process.pid])}"
                    )
            if not any(self._drills(p) for p in exited) or self.alive(group):
                continue
            now = time.monotonic()
            recent = self.restarts[group] = [t for t in self.restarts[group] if now - t < RESTART_WINDOW_S]
            if len(recent) >= MAX_RESTARTS:
                self.problems.append(
                    f"group {group} left with no worker: started again {MAX_RESTARTS} times within "
                    f"{RESTART_WINDOW_S:.0f} s already"
                )
                continue
            recent.append(now)
            self.start(group)
            started.append(group)
        return started

    def _drills(self, process: subprocess.Popen) -> bool:
        """Whether the drill ended ``process``: it killed it, or a fault it armed did."""
        if process in self.killed:
            return True
        return process.returncode == -signal.SIGKILL and "[fault] " in tail(self.logs[process.pid], 5)

    def kill(self, process: subprocess.Popen) -> None:
        """SIGKILL a worker and its Spark driver JVM (a lost host)."""
        self.killed.add(process)
        kill_group(process.pid)
        process.wait()

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM every worker (each stops its tasks and its Spark application), SIGKILL after ``timeout_s``."""
        self.stopping = True
        running = self.alive()
        for process in running:
            process.send_signal(signal.SIGTERM)
        deadline = Deadline(timeout_s)
        for process in running:
            try:
                process.wait(max(0.1, deadline.left()))
            except subprocess.TimeoutExpired:
                self.kill(process)


def _spawn(command: list[str], log_path: Path, env: dict[str, str]) -> subprocess.Popen:
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        return subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def pid_of(incarnation: str) -> int | None:
    """The pid in a worker's incarnation (``host:pid:random``, ``membership.incarnation``)."""
    try:
        return int(incarnation.rsplit(":", 2)[-2])
    except (IndexError, ValueError):
        return None


# ---- the processes of a job


def job_worker_pids(job: str) -> list[int]:
    """Worker processes of ``job`` that run on this machine (from /proc)."""
    return [pid for pid, (_, args) in _process_table().items() if _is_worker(args, job)]


def job_processes(job: str, groups: Iterable[int] = ()) -> list[int]:
    """Every process of ``job``'s workers: the workers (by their command
    line) and whatever runs in their process groups or in ``groups`` (the
    workers' Spark JVMs, which outlive a worker that died without stopping them)."""
    table = _process_table()
    groups = set(groups) | {pid for pid, (_, args) in table.items() if _is_worker(args, job)}
    return sorted(pid for pid, (group, _) in table.items() if group in groups)


def processes_left(job: str, groups: Iterable[int], bound_s: float) -> list[int]:
    """``job_processes`` once they ended, or what is left of them after
    ``bound_s`` (an orphan: the drill's problem, named by its caller)."""
    try:
        poll_until(lambda: not job_processes(job, groups), bound_s, f"the processes of job {job} ending", every_s=0.25)
    except WaitTimeout:
        pass
    return job_processes(job, groups)


def _process_table() -> dict[int, tuple[int, list[bytes]]]:
    """pid -> (process group, arguments) of every process we can see."""
    table = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            args = (entry / "cmdline").read_bytes().split(b"\0")
            group = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[2])
        except (OSError, ValueError, IndexError):
            continue
        table[int(entry.name)] = (group, args)
    return table


def _is_worker(args: list[bytes], job: str) -> bool:
    return b"streaming.engine.worker.worker" in args and _follows(args, b"--job", job.encode())


def _follows(args: list[bytes], option: bytes, value: bytes) -> bool:
    return any(a == option and b == value for a, b in zip(args, args[1:]))


def is_running(pid: int) -> bool:
    """Whether process ``pid`` is there and not a zombie (a worker its runner
    SIGKILLed stays a zombie until the runner reaps it)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state not in ("Z", "X")


def kill_group(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads, if it is still there."""
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def tail(path: Path, lines: int = 15) -> str:
    """The last ``lines`` lines of the log at ``path``."""
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
