"""Where each file of a job's checkpoints lives (see the package docstring):
names percent-encoded into paths, checkpoint directories zero-padded so
listings sort."""

from __future__ import annotations

import re
from urllib.parse import quote

from streaming.adapters.objects import StoreLocation

__all__ = ["MANIFEST", "TASK", "JOB", "CHECKPOINT_DIR", "Layout", "check_part_path", "checkpoint_dir_name", "escape"]

MANIFEST = "_MANIFEST.json"
TASK = "_TASK.json"
JOB = "_JOB.json"
CHECKPOINT_DIR = re.compile(r"chk-(\d+)$")
# a part's file name as ``escape`` makes it: percent-encoded, so no "/", "\\" or ":"
_PART_FILE = re.compile(r"[A-Za-z0-9_.~%-]+\.parquet")


def checkpoint_dir_name(checkpoint_id: int) -> str:
    """``chk-00000012``: the directory of checkpoint 12."""
    return f"chk-{checkpoint_id:08d}"


def escape(name: str, what: str) -> str:
    """``name`` as one path component; a ValueError for a name that cannot be one."""
    if not isinstance(name, str) or name in ("", ".", ".."):
        raise ValueError(f"{what} name {name!r} cannot be used as a file name")
    return quote(name, safe="")


def check_part_path(task: str, kind: str, path: str) -> None:
    """A ValueError naming ``path`` unless it is where this layout puts a
    part of ``task`` of ``kind`` (``state`` or ``channels``):
    ``<task>/<kind>/<file>.parquet``, relative to the checkpoint's directory
    (so a manifest cannot make a restore read outside it: no ``..``, no
    absolute path, no scheme, no other task's directory)."""
    parts = path.split("/")
    if len(parts) != 3 or parts[0] != escape(task, "task") or parts[1] != kind or not _PART_FILE.fullmatch(parts[2]):
        raise ValueError(
            f"part path {path!r} of task {task} is not one the layout writes "
            f"({escape(task, 'task')}/{kind}/<file>.parquet, inside the checkpoint's directory)"
        )


class Layout:
    """The paths of job ``job``'s files in ``location``."""

    def __init__(self, location: StoreLocation, job: str):
        self.job_dir = location.path(escape(job, "job"))

    @property
    def job_file(self) -> str:
        return f"{self.job_dir}/{JOB}"

    @property
    def checkpoints_dir(self) -> str:
        return f"{self.job_dir}/checkpoints"

    def checkpoint_dir(self, checkpoint_id: int) -> str:
        return f"{self.checkpoints_dir}/{checkpoint_dir_name(checkpoint_id)}"

    def manifest(self, checkpoint_id: int) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}/{MANIFEST}"

    def task_dir(self, checkpoint_id: int, task: str) -> str:
        return f"{self.checkpoint_dir(checkpoint_id)}/{escape(task, 'task')}"

    def task_file(self, checkpoint_id: int, task: str) -> str:
        return f"{self.task_dir(checkpoint_id, task)}/{TASK}"

    def part(self, checkpoint_id: int, relative: str) -> str:
        """A part's path from its path relative to the checkpoint directory."""
        return f"{self.checkpoint_dir(checkpoint_id)}/{relative}"

    @staticmethod
    def link_relative(task: str, name: str, kind: str, step: int) -> str:
        """``<task>/state/<name>.<kind>-<step>.parquet``: a link of a state
        chain, ``step`` its place in the chain."""
        return f"{escape(task, 'task')}/state/{escape(name, 'table')}.{kind}-{step}.parquet"

    @staticmethod
    def part_relative(task: str, kind: str, name: str) -> str:
        """``<task>/<kind>/<name>.parquet``, ``kind`` being ``state`` or ``channels``."""
        what = "channel" if kind == "channels" else "table"
        return f"{escape(task, 'task')}/{kind}/{escape(name, what)}.parquet"
