"""A warm start: a throwaway merge that warms a Spark Connect session before a worker takes its first job.

The first merge of a process pays for everything that is loaded once: the engine's and Spark Connect's Python
modules, the server's classes for each plan shape, and the JIT that has not yet compiled them. A merge on a table
of a few rows of its own, with the shapes a real upsert takes (a matched update, an insert, a deletion-vector
write and a copy-on-write one), moves that cost to start-up, where no caller waits for it.
"""

from __future__ import annotations

import contextlib
import shutil
import time
import uuid
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, TableFeatures, write_deltalake
from pyspark.sql import SparkSession

from engine.command import run_merge
from engine.errors import MergeExecutionError
from engine.spec import InsertAction, MergeClause, MergeSpec, RowsSource, UpdateAction

_SCHEMA = pa.schema([("id", pa.int64()), ("v", pa.string())])
_ROWS = [{"id": 1, "v": "warm"}, {"id": 4, "v": "warm"}]


def _upsert(target: Path, deletion_vectors: bool) -> MergeSpec:
    return MergeSpec(
        target=str(target),
        source=RowsSource(rows=_ROWS, schema="id BIGINT, v STRING"),
        on="t.id = s.id",
        matched=(MergeClause("matched", UpdateAction(star=True)),),
        not_matched=(MergeClause("notMatched", InsertAction(star=True)),),
        target_alias="t",
        source_alias="s",
        deletion_vectors="auto" if deletion_vectors else "off",
    )


def warm_up(spark: SparkSession, scratch: Path) -> float:
    """Upserts into two tables of three rows made under ``scratch`` (one with deletion vectors enabled), checks
    that each updated one row and inserted one, then removes them; answers the seconds it took. ``scratch`` must
    be a directory Spark can write to."""
    start = time.monotonic()
    base = scratch / f"warm-up-{uuid.uuid4().hex}"
    try:
        for deletion_vectors in (False, True):
            target = base / ("dv" if deletion_vectors else "cow")
            write_deltalake(str(target), pa.table({"id": [1, 2, 3], "v": ["a", "b", "c"]}, schema=_SCHEMA))
            if deletion_vectors:
                table = DeltaTable(str(target))
                table.alter.add_feature([TableFeatures.DeletionVectors], allow_protocol_versions_increase=True)
                table.alter.set_table_properties({"delta.enableDeletionVectors": "true"})
            result = run_merge(spark, _upsert(target, deletion_vectors)).result
            if (result["num_updated_rows"], result["num_inserted_rows"]) != (1, 1):
                raise MergeExecutionError(f"The warm-up merge answered {result}, not one update and one insert.")
    finally:
        shutil.rmtree(base, ignore_errors=True)
        with contextlib.suppress(OSError):
            scratch.rmdir()  # only when no other worker's warm-up is using it
    return time.monotonic() - start
