"""Hand-made micro-batches in the shape ``ChannelQuery`` hands over, and a
stage task whose I/O is recorded, for the task's unit tests."""

from __future__ import annotations

import json

import pyarrow as pa

from barriers.messages import UNSIGNED, Barrier, CancelBarrier, encode
from streaming.adapters.snapshots import TaskSnapshot
from streaming.engine.task.stage_task import StageTask, TaskIO, TaskOptions

__all__ = ["HEADER_TYPE", "batch", "RecordedIO", "make_task"]

HEADER_TYPE = pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))


def batch(*records) -> pa.Table:
    """records: (topic, partition, offset, value-dict | bytes | Barrier | CancelBarrier[, generation[, headers]])."""
    rows = []
    for topic, partition, offset, value, *rest in records:
        headers = []
        if isinstance(value, (Barrier, CancelBarrier)):
            headers, value = encode(value, key=UNSIGNED), b""
        elif isinstance(value, dict):
            value = json.dumps(value).encode()
        if rest:
            headers.append(("abs.gen", str(rest[0]).encode()))
        if len(rest) > 1:
            headers += [(k, v) for k, v in rest[1].items() if k != "abs.gen"]
        rows.append(
            {
                "topic": topic,
                "partition": partition,
                "offset": offset,
                "key": None,
                "value": value,
                "headers": [{"key": k, "value": v} for k, v in headers],
                "timestamp": None,
            }
        )
    schema = pa.schema(
        [
            ("topic", pa.string()),
            ("partition", pa.int32()),
            ("offset", pa.int64()),
            ("key", pa.binary()),
            ("value", pa.binary()),
            ("headers", HEADER_TYPE),
            ("timestamp", pa.timestamp("ms")),
        ]
    )
    return pa.Table.from_pylist(rows, schema=schema)


class RecordedIO:
    def __init__(self):
        self.log = []
        self.sent = []  # one entry per output row
        self.records = []  # one entry per Kafka record (an Arrow batch)
        self.dead = []
        self.letters = []  # every dead letter whole: channel, offset, key, value, headers, reason
        self.events = []
        self.snapshots = {}
        self.staged = {}
        self.watermarks = []
        self.idle = []  # watermark records that said their writer went idle
        self.stream = []  # every record sent, watermark records too, in order

    def io(self, sink=False) -> TaskIO:
        return TaskIO(
            send=self._send,
            append_barrier=self._barrier,
            publish=self._publish,
            dead_letter=self._dead,
            write_snapshot=self._write,
            stage_epoch=self._stage if sink else None,
        )

    def _send(self, channel, key, value, headers):
        self.stream.append((channel, value, list(headers)))
        if dict(headers).get("abs.kind") == b"watermark":
            if "abs.idle" in dict(headers):
                self.idle.append((channel, dict(headers).get("abs.wm")))
            else:
                self.watermarks.append((channel, int(dict(headers)["abs.wm"])))
            return
        assert dict(headers)["abs.fmt"] == b"arrow"
        with pa.ipc.open_stream(value) as reader:
            rows = reader.read_all().to_pylist()
        self.sent += [(channel, row, dict(headers)) for row in rows]
        self.records.append((channel, value, dict(headers)))
        self.log.append(("send", str(channel)))

    def _barrier(self, markers):
        self.log.append(("barrier", tuple(map(str, markers))))
        return {c: 100 + i for i, c in enumerate(markers)}

    def _publish(self, event):
        self.events.append(event)

    def _dead(self, channel, offset, key, value, headers, reason, notes):
        self.dead.append((str(channel), offset, reason))
        self.letters.append(
            {
                "channel": str(channel),
                "offset": offset,
                "key": key,
                "value": value,
                "headers": dict(headers),
                "reason": reason,
                "notes": dict(notes),
            }
        )

    def _write(self, checkpoint_id, generation, task, parts):
        self.snapshots[checkpoint_id] = (parts.state, parts.positions, parts.in_flight, parts.metadata)
        self.copied = parts.channel_records
        self.log.append(("snapshot", checkpoint_id))
        return TaskSnapshot(task, checkpoint_id, generation)

    def _stage(self, epoch, table):
        self.staged[epoch] = table


def make_task(pipeline, name="count-0", sink=False, **kwargs):
    """Task ``name`` of ``pipeline`` on recorded I/O, recovered; ``kwargs``
    are ``StageTask``'s and ``TaskOptions``' (``copy_in_flight=True``, ...)."""
    recorded = RecordedIO()
    options = {k: kwargs.pop(k) for k in list(kwargs) if k in TaskOptions.__dataclass_fields__}
    options.setdefault("job_key", UNSIGNED)  # a test that signs says so
    task = StageTask(pipeline, pipeline.task(name), recorded.io(sink), options=TaskOptions(**options), **kwargs)
    task.recover()
    return task, recorded
