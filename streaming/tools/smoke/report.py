"""What ``spark-abs smoke`` reports: the records produced, the micro-batches,
the Parquet written and read back, the time it took."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["SmokeReport"]


@dataclass(frozen=True, slots=True)
class SmokeReport:
    topic: str
    partitions: int
    produced: int
    batches: int
    rows_in_batches: int
    parquet_uri: str
    parquet_files: int
    rows_read_back: int
    seconds: float

    def render(self) -> str:
        return "\n".join(
            [
                f"topic            {self.topic} ({self.partitions} partitions)",
                f"produced         {self.produced} records with headers (kafka-python)",
                f"micro-batches    {self.batches} foreachBatch calls, {self.rows_in_batches} rows as Arrow",
                f"parquet          {self.parquet_files} files under {self.parquet_uri}",
                f"read back        {self.rows_read_back} rows; keys, values, offsets and headers match",
                f"took             {self.seconds:.1f} s",
            ]
        )
