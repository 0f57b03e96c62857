"""Fault injection for restore drills and the end-to-end tests: a worker
kills itself with SIGKILL (no clean-up, like a lost machine) at a named point.

``SPARK_ABS_FAULT`` holds ``<task>:<point>:<checkpoint>:<generation>`` entries,
comma-separated; ``*`` matches any checkpoint.  Points:

- ``mid_batch``: halfway through the first micro-batch that arrives once the
  task has started checkpoint n;
- ``during_alignment``: when checkpoint n blocks a channel (its barrier came
  there first; the task waits for the others);
- ``during_upload``: while checkpoint n's snapshot is being written;
- ``during_copy``: while checkpoint n's in-flight records are read from Kafka
  into the snapshot (unaligned checkpoints that copy channel state);
- ``before_sink_commit``: after checkpoint n's manifest, before the sink commits;
- ``during_restore``: while restoring checkpoint n, after loading its snapshot;
- ``stuck_send``: not a kill: the task's thread blocks for good where it
  sends its records to Kafka before forwarding barrier n (or acknowledging
  it), as a send to a broker that never answers would; the process stays
  alive and keeps publishing progress.

The generation makes a fault fire once: the restored run has the next one.

``SPARK_ABS_FAULT_FILE`` names a file holding entries in the same form, read
again whenever it changes: a drill arms a fault in a running worker by
writing it there (``spark-abs drill``)."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Callable

import pyarrow as pa

from streaming.private_files import write_atomically

__all__ = ["ENV", "FILE_ENV", "HANGS", "POINTS", "arm", "parse", "point", "wrap_batch"]

log = logging.getLogger(__name__)

ENV = "SPARK_ABS_FAULT"
FILE_ENV = "SPARK_ABS_FAULT_FILE"
POINTS = (
    "mid_batch",
    "during_alignment",
    "during_upload",
    "during_copy",
    "before_sink_commit",
    "during_restore",
    "stuck_send",
)
# the points where the thread blocks for good rather than the process die
HANGS = ("stuck_send",)


def parse(text: str) -> list[tuple[str, str, int | None, int]]:
    faults = []
    for entry in filter(None, (e.strip() for e in text.split(","))):
        parts = entry.split(":")
        if len(parts) != 4 or parts[1] not in POINTS:
            raise ValueError(
                f"{ENV} entry {entry!r}: expected <task>:<point>:<checkpoint|*>:<generation> "
                f"with point one of {', '.join(POINTS)}"
            )
        task, where, checkpoint, generation = parts
        faults.append((task, where, None if checkpoint == "*" else int(checkpoint), int(generation)))
    return faults


_generation = 0


def set_generation(generation: int) -> None:
    global _generation
    _generation = generation


_file_cache: tuple[tuple, str] = ((), "")


def _file_entries() -> str:
    """The fault file's text, read again only when it changed (``arm``
    replaces it, so its inode changes with every write)."""
    global _file_cache
    path = os.environ.get(FILE_ENV)
    if not path:
        return ""
    try:
        st = os.stat(path)
    except OSError:
        return ""
    version = (path, st.st_ino, st.st_mtime_ns, st.st_size)
    if version != _file_cache[0]:
        try:
            with open(path) as f:
                _file_cache = (version, f.read())
        except OSError:
            return ""
    return _file_cache[1]


def arm(path: str, entries: list[str]) -> None:
    """Write fault entries to a fault file (atomically: a worker never reads half of it)."""
    write_atomically(path, ",".join(entries))


def _armed(task: str, where: str, checkpoint_id: int) -> bool:
    text = ",".join(filter(None, (os.environ.get(ENV, ""), _file_entries())))
    for f_task, f_where, f_checkpoint, f_generation in parse(text):
        if (f_task, f_where, f_generation) == (task, where, _generation) and f_checkpoint in (None, checkpoint_id):
            return True
    return False


def _die(task: str, where: str, checkpoint_id: int) -> None:
    print(
        f"[fault] {task}: killed at {where} of checkpoint {checkpoint_id} (generation {_generation})",
        file=sys.stderr,
        flush=True,
    )
    os.kill(os.getpid(), signal.SIGKILL)


def _hang(task: str, where: str, checkpoint_id: int) -> None:
    print(
        f"[fault] {task}: stuck for good at {where} of checkpoint {checkpoint_id} (generation {_generation})",
        file=sys.stderr,
        flush=True,
    )
    threading.Event().wait()  # a fault: this thread never goes on


def point(task: str, where: str, checkpoint_id: int) -> None:
    """Die here (or, at a point of ``HANGS``, block for good) if a fault is armed for it."""
    if _armed(task, where, checkpoint_id):
        (_hang if where in HANGS else _die)(task, where, checkpoint_id)


def wrap_batch(name: str, task) -> Callable[[pa.Table, int], None]:
    """``task.process_batch`` with the batch-level faults armed."""
    if not (os.environ.get(ENV) or os.environ.get(FILE_ENV)):
        return task.process_batch

    def on_batch(table: pa.Table, batch_id: int) -> None:
        started = task.handler.newest_started
        if started and _armed(name, "mid_batch", started) and table.num_rows > 1:
            task.process_batch(table.slice(0, table.num_rows // 2), batch_id)
            _die(name, "mid_batch", started)
        task.process_batch(table, batch_id)

    return on_batch
