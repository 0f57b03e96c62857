"""``spark-abs demo``: the money-in-transit example (the pipeline named
``money``, ``spark_abs_examples.money``) run on real Kafka, Spark and object
storage, with the worker running a stage killed and the job restored.

The pipeline is taken by name, as ``spark-abs run`` takes it, and its module
offers what the demo checks with (``DEMO_FUNCTIONS``): the library does not
import the examples.

The demo checks, for every completed checkpoint, that the balances in the
``accounts`` tasks' states (plus any legs recorded as channel state) add up
to zero, and at the end compares the committed output with what the
transfers give when computed directly (a run without failures)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streaming.api.pipeline import pipeline_module, pipeline_reference
from streaming.api.settings import JobSettings
from streaming.errors import ConfigError
from streaming.tools.demo.report import DemoReport
from streaming.waits import Deadline

__all__ = ["DEMO_FUNCTIONS", "DEMO_PIPELINE", "DemoOptions", "run_demo"]

log = logging.getLogger(__name__)

# the demo's pipeline, by name
DEMO_PIPELINE = "money"
# what the demo's pipeline's module offers the demo: the transfers made and produced, the
# money in a checkpoint (a ``Money`` with ``balances``, ``in_flight``, ``accounts``, ``total``),
# the expected output and how rows are compared
DEMO_FUNCTIONS = (
    "make_transfers",
    "produce_transfers",
    "money_in_checkpoint",
    "expected_output",
    "normalise",
    "row_key",
)


def _demo_module(name: str) -> Any:
    """The module of the pipeline named ``name``, checked to offer ``DEMO_FUNCTIONS``."""
    module = pipeline_module(name)
    missing = [f for f in DEMO_FUNCTIONS if not callable(getattr(module, f, None))]
    if missing:
        raise ConfigError(f"pipeline {name!r} ({module.__name__}) offers no {', '.join(missing)}: the demo needs them")
    return module


@dataclass(frozen=True)
class DemoOptions:
    """What the demo does, besides its job's settings (``spark-abs demo``'s options)."""

    # transfers produced, in ``chunks`` parts, each after a checkpoint completed
    transfers: int = 2000
    chunks: int = 2
    # the stage whose worker is SIGKILLed after the first checkpoint (None: no failure)
    kill: str | None = "accounts"
    # the job's name (None: money-demo-<random>)
    job: str | None = None
    # SPARK_ABS_FAULT entries armed in the workers (streaming.engine.faults)
    faults: str = ""
    # the worker processes (RunOptions.workers)
    workers: Mapping[str, list[str]] | str | None = None
    # the whole run must end within this many seconds
    timeout_s: float = 300.0
    # the pipeline run, by name: its module offers DEMO_FUNCTIONS
    pipeline: str = DEMO_PIPELINE


def run_demo(connection, settings: JobSettings, options: DemoOptions | None = None) -> DemoReport:
    """Run the demo on ``connection`` (see the module docstring), its job's
    checkpoints as ``settings`` say, the rest as ``options`` do.  Its
    progress is logged (INFO)."""
    import uuid

    from streaming.engine.job.operations import run_until_caught_up

    options = options or DemoOptions()
    money = _demo_module(options.pipeline)
    job = options.job or f"money-demo-{uuid.uuid4().hex[:6]}"
    check = _MoneyCheck(connection, settings.store, job, money.money_in_checkpoint)
    runner = _demo_runner(connection, settings, job, options, check)
    data = money.make_transfers(options.transfers)
    deadline = Deadline(options.timeout_s)
    try:
        runner.prepare()
        _feed_in_chunks(
            runner,
            connection,
            money.produce_transfers,
            data,
            options.chunks,
            kill=options.kill,
            money=check.money,
            deadline=deadline,
            checkpoints=f"{settings.mode} checkpoints every {settings.interval_s:g} s",
        )
        run_until_caught_up(runner, max(1.0, deadline.left()))
    finally:
        runner.close()
    return _demo_report(runner, connection, settings, data, check, money)


class _MoneyCheck:
    """``on_complete`` of the demo's job: the money in each checkpoint
    completed (``money``), counted and logged."""

    def __init__(self, connection, store_uri: str, job: str, money_in_checkpoint: Callable[..., Any]):
        from streaming.adapters.objects import open_store
        from streaming.adapters.snapshots import SnapshotStore

        self.connection = connection
        self.reader = SnapshotStore(open_store(store_uri, connection), job, key=connection.store_key(job))
        self.money: list[Any] = []
        self._money_in_checkpoint = money_in_checkpoint

    def __call__(self, checkpoint_id: int) -> None:
        from streaming.adapters.kafka.ranges import read_range

        connection = self.connection
        m = self._money_in_checkpoint(self.reader, checkpoint_id, lambda c, a, b: read_range(connection.kafka, c, a, b))
        self.money.append(m)
        log.info(
            f"checkpoint {checkpoint_id}: balances {m.balances:+d}, in flight {m.in_flight:+d} -> "
            + ("money conserved" if m.total == 0 else f"MONEY NOT CONSERVED ({m.total:+d})")
        )


def _demo_runner(connection, settings: JobSettings, job: str, options: DemoOptions, check: _MoneyCheck):
    from streaming.engine.faults import ENV as FAULT_ENV
    from streaming.engine.job.runner import JobRunner, RunOptions

    return JobRunner(
        pipeline_reference(options.pipeline),
        settings,
        connection,
        job=job,
        options=RunOptions(workers=options.workers, worker_env={FAULT_ENV: options.faults} if options.faults else {}),
        on_complete=check,
    )


def _feed_in_chunks(
    runner,
    connection,
    produce_transfers: Callable[..., None],
    data: list[dict],
    chunks: int,
    *,
    kill: str | None,
    money: list[Any],
    deadline: Deadline,
    checkpoints: str,
) -> None:
    """The transfers in ``chunks`` parts, each after a checkpoint completed
    (the last with the end of input); the job started after the first, and
    worker ``kill`` SIGKILLed after the first checkpoint."""
    from streaming.engine.job.operations import kill_worker

    ingress = runner.pipeline.ingress[0]
    parts = [data[i * len(data) // chunks : (i + 1) * len(data) // chunks] for i in range(chunks)]
    for index, part in enumerate(parts):
        last = index == len(parts) - 1
        log.info(f"producing {len(part)} transfers to {ingress.topic}" + (" and the end of input" if last else ""))
        produce_transfers(connection.kafka, ingress.topic, part, ingress.partitions, end=last)
        if index == 0:
            log.info(f"starting job {runner.job}: {len(runner.layout.groups)} worker processes ({checkpoints})")
            runner.start()
        if last:
            break
        seen = len(money)
        while len(money) == seen and not deadline.passed():
            runner.step()
        if index == 0 and kill:
            worker = runner.supervisor.worker_of(kill)
            log.info(f"killing worker {worker.name!r} (tasks {', '.join(worker.tasks)}) with SIGKILL")
            kill_worker(runner, kill)


def _demo_report(
    runner, connection, job_settings: JobSettings, data: list[dict], check: _MoneyCheck, money: Any
) -> DemoReport:
    """The committed output against the expected, the dead letters and the money of every checkpoint."""
    from streaming.adapters.kafka.admin import end_offsets
    from streaming.adapters.sinks.factory import sink_location
    from streaming.adapters.sinks.object_store import read_committed_output
    from streaming.api.topics import dead_letter_topic

    job = runner.job
    output = money.normalise(read_committed_output(sink_location(job_settings, job, connection)))
    expected = money.expected_output(data)
    dead = sum(end_offsets(connection.kafka, dead_letter_topic(job), 1).values())
    check.reader.close()
    got = {money.row_key(r): r["legs"] for r in output}
    lost = sum(1 for r in expected if got.get(money.row_key(r), 0) < r["legs"])
    return DemoReport(
        job_settings.mode,
        job,
        len(data),
        check.money,
        runner.restores,
        len(output),
        len(expected),
        output == expected,
        dead,
        runner.checkpoints(),
        lost,
    )
