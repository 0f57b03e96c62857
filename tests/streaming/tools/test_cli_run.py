"""`spark-abs checkpoints` on a local store: each checkpoint verified, the one
a restore would pick marked; and `spark-abs run`'s help."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pyarrow as pa

from streaming.adapters.objects import open_store
from streaming.adapters.snapshots import UNSIGNED, SnapshotStore, TaskParts
from streaming.api.pipeline import Sink
from streaming.engine.job import operations
from streaming.tools.checkpoints.inspection import Checkpoints
from streaming.tools.cli.run import run_job
from streaming.tools.views import render_checkpoints

JOB = "orders"


def _write(store: SnapshotStore, cid: int, *, complete: bool = True) -> None:
    snap = store.write_task(
        cid,
        0,
        "valid-0",
        TaskParts(
            state={"counts": pa.table({"n": [cid, 2, 3]})},
            positions={"orders:0": 10 * cid},
            in_flight={"orders:0": (10 * cid - 4, 10 * cid)},
        ),
    )
    if complete:
        store.write_manifest(cid, 0, {"valid-0": snap}, metrics={"kinds": ["unaligned"], "trigger_to_complete_s": 0.5})


def _store(tmp_path: Path) -> tuple[SnapshotStore, str]:
    uri = f"file://{tmp_path}/store"
    store = SnapshotStore(open_store(uri), JOB, key=UNSIGNED)
    for cid in (1, 2):
        _write(store, cid)
    _write(store, 3, complete=False)
    # damage checkpoint 2's state part: it no longer verifies
    part = next((tmp_path / "store" / JOB / "checkpoints" / "chk-00000002").rglob("*.parquet"))
    part.write_bytes(part.read_bytes()[:-9] + b"corrupted")
    return store, uri


def test_every_checkpoint_is_verified_and_the_restore_pick_is_marked(tmp_path):
    store, _ = _store(tmp_path)
    rows = Checkpoints(store).rows()
    store.close()
    assert [(r.checkpoint_id, r.complete, r.usable) for r in rows] == [
        (1, True, True),
        (2, True, False),
        (3, False, False),
    ]
    assert rows[0].in_flight_offsets == 4 and rows[0].kinds == ("unaligned",) and rows[0].state_bytes > 0
    assert any("checksum" in p for p in rows[1].problems), rows[1].problems
    text = render_checkpoints(JOB, rows, 0).splitlines()
    line = {int(t.split()[0]): t for t in text if t.strip()[:1].isdigit()}
    assert line[1].endswith("yes   <- a restore picks this one")
    assert line[2].endswith("NO: 1 problem(s), below")
    assert any(t.startswith("checkpoint 2: ") and "checksum mismatch" in t for t in text), text
    assert line[3].endswith("NO: no manifest: in progress, or never completed")


def test_nothing_usable_says_a_restore_starts_from_the_beginning(tmp_path):
    store = SnapshotStore(open_store(f"file://{tmp_path}/s"), JOB, key=UNSIGNED)
    _write(store, 1, complete=False)
    text = render_checkpoints(JOB, Checkpoints(store).rows(), 0)
    store.close()
    assert "a restore would start from the beginning" in text
    assert render_checkpoints(JOB, [], None) == "job orders: no checkpoints in the store"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "streaming.tools.cli", *args], capture_output=True, text=True, timeout=60
    )


def test_the_checkpoints_command(tmp_path):
    _, uri = _store(tmp_path)
    done = _cli("checkpoints", "--store", uri, "--job", JOB)
    assert done.returncode == 0, done.stderr
    assert "<- a restore picks this one" in done.stdout and "never completed" in done.stdout


def test_run_explains_itself_and_names_a_bad_option(tmp_path):
    helped = _cli("run", "--help")
    assert helped.returncode == 0 and "--restore N" in helped.stdout and "module:attribute" in helped.stdout
    bad = _cli(
        "--home", str(tmp_path), "run", "orders:orders", "--store", f"file://{tmp_path}/s", "--mode", "aligned-timeout"
    )
    assert bad.returncode == 2 and "aligned-timeout needs alignment_timeout_ms" in bad.stderr
    assert "Traceback" not in bad.stderr
    for flag in ("--for", "--checkpoints"):
        zero = _cli("--home", str(tmp_path), "run", "orders:orders", "--store", f"file://{tmp_path}/s", flag, "0")
        assert zero.returncode == 2 and f"{flag} must be positive, got 0" in zero.stderr, zero.stderr


class _Runner:
    """The loop's view of a ``JobRunner``: tasks ready after ``ready_after``
    steps, one checkpoint completed every ``every`` steps after that."""

    def __init__(self, ready_after: int, every: int, interrupt_at: int | None = None):
        self.job, self.generation = "orders", 0
        # its worker groups (JobGroups): one local group, no remote one
        self.layout = SimpleNamespace(groups={"w": ["t"]}, local={"w": ["t"]}, remote_names=set())
        self.settings = SimpleNamespace(interval_s=1.0)
        self.connection = None
        self.pipeline = SimpleNamespace(
            stages=[SimpleNamespace(name="country-totals", sink=Sink("kafka", "orders.country-totals"))]
        )
        self.coordinator = SimpleNamespace(all_ready=False)
        self.ready_after, self.every, self.interrupt_at = ready_after, every, interrupt_at
        self.steps, self.done, self.started_from, self.closed = 0, [], "not started", False

    def start(self, restore=None):
        self.started_from = restore

    def step(self):
        self.steps += 1
        if not self.coordinator.all_ready:
            time.sleep(0.02)  # workers starting
        if self.steps == self.interrupt_at:
            raise KeyboardInterrupt
        self.coordinator.all_ready = self.steps >= self.ready_after
        if self.coordinator.all_ready and (self.steps - self.ready_after) % self.every == self.every - 1:
            self.done.append(SimpleNamespace(checkpoint_id=len(self.done) + 1, status="completed"))

    def checkpoints(self):
        return list(self.done)

    def close(self):
        self.closed = True


def test_run_stops_after_the_checkpoints_asked_for_and_closes_the_job(lines):
    runner = _Runner(ready_after=5, every=3)
    run_job(runner, restore=4, checkpoints=2)
    assert runner.started_from == 4 and runner.closed
    assert len(runner.done) == 2 and runner.steps == 5 + 2 * 3 - 1
    assert any(s.startswith("all tasks ready after") for s in lines)
    # where the output goes, said once the job starts
    assert (
        "job orders: stage country-totals commits its output to Kafka topic orders.country-totals (read it with"
        in "\n".join(lines)
    )
    assert lines[-1] == "stopped; 2 checkpoint(s) completed in this run, the last 2"


def test_run_time_counts_from_when_the_tasks_are_up_and_ctrl_c_still_closes(lines):
    runner = _Runner(ready_after=10, every=10**9)
    began = time.monotonic()
    run_job(runner, seconds=0.1)
    # ten starting steps of 0.02 s each, then the 0.1 s asked for
    assert time.monotonic() - began >= 0.28 and runner.steps > 10 and runner.closed
    assert lines[-1] == "stopped; 0 checkpoint(s) completed in this run"
    interrupted = _Runner(ready_after=1, every=1000, interrupt_at=4)
    lines.clear()
    run_job(interrupted)
    assert interrupted.closed and "stopping (Ctrl-C or SIGTERM)" in lines


def test_sigterm_stops_a_run_as_ctrl_c_does_and_the_handler_before_comes_back(lines):
    class Terminated(_Runner):
        def step(self):
            super().step()
            if self.steps == 3:
                os.kill(os.getpid(), signal.SIGTERM)

        def close(self):  # a process manager sends SIGTERM again while the job closes: the close goes on
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.05)
            super().close()

    before = signal.getsignal(signal.SIGTERM)
    runner = Terminated(ready_after=1, every=1000)
    run_job(runner)
    assert runner.closed and runner.steps == 3 and "stopping (Ctrl-C or SIGTERM)" in lines
    assert lines[-1] == "stopped; 0 checkpoint(s) completed in this run"
    assert signal.getsignal(signal.SIGTERM) is before


def test_run_with_drain_stops_once_the_input_is_committed_and_closes_the_job(lines, monkeypatch):
    runner = _Runner(ready_after=5, every=3)
    drained = SimpleNamespace(checkpoint_id=9, status="completed")

    def run_until_caught_up(drained_runner, timeout_s):
        assert drained_runner is runner and timeout_s == 42
        runner.done.append(drained)
        return drained

    monkeypatch.setattr(operations, "run_until_caught_up", run_until_caught_up)
    run_job(runner, drain=True, drain_timeout_s=42)
    assert runner.closed and runner.steps == 0  # the drain drives the runner itself
    assert "drained: checkpoint 9 covers every input record and is committed" in lines
    assert lines[-1] == "stopped; 1 checkpoint(s) completed in this run, the last 9"


def test_sigusr1_drains_a_running_job(lines, monkeypatch):
    import os
    import signal

    runner = _Runner(ready_after=2, every=10**9)
    monkeypatch.setattr(
        operations, "run_until_caught_up", lambda _, timeout_s: SimpleNamespace(checkpoint_id=3, status="completed")
    )
    steps = runner.step

    def step():
        steps()
        if runner.steps == 5:
            os.kill(os.getpid(), signal.SIGUSR1)

    runner.step = step
    before = signal.getsignal(signal.SIGUSR1)
    run_job(runner)
    assert runner.steps == 5 and runner.closed
    assert "drained: checkpoint 3 covers every input record and is committed" in lines
    assert signal.getsignal(signal.SIGUSR1) is before  # the handler is the caller's again
