"""Arrow IPC streams read within a bound (``streaming.adapters.serde.arrow_ipc``):
what a batch declares counts against the cap before anything is read, its
values as well as its buffers' bytes."""

from __future__ import annotations

import pyarrow as pa
import pytest

from streaming.adapters.serde import arrow_ipc, codec

CAP = 16 << 20


def _stream(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_small_record_declaring_billions_of_null_rows_is_refused_unread():
    bomb = _stream(pa.table({"x": pa.nulls(2**31 - 1)}))
    assert len(bomb) < 1000 and arrow_ipc.decoded_bytes(bomb, 1 << 40) == 0  # null values take no buffer
    with pytest.raises(arrow_ipc.OverCap, match=f"at least {2 * (2**31 - 1)} values declared.*over the cap of {CAP}"):
        arrow_ipc.decoded_bytes(bomb, CAP)
    reason = codec.read_batch(bomb, CAP)
    assert isinstance(reason, str) and "values declared" in reason


def test_a_batch_declaring_no_more_values_than_the_cap_is_read():
    table = pa.table({"x": pa.nulls(1000), "y": pa.nulls(1000)})
    assert arrow_ipc.read(_stream(table), 3000).equals(table)  # 1000 rows + 2 columns of 1000, no buffer
    with pytest.raises(arrow_ipc.OverCap, match="3000 values declared"):
        arrow_ipc.read(_stream(table), 2999)


def test_what_the_stages_write_stays_below_the_cap_in_values_too():
    table = pa.table({"b": [True, False] * 500_000, "k": ["a"] * 1_000_000})
    values = codec.encode_batches(table)
    assert sum(arrow_ipc.read(v, CAP).num_rows for v in values) == table.num_rows
