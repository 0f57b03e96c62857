"""Record values on the wire: one JSON object per Kafka record.

``decode`` turns a batch of values into an Arrow table in bulk (pyarrow's JSON
reader) and, only when the bulk read fails, finds the records that cannot be
rows, so each malformed record is reported with its reason and none is
dropped silently.  ``encode`` is the way back."""

from __future__ import annotations

import io
import json
from collections.abc import Sequence
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.json as pajson

__all__ = ["Decoded", "decode", "encode"]


@dataclass(frozen=True, slots=True)
class Decoded:
    """The rows that decoded (``table``, in input order), the input index of
    each (``index``), and ``(input index, reason)`` for every record that did not."""

    table: pa.Table
    index: list[int]
    rejected: list[tuple[int, str]]


def _bulk(values: Sequence[bytes], schema: pa.Schema | None) -> pa.Table:
    options = (
        pajson.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore")
        if schema is not None
        else pajson.ParseOptions()
    )
    return pajson.read_json(
        io.BytesIO(b"\n".join(values)),
        parse_options=options,
        read_options=pajson.ReadOptions(use_threads=False, block_size=1 << 24),
    )


def decode(values: Sequence[bytes | None], schema: pa.Schema | None = None) -> Decoded:
    """Decode JSON object values; with ``schema`` the columns and types are
    fixed (missing fields are null, extra fields are ignored)."""
    if not values:
        return Decoded(pa.table({}) if schema is None else schema.empty_table(), [], [])
    if all(v and b"\n" not in v and v.lstrip()[:1] == b"{" for v in values):
        try:
            table = _bulk(values, schema)  # type: ignore[arg-type]
            if table.num_rows == len(values):
                return Decoded(table, list(range(len(values))), [])
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            pass
    rows: list[dict] = []
    index: list[int] = []
    rejected: list[tuple[int, str]] = []
    for i, value in enumerate(values):
        reason = _check(value, schema, rows)
        if reason is None:
            index.append(i)
        else:
            rejected.append((i, reason))
    if schema is not None:
        table = pa.Table.from_pylist(rows, schema=schema)
    else:
        try:
            table = pa.Table.from_pylist(rows)
        except (pa.ArrowInvalid, pa.ArrowTypeError) as exc:
            # without a schema, types that disagree between records cannot be one table
            return Decoded(
                pa.table({}), [], [(i, f"value types disagree within the batch: {exc}") for i in range(len(values))]
            )
    return Decoded(table, index, rejected)


def _check(value: bytes | None, schema: pa.Schema | None, rows: list[dict]) -> str | None:
    if value is None:
        return "record has no value"
    try:
        row = json.loads(value)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        return f"value is not JSON: {exc}"
    if not isinstance(row, dict):
        return f"value is JSON {type(row).__name__}, not an object"
    if schema is not None:
        row = {name: row.get(name) for name in schema.names}
        try:
            pa.Table.from_pylist([row], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError, TypeError) as exc:
            return f"value does not fit the schema ({schema.to_string(show_schema_metadata=False)!r}): {exc}"
    rows.append(row)
    return None


def encode(table: pa.Table) -> list[bytes]:
    """One compact JSON object per row."""
    return [json.dumps(row, separators=(",", ":"), default=str).encode() for row in table.to_pylist()]
