"""The keyed count in Quix Streams, exactly once, committing every second:
``{"k", "n", "sum"}`` per record to ``--out`` (keyed by k), stopping after
``--records`` outputs (records with an empty value, barriers spark-abs
appended, are skipped).  Runs in the Quix environment (``benchmarks.peers``)."""

from __future__ import annotations

import argparse
import json
import tempfile
import uuid

from quixstreams import Application


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--bootstrap", required=True)
    parser.add_argument("--topic", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--records", type=int, required=True)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-quix-") as state:
        app = Application(
            broker_address=args.bootstrap,
            consumer_group=f"bench-quix-{uuid.uuid4().hex[:8]}",
            auto_offset_reset="earliest",
            processing_guarantee="exactly-once",
            commit_interval=1.0,
            state_dir=state,
        )
        # spark-abs runs on the same topic append barriers to it: header-only records, skipped
        source = app.topic(args.topic, value_deserializer="bytes", key_deserializer="string")
        out = app.topic(args.out, value_serializer="json", key_serializer="string")

        def count(value: dict, state) -> dict:
            n, total = state.get("n", 0) + 1, state.get("sum", 0) + value["v"]
            state.set("n", n)
            state.set("sum", total)
            return {"k": value["k"], "n": n, "sum": total}

        events = app.dataframe(source).filter(bool).apply(json.loads)
        events.apply(count, stateful=True).to_topic(out)
        app.run(count=args.records, timeout=60.0, collect=False)


if __name__ == "__main__":
    main()
