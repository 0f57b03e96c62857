"""Kafka records as Arrow: the columns a stage task receives (from a Spark
micro-batch or read straight from Kafka) and header look-ups done in bulk.

Pure Arrow: the engine uses these without Spark."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

__all__ = ["BATCH_COLUMNS", "RECORD_SCHEMA", "Headers", "header_values"]

# Columns of every batch handed to a task, in this order.
BATCH_COLUMNS = ("topic", "partition", "offset", "key", "value", "headers", "timestamp")

# Records read straight from Kafka, in the shape a stage query hands them over.
RECORD_SCHEMA = pa.schema(
    [
        ("topic", pa.string()),
        ("partition", pa.int32()),
        ("offset", pa.int64()),
        ("key", pa.binary()),
        ("value", pa.binary()),
        ("headers", pa.list_(pa.struct([("key", pa.string()), ("value", pa.binary())]))),
        ("timestamp", pa.timestamp("ms")),
    ]
)

Headers = Sequence[tuple[str, bytes]]


def header_values(table: pa.Table, name: str) -> pa.Array:
    """The value of header ``name`` in each row of a batch (null where absent;
    the first one where repeated), computed without a Python loop over rows."""
    headers = table["headers"].combine_chunks()
    flat = pc.list_flatten(headers)
    hit = pc.equal(flat.field("key"), name)
    rows = pc.filter(pc.list_parent_indices(headers), hit).to_numpy(zero_copy_only=False)
    values = pc.filter(flat.field("value"), hit)
    first = np.ones(len(rows), dtype=bool)
    first[1:] = rows[1:] != rows[:-1]
    index = np.full(table.num_rows, -1, dtype=np.int64)
    index[rows[first]] = np.flatnonzero(first)
    return pc.take(values, pa.array(index, mask=index < 0)).cast(pa.binary())
