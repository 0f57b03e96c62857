"""The job a restore drill runs (``streaming.tools.drill``): its ``spark-abs
run`` process (``DrilledJob``: started, checked, drained, stopped), what its
snapshot store says (generation, restores, checkpoints completed), and the
processes of its workers on this machine (from /proc)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import SnapshotStore
from streaming.api.config import Connection, default_home
from streaming.api.settings import Mode
from streaming.engine import faults
from streaming.errors import SparkAbsError

__all__ = ["DRILL_RETAIN", "DrilledJob", "job_processes", "job_worker_pids", "kill_group", "tail"]

# checkpoints a drilled job keeps (``--retain``): see ``DrilledJob.start_runner``
DRILL_RETAIN = 10_000


class DrilledJob:
    """The job under drill: its runner process (``spark-abs run``, its output
    in ``runner_log``), its fault file and its snapshot store."""

    def __init__(
        self,
        connection: Connection,
        *,
        pipeline_ref: str,
        job: str,
        mode: Mode,
        interval_s: float,
        store_uri: str,
        report_dir: Path,
        max_restores: int,
        state_snapshots: str = "full",
    ):
        self.connection = connection
        self.pipeline_ref = pipeline_ref
        self.job = job
        self.mode = mode
        self.interval_s = interval_s
        self.state_snapshots = state_snapshots
        self.store_uri = store_uri
        self.max_restores = max_restores
        self.store = SnapshotStore(open_store(store_uri, connection), job)
        self.log_dir = default_home() / "runs" / job
        report_dir.mkdir(parents=True, exist_ok=True)
        self.fault_file = report_dir / "faults"
        faults.arm(str(self.fault_file), [])
        self.runner: subprocess.Popen | None = None
        self.runner_log = report_dir / "runner.log"
        self._completed: list[int] = []  # checkpoints seen complete, ascending (completed)

    # ---- the runner process

    def start_runner(self, *extra: str) -> None:
        """Start ``spark-abs run`` for the job (``runner``); it restores when
        the store holds a checkpoint of the job."""
        command = [
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
            *extra,
        ]
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
        self.runner.send_signal(signal.SIGUSR1)
        code = self.runner.wait(600)
        if code != 0:
            raise SparkAbsError(
                f"draining the job failed (status {code}); see {self.runner_log}:\n{tail(self.runner_log)}"
            )
        self.runner = None

    def stop(self) -> None:
        """Stop whatever of the job still runs: the runner (SIGINT, SIGKILL
        after 60 s) and every worker's process group."""
        if self.runner is not None and self.runner.poll() is None:
            self.runner.send_signal(signal.SIGINT)
            try:
                self.runner.wait(60)
            except subprocess.TimeoutExpired:
                self.runner.kill()
        for pid in job_worker_pids(self.job):
            kill_group(pid)

    # ---- what the store says

    def generation(self) -> int:
        meta = self.quietly(self.store.read_job)
        return meta.generation if meta else 0

    def restores(self) -> list[dict]:
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
    return b"streaming.engine.worker" in args and _follows(args, b"--job", job.encode())


def _follows(args: list[bytes], option: bytes, value: bytes) -> bool:
    return any(a == option and b == value for a, b in zip(args, args[1:]))


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
