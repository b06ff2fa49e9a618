"""The bench's tables: the target (sorted ids in equal files), its copy with deletion vectors enabled, and each
workload's source, written with deltalake so that every peer starts from the same files."""

from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from bench.merge.workloads import Expected, Workload, source_keys

US_PER_DAY = 86_400_000_000
TARGET_EPOCH_US = 1_577_836_800_000_000  # 2020-01-01T00:00:00Z
SOURCE_EPOCH_US = 1_704_067_200_000_000  # 2024-01-01T00:00:00Z


def make_rows(ids: np.ndarray, rng: np.random.Generator, *, prefix: str, epoch_us: int) -> pa.Table:
    """id BIGINT, name STRING, value DOUBLE, ts TIMESTAMP, day DATE; vectorised."""
    ids = np.ascontiguousarray(ids, dtype=np.int64)
    id_arr = pa.array(ids)
    ts_us = epoch_us + ids * 1_000_000
    return pa.table(
        {
            "id": id_arr,
            "name": pc.binary_join_element_wise(prefix, pc.cast(id_arr, pa.string()), ""),
            "value": pa.array(rng.random(len(ids)) * 1000.0),
            "ts": pa.array(ts_us, type=pa.timestamp("us", tz="UTC")),
            "day": pa.array((ts_us // US_PER_DAY).astype(np.int32), type=pa.date32()),
        }
    )


def build_target(path: Path, rows: int, files: int, rng: np.random.Generator, *, cdf: bool = False) -> int:
    """``files`` appends of consecutive, sorted id ranges: one Parquet file each. Answers the file count."""
    from deltalake import DeltaTable, write_deltalake

    configuration = {"delta.enableChangeDataFeed": "true"} if cdf else None
    bounds = np.linspace(0, rows, files + 1, dtype=np.int64)
    for i, (lo, hi) in enumerate(itertools.pairwise(bounds)):
        chunk = make_rows(2 * np.arange(lo, hi, dtype=np.int64), rng, prefix="name-", epoch_us=TARGET_EPOCH_US)
        write_deltalake(
            str(path), chunk, mode="error" if i == 0 else "append", configuration=configuration if i == 0 else None
        )
    return len(DeltaTable(str(path)).file_uris())


def enable_deletion_vectors(base: Path, dest: Path) -> None:
    """A copy of ``base`` with the deletionVectors feature (reader 3 / writer 7) and
    ``delta.enableDeletionVectors = true``, as Databricks creates tables: the same files, no vector yet; a
    merge-on-read writer gives the files it touches vectors."""
    from deltalake import DeltaTable

    from engine.delta.feature_upgrade import add_features

    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest)
    add_features(dest, ["deletionVectors"])
    DeltaTable(str(dest)).alter.set_table_properties({"delta.enableDeletionVectors": "true"})


def build_source(path: Path, workload: Workload, rows: int, rng: np.random.Generator) -> Expected:
    from deltalake import write_deltalake

    ids, expected = source_keys(workload, rows, rng)
    if workload.kind == "delete":
        table = pa.table({"id": pa.array(ids)})
    else:
        table = make_rows(ids, rng, prefix="upd-", epoch_us=SOURCE_EPOCH_US)
    write_deltalake(str(path), table)
    return expected


def build_delete_source(path: Path, rows: int, fraction: float, rng: np.random.Generator) -> int:
    """A source of existing ids, ``fraction`` of the target's rows at random: a delete by key of these leaves the
    read-overhead tables. Answers the number of ids."""
    from deltalake import write_deltalake

    ids = 2 * rng.choice(rows, size=max(int(rows * fraction), 1), replace=False).astype(np.int64)
    write_deltalake(str(path), pa.table({"id": pa.array(ids)}))
    return len(ids)


def fresh_copy(base: Path, dest: Path) -> None:
    shutil.rmtree(dest, ignore_errors=True)
    shutil.copytree(base, dest)
