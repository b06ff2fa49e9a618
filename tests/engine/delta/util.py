"""Helpers for the Delta layer's tests: tables made by deltalake, data files written without Spark."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from engine.delta import AddFile, Snapshot
from engine.delta.paths import encode_log_path, escape_partition_value
from engine.delta.stats import stats_from_footer
from engine.delta.values import serialize_partition_value


def parquet_add(
    snapshot: Snapshot, data: pa.Table, *, write_id: str | None = None, partition: dict[str, Any] | None = None
) -> AddFile:
    """Write ``data`` (data columns only) as one Parquet file with pyarrow, the way our writer lays files out,
    and answer its ``add`` action with statistics from the footer: commits without Spark."""
    write_id = write_id or f"w-{uuid.uuid4().hex[:8]}"
    partition = partition or {}
    part_types = {f.name: f.dataType for f in snapshot.spark_schema.fields if f.name in snapshot.partition_columns}
    values = {c: serialize_partition_value(partition.get(c), part_types[c]) for c in snapshot.partition_columns}
    dirs = [
        f"{c}={escape_partition_value(v) if v is not None else '__HIVE_DEFAULT_PARTITION__'}" for c, v in values.items()
    ]
    relative = "/".join([write_id, *dirs, f"part-{uuid.uuid4().hex}.parquet"])
    absolute = os.path.join(snapshot.root, *relative.split("/"))
    os.makedirs(os.path.dirname(absolute), exist_ok=True)
    pq.write_table(data, absolute)
    stat = os.stat(absolute)
    return AddFile(
        path=encode_log_path(relative),
        size=stat.st_size,
        partition_values=values,
        modification_time=int(stat.st_mtime * 1000),
        data_change=True,
        stats=stats_from_footer(pq.read_metadata(absolute), snapshot.data_schema, snapshot.configuration),
    )


def log_entries(table: Path | str, version: int) -> list[dict[str, Any]]:
    path = Path(table) / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_log_entry(table: Path | str, version: int, actions: list[dict[str, Any]]) -> None:
    """Hand-write a commit (tests of features deltalake cannot produce)."""
    path = Path(table) / "_delta_log" / f"{version:020d}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(json.dumps(a) for a in actions) + "\n")


def hand_made_add(stats: dict[str, Any], **extra: Any) -> dict[str, Any]:
    """An ``add`` action for a file that is never read (``part-0.parquet``, 10 bytes): commits written by hand
    where only the log's view of the file matters."""
    return {
        "add": {
            "path": "part-0.parquet",
            "partitionValues": {},
            "size": 10,
            "modificationTime": 0,
            "dataChange": True,
            "stats": json.dumps(stats),
            **extra,
        }
    }


def sorted_rows(table: pa.Table, key: str = "id") -> list[dict[str, Any]]:
    return sorted(table.to_pylist(), key=lambda r: (r[key] is None, r[key]))
