"""Run inside a merge-service container by the compose check: writes the check's Delta tables and sources into the
lake volume as uid 1000 (the lake must be writable by the processes that use it)."""

from __future__ import annotations

import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import write_deltalake

root = Path(sys.argv[1])
big = int(sys.argv[2])

write_deltalake(
    str(root / "customers"),
    pa.table({"id": pa.array([1, 2, 3], pa.int64()), "name": ["Ada", "Grace", "Edsger"], "visits": [1, 1, 1]}),
    configuration={"delta.enableChangeDataFeed": "true"},
)
(root / "incoming").mkdir(parents=True, exist_ok=True)
pq.write_table(
    pa.table({"id": pa.array([3, 4], pa.int64()), "name": ["Edsger", "Barbara"], "visits": [5, 1]}),
    root / "incoming" / "customers.parquet",
)
ids = pa.array(range(big), pa.int64())
chunk = max(1, big // 16)
for start in range(0, big, chunk):  # several files, so the merge runs as several tasks
    part = ids[start : start + chunk]
    write_deltalake(
        str(root / "counters"),
        pa.table({"id": part, "n": pa.array([0] * len(part), pa.int64()), "pad": pa.array(["x" * 40] * len(part))}),
        mode="append",
    )
pq.write_table(pa.table({"id": ids, "bump": pa.array([1] * big, pa.int64())}), root / "incoming" / "bumps.parquet")
print("seeded", root)
