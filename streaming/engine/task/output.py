"""Where a task's output goes: routed by key to the task's output partitions
(an Arrow record or a few per partition, with the generation and the
watermark in their headers), or, for a sink stage, kept for the sink's
current epoch until the next snapshot takes it."""

from __future__ import annotations

import collections

import numpy as np
import pyarrow as pa

from barriers.headers import GENERATION_HEADER, WATERMARK_HEADER
from operators.dead_letters import without_origin
from streaming.adapters.serde import codec
from streaming.api.pipeline import Pipeline, TaskSpec, route
from streaming.engine.metrics import TaskMetrics
from streaming.engine.task.watermarks import watermark_headers

__all__ = ["TaskOutput"]


class TaskOutput:
    """The output of task ``spec`` of ``pipeline`` in ``generation``, sent
    with ``io.send(channel, key, value, headers)`` (a ``TaskIO``), counted
    per channel in ``metrics``."""

    def __init__(
        self,
        pipeline: Pipeline,
        spec: TaskSpec,
        io,
        generation: int,
        counters: collections.Counter,
        metrics: TaskMetrics,
    ):
        self.spec = spec
        self.stage = pipeline.stage(spec.stage)
        downstream = pipeline.downstream(spec.stage)
        self.to_sink = downstream is None
        # the rows' origins (operators.dead_letters.ORIGIN) go on to the next stage, never to a sink:
        # Python reads them, and so does a stage of Spark code for a row its code raises on (its code
        # never sees the column: Spark reads the columns the stage declares)
        self._origins = downstream is not None
        self._io = io
        self.generation = generation
        self.counters = counters
        self.metrics = metrics
        # output of the sink epoch in progress
        self.epoch_rows: list[pa.Table] = []

    def emit(self, output: pa.Table | None, watermark: int | None) -> None:
        """``output`` (rows no older than ``watermark``) downstream, or into the epoch."""
        if output is None or output.num_rows == 0:
            return
        self.counters["output_rows"] += output.num_rows
        if not self._origins:
            output = without_origin(output)
        if self.to_sink:
            self.epoch_rows.append(output)
            if self.metrics.records_to_sink is not None:
                self.metrics.records_to_sink.inc(output.num_rows)
            return
        targets = route(output, self.stage.key, len(self.spec.outputs)).to_numpy()
        headers = [(GENERATION_HEADER, str(self.generation).encode()), (codec.FORMAT_HEADER, codec.ARROW_FORMAT)]
        if watermark is not None:
            headers.append((WATERMARK_HEADER, str(watermark).encode()))
        # one Arrow record (or a few, below the message size) per output partition
        for target in np.unique(targets):
            part = output.take(pa.array(np.flatnonzero(targets == target)))
            self.metrics.records_out[int(target)].inc(part.num_rows)
            for value in codec.encode_batches(part):
                self._io.send(self.spec.outputs[int(target)], None, value, headers)

    def watermark(self, watermark: int | None, idle: bool = False) -> None:
        """Tell every output channel that event time got to ``watermark``, and
        whether this task is idle (no active event-time input)."""
        headers = watermark_headers(watermark, self.generation, idle=idle)
        for channel in self.spec.outputs:
            self._io.send(channel, None, b"", headers)

    def take_epoch(self) -> list[pa.Table]:
        """The epoch's rows, for a snapshot; the next epoch starts empty."""
        rows, self.epoch_rows = self.epoch_rows, []
        return rows

    def give_back(self, rows: list[pa.Table]) -> None:
        """The rows of an aborted epoch belong to the next one."""
        self.epoch_rows = rows + self.epoch_rows
