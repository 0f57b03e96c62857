"""A restore drill on the real runtime: the money pipeline runs from the
command line (`spark-abs run`), `spark-abs checkpoints` lists what it left,
and the job is rolled back to its oldest checkpoint by name.  The output
committed after that checkpoint is taken back, the replay writes it again,
and the committed output equals a run without failures."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pyarrow.fs as pafs
import pytest

from streaming import demo
from streaming.job import JobRunner
from streaming.settings import JobSettings
from streaming.sinks import read_committed_output
from streaming.worker import sink_location

pytestmark = pytest.mark.integration


def _cli(connection, *args: str, timeout: float) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "streaming.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env={**os.environ, **connection.as_env()})


def test_roll_back_to_a_named_checkpoint(connection, tmp_path, unique_name):
    job, store = f"drill-{unique_name[-8:]}", f"file://{tmp_path}/store"
    data = demo.make_transfers(400)
    pipeline = demo.pipeline(job)
    ingress = pipeline.ingress[0]
    setup = JobRunner("streaming.demo:pipeline", JobSettings(store=store), connection, job=job, say=lambda _: None)
    setup.prepare()
    setup.store.close()
    demo.produce_transfers(connection.kafka_bootstrap, ingress.topic, data, ingress.partitions, end=True)

    first = _cli(connection, "run", "streaming.demo:pipeline", "--job", job, "--store", store, "--interval", "1",
                 "--retain", "20", "--checkpoints", "3", "--for", "240", timeout=400)
    assert first.returncode == 0, first.stdout + first.stderr
    assert "all tasks ready after" in first.stdout and "checkpoint(s) completed in this run" in first.stdout

    listing = _cli(connection, "checkpoints", "--store", store, "--job", job, timeout=60)
    assert listing.returncode == 0, listing.stderr
    usable = [int(m.group(1)) for m in re.finditer(r"^\s+(\d+)\s+0 .* yes\b", listing.stdout, re.M)]
    assert len(usable) >= 2, listing.stdout + "\n--- run:\n" + first.stdout[-3000:]
    assert re.search(rf"^\s+{usable[-1]}\s.*<- a restore picks this one", listing.stdout, re.M), listing.stdout
    oldest = usable[0]

    sink = sink_location(JobSettings(store=store), job, connection)
    committed_after = [int(i.base_name.split("-")[1]) for i in sink.filesystem.get_file_info(
        pafs.FileSelector(sink.path("output"), allow_not_found=True)) if int(i.base_name.split("-")[1]) > oldest]

    lines: list[str] = []
    runner = JobRunner("streaming.demo:pipeline", JobSettings(store=store, interval_s=1), connection, job=job,
                       say=lines.append)
    try:
        runner.start(restore=oldest)
        runner.run_until_caught_up(240)
    finally:
        runner.close()
    assert f"restoring generation 1 from checkpoint {oldest} (restore requested from checkpoint {oldest})" in lines
    if committed_after:
        # the first run had committed output after the checkpoint: it was taken back, not left to be duplicated
        log_text = "".join(p.read_text() for p in runner.log_dir.glob("worker-windows-g1.log"))
        assert re.search(r"retracted \[\d", log_text), log_text[-2000:]
    output = demo.normalise(read_committed_output(sink))
    assert output == demo.expected_output(data)
    assert runner.restores[0].checkpoint_id == oldest
