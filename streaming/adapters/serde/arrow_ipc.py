"""Arrow IPC streams read within a bound: the values of internal topics.

A compressed IPC stream says, before anything is decompressed, how large
its buffers will be: each record batch's metadata (a flatbuffer) lists its
buffers' places in the message body, and a compressed buffer starts with
its decompressed length (a little-endian int64; -1: stored as it is).
``read`` adds those lengths up message by message, stopping as soon as
they pass ``max_bytes`` (``OverCap``), and only then reads the stream, so
a small record that would decompress to gigabytes (a decompression bomb) is
refused without being decompressed.  The values a batch declares (its rows
and its columns' lengths) are counted against the same cap, a byte each: a
batch of null values has no buffers at all, and a 240-byte record could
otherwise declare 2^31 rows that a reader then allocates.  The few flatbuffer fields this needs
are read by hand (``_Table``); Arrow's own reader checks the rest."""

from __future__ import annotations

import struct

import pyarrow as pa

__all__ = ["OverCap", "decoded_bytes", "read"]

# MessageHeader (Arrow's Message.fbs): which kind of message a header is
_DICTIONARY_BATCH, _RECORD_BATCH = 2, 3


class OverCap(ValueError):
    """An IPC stream whose buffers would take more than the cap once
    decompressed, or that declares more values than the cap has bytes."""

    def __init__(self, at_least: int, max_bytes: int, what: str = "bytes decompressed"):
        super().__init__(f"its buffers would take at least {at_least} {what}, over the cap of {max_bytes}")
        self.at_least = at_least
        self.max_bytes = max_bytes


def _declared_values(batch: _Table) -> int:
    """The values a RecordBatch declares: its rows (field 0) and each column's
    (its FieldNodes {length, null_count}, field 1).  Null values take no
    buffer, so a few bytes can declare billions of them; every value read
    costs at least a byte, so they count against the cap as bytes do."""
    rows = batch.scalar(0, "<q")
    lengths = [length for length, _ in batch.structs(1, "<qq")]
    if rows < 0 or any(length < 0 for length in lengths):
        raise ValueError("IPC metadata: a record batch declares a negative length")
    return rows + sum(lengths)


class _Table:
    """A flatbuffer table in ``data`` at ``at``: its fields by index (a
    field not written reads as absent)."""

    def __init__(self, data: memoryview, at: int):
        self.data = data
        self.at = at
        vtable = at - _unpack("<i", data, at)
        size = _unpack("<H", data, vtable)
        self.fields = [_unpack("<H", data, vtable + 4 + 2 * i) for i in range((size - 4) // 2)]

    def _place(self, field: int) -> int | None:
        offset = self.fields[field] if field < len(self.fields) else 0
        return self.at + offset if offset else None

    def scalar(self, field: int, fmt: str, default: int = 0) -> int:
        place = self._place(field)
        return default if place is None else _unpack(fmt, self.data, place)

    def table(self, field: int) -> _Table | None:
        place = self._place(field)
        return None if place is None else _Table(self.data, place + _unpack("<I", self.data, place))

    def structs(self, field: int, fmt: str) -> list[tuple[int, ...]]:
        """A vector of structs of ``fmt`` (e.g. ``<qq``), empty when absent."""
        place = self._place(field)
        if place is None:
            return []
        vector = place + _unpack("<I", self.data, place)
        count, size = _unpack("<I", self.data, vector), struct.calcsize(fmt)
        if vector + 4 + count * size > len(self.data):
            raise ValueError("IPC metadata: a vector runs past its end")
        return [struct.unpack_from(fmt, self.data, vector + 4 + i * size) for i in range(count)]


def _unpack(fmt: str, data: memoryview, at: int) -> int:
    if at < 0 or at + struct.calcsize(fmt) > len(data):
        raise ValueError("IPC metadata: an offset points outside it")
    return int(struct.unpack_from(fmt, data, at)[0])


def _batch_bytes(batch: _Table, body: pa.Buffer) -> int:
    """What a RecordBatch's buffers take once read: their decompressed
    lengths when the batch is compressed (its field 3), else their lengths."""
    buffers = batch.structs(2, "<qq")  # Buffer {offset, length}
    if batch.table(3) is None:
        return sum(length for _, length in buffers)
    view = memoryview(body)
    total = 0
    for offset, length in buffers:
        if length == 0:
            continue
        if length < 8 or offset < 0 or offset + length > body.size:
            raise ValueError(f"IPC body: buffer [{offset}, +{length}) is not a compressed buffer of the body")
        decompressed = int.from_bytes(view[offset : offset + 8], "little", signed=True)
        if decompressed < -1:
            raise ValueError(f"IPC body: a buffer says it decompresses to {decompressed} bytes")
        total += length - 8 if decompressed == -1 else decompressed
    return total


def decoded_bytes(value: bytes | pa.Buffer, max_bytes: int) -> int:
    """What the record batches of the IPC stream ``value`` take once read,
    from their metadata, nothing decompressed; an ``OverCap`` as soon as the
    count passes ``max_bytes``, an Arrow or ValueError for a stream that is
    not one."""
    reader = pa.ipc.MessageReader.open_stream(pa.BufferReader(value))
    total = values = 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return total
        if message.type not in ("record batch", "dictionary batch"):
            continue
        metadata = memoryview(message.metadata)
        root = _Table(metadata, _unpack("<I", metadata, 0))
        header = root.table(2)
        kind = root.scalar(1, "<B")
        if kind == _DICTIONARY_BATCH and header is not None:
            header = header.table(1)  # DictionaryBatch {id, data: RecordBatch, isDelta}
        if header is None or kind not in (_RECORD_BATCH, _DICTIONARY_BATCH):
            raise ValueError(f"IPC message of type {message.type!r} has no record batch in its metadata")
        total += _batch_bytes(header, message.body)
        if total > max_bytes:
            raise OverCap(total, max_bytes)
        values += _declared_values(header)
        if values > max_bytes:
            raise OverCap(values, max_bytes, "values declared (rows and column lengths; a byte each at least)")


def read(value: bytes | None, max_bytes: int) -> pa.Table:
    """The table of the IPC stream ``value``, if its buffers take at most
    ``max_bytes`` once read (``decoded_bytes``: ``OverCap`` otherwise),
    checked in full (every offset, every UTF-8 string)."""
    if not value:
        raise ValueError("record has no value")
    decoded_bytes(value, max_bytes)
    with pa.ipc.open_stream(value) as reader:
        table = reader.read_all()
    table.validate(full=True)
    return table
